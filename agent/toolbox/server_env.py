"""The environment passed on to stdio tool servers: the backend's settings for any server, API keys and the
credentials in URLs only to our own servers, never to one the user plugged in."""

from __future__ import annotations

import os

from nanbeige.tools.endpoint import url_credentials, without_credentials

# Environment passed on to stdio servers: backend settings, and API keys only to our own servers.
ENV_PREFIXES = ("NANBEIGE_", "SERPER_", "JINA_", "E2B_", "SEARXNG_")
ENV_NAMES = ("PYTHONPATH", "VIRTUAL_ENV", "HF_HOME", "HF_HUB_OFFLINE", "LANG", "TMPDIR")
SECRET_NAMES = ("NANBEIGE_API_KEY", "NANBEIGE_SUMMARY_API_KEY", "SERPER_API_KEY", "JINA_API_KEY", "E2B_API_KEY")


def passed_env(with_secrets: bool = False) -> dict[str, str]:
    """The part of this process's environment that tool servers may need. API keys, and the user
    name and password in a URL (`http://user:pass@host`), go only to the built-in servers
    (`with_secrets`), never to a server the user plugged in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES) and (with_secrets or k not in SECRET_NAMES)
    }
    return env if with_secrets else {k: without_credentials(v) for k, v in env.items()}


def secrets_in_env() -> list[str]:
    """The API keys set in this process's environment, and the credentials in the URLs passed on."""
    keys = [os.environ[name] for name in SECRET_NAMES if os.environ.get(name)]
    return keys + [s for value in passed_env(with_secrets=True).values() for s in url_credentials(value) if s]
