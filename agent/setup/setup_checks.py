"""The checks before a run starts: `SetupError`, and all that costs nothing to check or read.

What the user must fix raises `SetupError`: one line that names the fix. These checks come first in
`setup.ready`, before any request to a server and before anything is written: the settings, the
files they name (the reference checkout, the system prompt file) and the paths the runs write to.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from nanbeige.agent.backends.llm import DIALECT_SAMPLING
from nanbeige.agent.run import dialects
from nanbeige.agent.run.run_config import BACKENDS, RunSettings, ToolsConfig
from nanbeige.agent.toolbox.toolbox import ServerSpec, parse_server_spec
from nanbeige.agent.trajectory.records import NotATrajectoryFile, check_trajectory_file
from nanbeige.agent.trajectory.writable import unwritable
from nanbeige.tools.errors import NanbeigeError

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference


class SetupError(NanbeigeError):
    """Something the user must fix before a run can start; the message names the fix."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage
        self.exit_code = 2 if usage else 1  # a bad flag or value (`usage`) is a usage error


def check_settings(settings: RunSettings) -> list[ServerSpec]:
    """Everything that costs nothing to check, before anything is started; returns the user's servers."""
    b, c = settings.backend, settings.llm
    if settings.agent.dialect not in dialects.DIALECTS:
        raise SetupError(
            f"--dialect must be one of {', '.join(dialects.DIALECTS)}, not {settings.agent.dialect!r}", usage=True
        )
    if b.backend not in BACKENDS:
        raise SetupError(f"--backend must be one of {', '.join(BACKENDS)}, not {b.backend!r}", usage=True)
    for url in c.urls():
        check_url("--base-url", url)
    check_pool(settings)
    if c.api_key and not c.api_key.isascii():
        raise SetupError(
            "--api-key / NANBEIGE_API_KEY has characters that are not ASCII: an HTTP header cannot carry "
            "them; check the key",
            usage=True,
        )
    if b.token_mode and b.backend == "transformers":
        raise SetupError(
            "--token-mode talks to a vLLM server; the in-process backend records exact tokens by itself", usage=True
        )
    if b.gguf_file and b.backend == "openai":
        raise SetupError("--gguf-file is for the in-process backend (--backend transformers)", usage=True)
    if b.chat_template is not None and not b.chat_template.is_file():
        raise SetupError(f"--chat-template {b.chat_template}: no such file", usage=True)
    max_context = settings.agent.max_context
    if max_context is not None and c.max_tokens + settings.agent.context_reserve >= max_context:
        raise SetupError(
            f"--max-tokens {c.max_tokens} leaves no room for a prompt in --max-context {max_context}", usage=True
        )
    if settings.tools.replay and settings.tools.cache is None:
        raise SetupError("--replay needs --cache PATH: the cache file to answer tool calls from", usage=True)
    try:
        extra = [parse_server_spec(text) for text in settings.tools.mcp]
    except ValueError as exc:
        raise SetupError(str(exc), usage=True) from None
    names = [spec.name for spec in extra]
    if len(set(names)) != len(names):
        raise SetupError(
            f"two MCP servers share a name: {', '.join(sorted({n for n in names if names.count(n) > 1}))}", usage=True
        )
    return extra


def check_pool(settings: RunSettings) -> None:
    """A pool's URLs are distinct, and name servers (never the in-process model)."""
    from nanbeige.agent.backends.pool import PoolError, check_urls

    try:
        check_urls(settings.llm.urls(), settings.backend.route, settings.backend.backend)
    except PoolError as exc:
        raise SetupError(str(exc), usage=True) from None


def check_url(flag: str, url: str) -> None:
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL as exc:
        raise SetupError(f"{flag} {url!r} is not a valid URL: {exc}", usage=True) from None
    if scheme not in ("http", "https"):
        raise SetupError(f"{flag} must be an http(s) URL, not {url!r}", usage=True)


def with_texts(settings: RunSettings) -> RunSettings:
    """The settings with the texts of the files they name read in: the reference checkout's (unless
    an eval loaded it already) and the system prompt file's."""
    if settings.reference is not None and settings.agent.reference is None:  # eval loaded it already
        settings = with_reference(settings, read_reference(settings.reference))
    if settings.system_prompt_file is not None:
        template = read_template(settings.system_prompt_file)
        settings = dataclasses.replace(
            settings, agent=dataclasses.replace(settings.agent, system_prompt_template=template)
        )
    return settings


def read_template(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SetupError(
            f"cannot read --system-prompt-file {path}: {getattr(exc, 'strerror', None) or exc}", usage=True
        ) from None
    if "{tools}" not in text:
        raise SetupError(
            f"--system-prompt-file {path} has no {{tools}} placeholder: the model would not learn which tools it has",
            usage=True,
        )
    return text


def read_reference(path: Path) -> Reference:
    """The reference checkout's texts (tool descriptions as Python NANBEIGE_REFERENCE_PYTHON, default
    3.12, kept them); a checkout that lacks one is refused in one line."""
    from nanbeige.agent.reference.checkout import ReferenceError, load

    try:
        return load(path, os.environ.get("NANBEIGE_REFERENCE_PYTHON") or "3.12")
    except ReferenceError as exc:
        raise SetupError(str(exc), usage=True) from None


def with_reference(settings: RunSettings, reference: Reference) -> RunSettings:
    """The settings with the reference's texts, and (in mcp-xml) its sampling where the user set none:
    its requests are then ours byte for byte. v1.0's YAML says temperature 0.3, later ones 1.0."""
    llm = settings.llm
    if settings.agent.dialect == "mcp-xml":
        given = {name: getattr(llm, name) for name in DIALECT_SAMPLING["mcp-xml"]}
        llm = dataclasses.replace(
            llm, **{name: reference.settings.get(name) if value is None else value for name, value in given.items()}
        )
    return dataclasses.replace(settings, llm=llm, agent=dataclasses.replace(settings.agent, reference=reference))


def check_outputs(path: Path, tools: ToolsConfig) -> None:
    """That the trajectory file and the tool-result cache (unless replayed from) can be written."""
    check_writable(path)
    cache = tools.cache
    problem = unwritable(cache) if cache is not None and not tools.replay else ""
    if problem:
        raise SetupError(f"cannot write the cache {cache}: {problem}. Pass --cache with a writable path.")


def check_writable(path: Path) -> None:
    """That the trajectory file can be created or appended to, leaving nothing behind yet."""
    fix = "Pass --trajectory with a writable path."
    problem = unwritable(path)
    if problem:
        raise SetupError(f"cannot write the trajectory to {path}: {problem}. {fix}")
    try:
        check_trajectory_file(path)
    except NotATrajectoryFile as exc:
        raise SetupError(f"cannot write the trajectory: {exc}. {fix}") from None
    except OSError as exc:
        raise SetupError(f"cannot write the trajectory to {path}: {exc.strerror or exc}. {fix}") from None
