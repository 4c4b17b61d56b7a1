"""Setup: from settings to a model backend, a toolbox and a trajectory writer, for every command.

Plain functions over dataclass configs, shared by `ask` and every command that runs the loop. What
the user must fix raises `SetupError` (`setup_checks.py`): one line that names the fix. Cheap checks
come first: the settings and paths (`setup_checks.py`), then one request to the model server
(`model_setup.py`), then the tool servers (seconds), and only then loading a model in this process
(tens of seconds). Nothing is written until all of it worked, so a failed start leaves no empty
trajectory or log behind.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from nanbeige.agent.backends.llm import LLM, LLMConfig, ServerInfo
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import RunSettings, ToolsConfig
from nanbeige.agent.setup.model_setup import Notice, find_model, start_backend
from nanbeige.agent.setup.setup_checks import SetupError, check_outputs, check_settings, with_texts
from nanbeige.agent.toolbox.cache import CacheError, ToolCache
from nanbeige.agent.toolbox.server_env import passed_env, secrets_in_env
from nanbeige.agent.toolbox.server_log import ServerLog
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox, ToolboxError
from nanbeige.agent.trajectory.records import NotATrajectoryFile
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriteError, TrajectoryWriter
from nanbeige.tools.endpoint import url_credentials, without_credentials

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference


@dataclass
class Ready:
    """What the runs of a command share: one backend, one toolbox, one trajectory file."""

    llm: LLM
    toolbox: Toolbox | None
    writer: TrajectoryWriter
    path: Path
    """Where the trajectories go."""
    agent: AgentConfig
    """The loop settings, with the context length the server reported filled in."""
    server: ServerInfo | None = None
    """What the model server said about itself; None when the model runs in this process."""


def default_trajectory_path() -> Path:
    runs = Path(os.environ.get("NANBEIGE_RUNS_DIR", "runs"))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return runs / f"{stamp}-{uuid.uuid4().hex[:6]}.jsonl"


def default_servers(
    llm_config: LLMConfig,
    notice: Notice,
    upload_dirs: list[Path] | None = None,
    replay: bool = False,
    reference: Reference | None = None,
) -> list[ServerSpec]:
    """The built-in tool servers: Python sandbox, search (when a backend is set up, or to be replayed
    from the cache; otherwise a notice says how), and scrape + extract (extracting with the run's own
    model unless NANBEIGE_SUMMARY_* say otherwise)."""
    from nanbeige.tools.search_config import search_setup_problem

    env = passed_env(with_secrets=True) | {"NANBEIGE_BASE_URL": llm_config.base_url, "NANBEIGE_MODEL": llm_config.model}
    if llm_config.api_key:
        env["NANBEIGE_API_KEY"] = llm_config.api_key
    if reference is not None:  # the reference's own answers where our servers give the model text
        env |= {
            "NANBEIGE_SANDBOX_PLACEHOLDER_IDS": json.dumps(sorted(reference.placeholder_ids)),
            "NANBEIGE_SANDBOX_PLACEHOLDER_TEXT": reference.placeholder_text or "",
        }
        if reference.extraction_prompt:
            env["NANBEIGE_EXTRACTION_PROMPT"] = reference.extraction_prompt
    if upload_dirs:
        allowed = env.get("NANBEIGE_SANDBOX_UPLOAD_DIRS") or os.getcwd()
        env["NANBEIGE_SANDBOX_UPLOAD_DIRS"] = os.pathsep.join([allowed, *map(str, upload_dirs)])
    modules = {"tool-python": "python", "search_and_scrape_webpage": "search", "jina_scrape_llm_summary": "scrape"}
    problem = search_setup_problem()
    if problem and not replay:  # a replay never reaches the backend: the server only lists its tool
        notice(f"search is off: {problem}")
        del modules["search_and_scrape_webpage"]
    return [
        ServerSpec(name=name, command=[sys.executable, "-m", f"nanbeige.servers.{module}"], env=env)
        for name, module in modules.items()
    ]


def tool_servers(settings: RunSettings, extra: list[ServerSpec], notice: Notice) -> list[ServerSpec]:
    """The tool servers to start: the built-in ones (unless turned off) and the user's; a notice when there are none."""
    specs = (
        default_servers(
            settings.llm, notice, settings.tools.upload_dirs, settings.tools.replay, settings.agent.reference
        )
        if settings.tools.default_servers
        else []
    ) + extra
    if not specs:
        notice("no tools available: the model answers from its own knowledge. Add MCP servers with --mcp NAME=COMMAND.")
    return specs


