"""Which backend answers `google_search` and how to reach it: the search settings, read from the
environment in one place (`config_from_env`), and what stops search from working (`SearchUnavailable`;
`search_setup_problem` as one line naming the fix, which setup and `nanbeige doctor` ask before any search).

Backends, chosen by `NANBEIGE_SEARCH_BACKEND` or, when unset, by what is configured (first match):
- `serper`: Google results from serper.dev (`SERPER_API_KEY`, optional `SERPER_BASE_URL`);
- `searxng`: a SearXNG instance with the JSON format enabled (`SEARXNG_URL`);
- `local`: a full-text index of your own documents (`NANBEIGE_INDEX`, built by `nanbeige index build`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nanbeige.tools.errors import ServiceUnavailable
from nanbeige.tools.index import default_index_dir, index_exists

BACKENDS = ("serper", "searxng", "local")


class SearchUnavailable(ServiceUnavailable):
    """Search cannot work until the user fixes something: a key, a URL, an index, credits."""


@dataclass
class SearchConfig:
    """Which search backend answers `google_search`, and how to reach it."""

    backend: str | None = None
    """`serper`, `searxng` or `local`; None picks the first configured one, in that order."""
    serper_api_key: str | None = None
    """Key for serper.dev. Never logged."""
    serper_base_url: str = "https://google.serper.dev"
    """Serper's address (a proxy or a test server may stand in)."""
    searxng_url: str | None = None
    """Address of a SearXNG instance whose settings enable the `json` format."""
    index_dir: Path = field(default_factory=default_index_dir)
    """Folder of the local index (see `nanbeige index build`)."""
    timeout_s: float = 30.0
    """Most seconds one HTTP request may take in all, from sending it to the answer's last byte."""
    max_attempts: int = 4
    """Attempts per search on connection errors, timeouts, 429 and 5xx answers."""
    max_retry_s: float = 60.0
    """Stop retrying one search after this many seconds."""
    retry_wait_s: float = 1.0
    """First wait between attempts; it doubles each time (up to 10 s), plus jitter, or follows Retry-After."""


def config_from_env(env: Mapping[str, str] | None = None) -> SearchConfig:
    """The search settings from environment variables (the only place they are read)."""
    env = os.environ if env is None else env
    return SearchConfig(
        backend=env.get("NANBEIGE_SEARCH_BACKEND") or None,
        serper_api_key=env.get("SERPER_API_KEY") or None,
        serper_base_url=env.get("SERPER_BASE_URL") or SearchConfig.serper_base_url,
        searxng_url=env.get("SEARXNG_URL") or None,
        index_dir=default_index_dir(env),
    )


def search_setup_problem(config: SearchConfig | None = None) -> str | None:
    """What stops search from working, as one line naming the fix; None when it is configured."""
    c = config or config_from_env()
    build = f"`nanbeige index build SOURCES... --out {c.index_dir}`"
    if c.backend is None:
        if c.serper_api_key or c.searxng_url or index_exists(c.index_dir):
            return None
        return (
            "no search backend is configured: set SERPER_API_KEY (Google results from serper.dev), or "
            "SEARXNG_URL (a SearXNG instance with the json format enabled), or build a local index of your "
            f"documents with {build} (NANBEIGE_INDEX picks another folder); NANBEIGE_SEARCH_BACKEND="
            "serper|searxng|local chooses one explicitly"
        )
    if c.backend not in BACKENDS:
        return f"NANBEIGE_SEARCH_BACKEND={c.backend!r} is not one of {', '.join(BACKENDS)}"
    if c.backend == "serper" and not c.serper_api_key:
        return "the serper search backend needs SERPER_API_KEY (get a key at https://serper.dev)"
    if c.backend == "searxng" and not c.searxng_url:
        return "the searxng search backend needs SEARXNG_URL (a SearXNG instance with the json format enabled)"
    if c.backend == "local" and not index_exists(c.index_dir):
        return f"there is no local search index in {c.index_dir}: build one with {build} or set NANBEIGE_INDEX"
    return None


def choose_backend(config: SearchConfig) -> str:
    problem = search_setup_problem(config)
    if problem:
        raise SearchUnavailable(problem)
    if config.backend:
        return config.backend
    return "serper" if config.serper_api_key else "searxng" if config.searxng_url else "local"