def secrets_of(settings: RunSettings) -> list[str]:
    """Every key the runs know, and the credentials in URLs, to be kept out of every output."""
    credentials = [secret for url in settings.llm.urls() for secret in url_credentials(url)]
    return [s for s in (settings.llm.api_key, *credentials, *secrets_in_env()) if s]


@asynccontextmanager
async def ready(settings: RunSettings, notice: Notice) -> AsyncIterator[Ready]:
    """Check, start and load everything a command's runs need, cheapest first; close it all after.
    Until the runs begin nothing is left behind on failure, except a tool server's own output when it
    is what failed to start."""
    extra = check_settings(settings)
    settings = with_texts(settings)
    path = settings.trajectory or default_trajectory_path()
    check_outputs(path, settings.tools)
    settings, server = await find_model(settings, notice)
    specs = tool_servers(settings, extra, notice)
    secrets = secrets_of(settings)
    log_path = Path(os.devnull) if _is_devnull(path) else path.with_name(path.name + ".servers.log")
    new_log, new_folders = not log_path.exists(), [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        errlog = ServerLog(log_path, secrets) if specs else None
    except OSError as exc:
        raise SetupError(
            f"cannot write the tool servers' log {log_path}: {exc.strerror or exc}. Pass --trajectory "
            "with a path in a writable folder."
        ) from None
    began, keep_log = False, False
    try:
        async with _toolbox(specs, settings.tools, errlog and errlog.stream, secrets, notice) as toolbox:
            llm = await start_backend(settings, server, notice)
            try:
                writer = open_writer(path, secrets, settings.whole_trajectories)
                began = True
                try:
                    yield Ready(llm, toolbox, writer, path, settings.agent, server)
                finally:
                    writer.close()
            finally:
                if (summary := getattr(llm, "summary", None)) is not None:  # a pool: how each endpoint did
                    notice(summary())
                await llm.aclose()
    except ToolboxError as exc:
        if errlog:
            errlog.close()  # all the failed server wrote is in the log
        keep_log = errlog is not None and errlog.size() > 0
        # only a stdio server writes its output there: for a URL the log holds the other servers' lines
        raise SetupError(f"{exc}" + (f" (its output is in {log_path})" if keep_log and exc.logged else "")) from None
    finally:
        if errlog:
            errlog.close()
        if not began:  # remove what the failed start created
            _remove(log_path if new_log and not keep_log else None, new_folders)


@asynccontextmanager
async def _toolbox(
    specs: list[ServerSpec], tools: ToolsConfig, errlog: IO[str] | None, secrets: list[str], notice: Notice
) -> AsyncIterator[Toolbox | None]:
    if not specs:
        yield None
        return
    cache = await open_cache(tools, notice)
    try:
        async with Toolbox(
            specs,
            call_timeout_s=tools.tool_timeout_s,
            max_result_chars=tools.max_result_chars,
            errlog=errlog,
            start_timeout_s=tools.start_timeout_s,
            secrets=secrets,
            cache=cache,
            max_restarts=tools.max_restarts,
            flags={"mcp": [_without_credentials(spec) for spec in tools.mcp], "default_servers": tools.default_servers},
        ) as toolbox:
            yield toolbox
    finally:
        if cache is not None:
            await cache.aclose()


def _without_credentials(spec: str) -> str:
    """An `--mcp NAME=URL` (or NAME=COMMAND) with a URL's credentials left out."""
    name, equals, target = spec.partition("=")
    return f"{name}{equals}{without_credentials(target)}"


async def open_cache(tools: ToolsConfig, notice: Notice) -> ToolCache | None:
    """The tool-result cache the settings name, opened (None when they name none)."""
    if tools.cache is None:
        return None
    try:
        return await ToolCache.open(tools.cache, tools.replay, notice)
    except CacheError as exc:
        raise SetupError(str(exc)) from None


def _remove(log_path: Path | None, folders: list[Path]) -> None:
    """Remove the server log, then the folders made for it, innermost first, while they are empty."""
    if log_path is not None and log_path.exists():
        log_path.unlink()
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def open_writer(path: Path, secrets: list[str], whole: bool = False) -> TrajectoryWriter:
    try:
        return TrajectoryWriter(path, secrets=secrets, whole=whole)
    except OSError as exc:
        raise SetupError(
            f"cannot write the trajectory to {path}: {exc.strerror or exc}. Pass --trajectory with a writable path."
        ) from None
    except (NotATrajectoryFile, TrajectoryWriteError) as exc:
        raise SetupError(f"{exc}. Pass --trajectory with a writable path.") from None


def _is_devnull(path: Path) -> bool:
    """The trajectory is thrown away: so is the tool servers' log."""
    try:
        return os.path.samefile(path, os.devnull)
    except OSError:
        return False
