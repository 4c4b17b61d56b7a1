"""Setup: from settings to a model backend, a toolbox and a trajectory writer, for every command.

Plain functions over dataclass configs, shared by `ask` and every command that runs the loop. What
the user must fix raises `SetupError`: one line that names the fix. Cheap checks come first: the
settings and paths, then one request to the model server, then the tool servers (seconds), and only
then loading a model in this process (tens of seconds). Nothing is written until all of it worked,
so a failed start leaves no empty trajectory or log behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from nanbeige.agent import dialects
from nanbeige.agent.backends.in_process import in_thread, loading
from nanbeige.agent.backends.llm import (
    DIALECT_SAMPLING,
    LLM,
    LLMConfig,
    ModelError,
    ModelUnreachable,
    OpenAIChat,
    ServerInfo,
    probe_server,
)
from nanbeige.agent.backends.prompts import search_template
from nanbeige.agent.cache import CacheError, ToolCache
from nanbeige.agent.loop import DEFAULT_MAX_CONTEXT, AgentConfig
from nanbeige.agent.records import NotATrajectoryFile, check_trajectory_file
from nanbeige.agent.run_config import BACKENDS, RunSettings, ToolsConfig
from nanbeige.agent.server_log import ServerLog
from nanbeige.agent.toolbox import (
    ServerSpec,
    Toolbox,
    ToolboxError,
    parse_server_spec,
    passed_env,
    secrets_in_env,
)
from nanbeige.agent.trajectory import TrajectoryWriteError, TrajectoryWriter
from nanbeige.agent.writable import unwritable
from nanbeige.tools.endpoint import url_credentials, without_credentials
from nanbeige.tools.errors import NanbeigeError

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference

Notice = Callable[[str], None]


class SetupError(NanbeigeError):
    """Something the user must fix before a run can start; the message names the fix."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage
        self.exit_code = 2 if usage else 1  # a bad flag or value (`usage`) is a usage error


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


def check_settings(settings: RunSettings) -> list[ServerSpec]:
    """Everything that costs nothing to check, before anything is started; returns the user's servers."""
    b, c = settings.backend, settings.llm
    if settings.agent.dialect not in dialects.DIALECTS:
        raise SetupError(f"--dialect must be one of {', '.join(dialects.DIALECTS)}, not {settings.agent.dialect!r}",
                         usage=True)
    if b.backend not in BACKENDS:
        raise SetupError(f"--backend must be one of {', '.join(BACKENDS)}, not {b.backend!r}", usage=True)
    for url in c.urls():
        check_url("--base-url", url)
    check_pool(settings)
    if c.api_key and not c.api_key.isascii():
        raise SetupError("--api-key / NANBEIGE_API_KEY has characters that are not ASCII: an HTTP header cannot carry "
                         "them; check the key", usage=True)
    if b.token_mode and b.backend == "transformers":
        raise SetupError("--token-mode talks to a vLLM server; the in-process backend records exact tokens by "
                         "itself", usage=True)
    if b.gguf_file and b.backend == "openai":
        raise SetupError("--gguf-file is for the in-process backend (--backend transformers)", usage=True)
    if b.chat_template is not None and not b.chat_template.is_file():
        raise SetupError(f"--chat-template {b.chat_template}: no such file", usage=True)
    max_context = settings.agent.max_context
    if max_context is not None and c.max_tokens + settings.agent.context_reserve >= max_context:
        raise SetupError(f"--max-tokens {c.max_tokens} leaves no room for a prompt in --max-context {max_context}",
                         usage=True)
    if settings.tools.replay and settings.tools.cache is None:
        raise SetupError("--replay needs --cache PATH: the cache file to answer tool calls from", usage=True)
    try:
        extra = [parse_server_spec(text) for text in settings.tools.mcp]
    except ValueError as exc:
        raise SetupError(str(exc), usage=True) from None
    names = [spec.name for spec in extra]
    if len(set(names)) != len(names):
        raise SetupError(f"two MCP servers share a name: {', '.join(sorted({n for n in names if names.count(n) > 1}))}",
                         usage=True)
    return extra


def check_pool(settings: RunSettings) -> None:
    """A pool's URLs are distinct, and name servers (never the in-process model)."""
    from nanbeige.agent.backends.pool import PoolError, check_urls

    try:
        check_urls(settings.llm.urls(), settings.backend.route, settings.backend.backend)
    except PoolError as exc:
        raise SetupError(str(exc), usage=True) from None


def read_template(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SetupError(f"cannot read --system-prompt-file {path}: {getattr(exc, 'strerror', None) or exc}",
                         usage=True) from None
    if "{tools}" not in text:
        raise SetupError(f"--system-prompt-file {path} has no {{tools}} placeholder: the model would not learn "
                         "which tools it has", usage=True)
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
        llm = dataclasses.replace(llm, **{name: reference.settings.get(name) if value is None else value
                                          for name, value in given.items()})
    return dataclasses.replace(settings, llm=llm, agent=dataclasses.replace(settings.agent, reference=reference))


def check_url(flag: str, url: str) -> None:
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL as exc:
        raise SetupError(f"{flag} {url!r} is not a valid URL: {exc}", usage=True) from None
    if scheme not in ("http", "https"):
        raise SetupError(f"{flag} must be an http(s) URL, not {url!r}", usage=True)


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


def default_servers(llm_config: LLMConfig, notice: Notice, upload_dirs: list[Path] | None = None,
                    replay: bool = False, reference: Reference | None = None) -> list[ServerSpec]:
    """The built-in tool servers: Python sandbox, search (when a backend is set up, or to be replayed
    from the cache; otherwise a notice says how), and scrape + extract (extracting with the run's own
    model unless NANBEIGE_SUMMARY_* say otherwise)."""
    from nanbeige.tools.search import search_setup_problem

    env = passed_env(with_secrets=True) | {"NANBEIGE_BASE_URL": llm_config.base_url,
                                           "NANBEIGE_MODEL": llm_config.model}
    if llm_config.api_key:
        env["NANBEIGE_API_KEY"] = llm_config.api_key
    if reference is not None:  # the reference's own answers where our servers give the model text
        env |= {"NANBEIGE_SANDBOX_PLACEHOLDER_IDS": json.dumps(sorted(reference.placeholder_ids)),
                "NANBEIGE_SANDBOX_PLACEHOLDER_TEXT": reference.placeholder_text or ""}
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
    return [ServerSpec(name=name, command=[sys.executable, "-m", f"nanbeige.servers.{module}"], env=env)
            for name, module in modules.items()]


def find_model_server(settings: RunSettings, notice: Notice) -> ServerInfo | None:
    """The model server to use and what it says about itself; None when the model runs in this process
    (after checking it can be had: a local folder, downloaded, or a hub that answers).
    `auto` falls back to this process only from the default address, never from one the user named."""
    from nanbeige.agent.backends.in_process import LocalModelError, check_model_available, resolve_small_model

    b, c = settings.backend, settings.llm
    if c.more_base_urls:  # the runs must fit the smallest context of the pool
        servers = pool_servers(settings)
        lengths = [info.max_model_len for info in servers if info.max_model_len]
        return dataclasses.replace(servers[0], max_model_len=min(lengths) if lengths else None)
    wanted = b.token_mode or b.backend == "openai" or (b.backend == "auto" and b.base_url_given)
    if b.backend != "transformers":
        try:
            server = probe_server(c.base_url, c.api_key, timeout=10.0 if wanted else 2.0, model=c.model)
            if b.token_mode and not server.vllm:
                raise SetupError(f"--token-mode needs a vLLM server (it sends token ids to /v1/completions); the "
                                 f"server at {c.base_url} is not vLLM. Start one with `nanbeige serve --rl-logprobs`.")
            return server
        except ModelUnreachable as exc:
            if wanted:
                fix = ("token mode needs a vLLM server: start one with `nanbeige serve --rl-logprobs`" if b.token_mode
                       else "Start one with `nanbeige serve`, point --base-url / NANBEIGE_BASE_URL at a running "
                       "OpenAI-compatible server, or use --backend transformers to run the model in this process.")
                raise SetupError(f"cannot reach the model server at {c.base_url} ({exc}). {fix}") from None
        notice(f"no model server at {c.base_url}: running {c.model} in this process (start one with "
               "`nanbeige serve` for speed)")
    try:
        check_model_available(*resolve_small_model(c.model, b.gguf_file))
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None
    return None


def pool_servers(settings: RunSettings) -> list[ServerInfo]:
    """What every endpoint of a pool says about itself; one line naming those that differ or do not answer."""
    from nanbeige.agent.backends.pool import PoolError, ask_endpoints

    c = settings.llm
    try:
        return ask_endpoints(c.urls(), c.api_key, c.model, settings.backend.token_mode)
    except PoolError as exc:
        raise SetupError(str(exc)) from None


def in_process(settings: RunSettings, notice: Notice) -> RunSettings:
    """The settings for a model run in this process: on a CPU, a reply length and a number of turns a CPU gets
    through where the user left the defaults (said on stderr). The model keeps the name typed (`smollm2`)."""
    from nanbeige.agent.backends.in_process import CPU_MAX_TOKENS, CPU_MAX_TURNS, LocalModelError, on_cpu

    b, llm, agent = settings.backend, settings.llm, settings.agent
    try:
        cpu = on_cpu()
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None
    cut = []
    if cpu and llm.max_tokens == LLMConfig.max_tokens:  # the default, not the user's choice
        llm = dataclasses.replace(llm, max_tokens=CPU_MAX_TOKENS)
        cut.append(f"--max-tokens {CPU_MAX_TOKENS}")
    if cpu and agent.max_turns is None:
        agent = dataclasses.replace(agent, max_turns=CPU_MAX_TURNS)
        cut.append(f"--max-turns {CPU_MAX_TURNS}")
    if cut:
        notice(f"on the CPU: {' and '.join(cut)} (a CPU generates a few tokens a second; set them to go further)")
    return dataclasses.replace(settings, llm=llm, backend=b, agent=agent)


def make_llm(settings: RunSettings, server: ServerInfo | None) -> LLM:
    """The model backend: a client of the server found, or the model loaded in this process (slow)."""
    b, c = settings.backend, settings.llm
    if server is not None and c.more_base_urls:
        return make_pool(settings, server)
    if server is not None and b.token_mode:
        return token_mode_client(settings, server)
    if server is not None:
        return OpenAIChat(c, server=server)
    from nanbeige.agent.backends.in_process import LocalModelError, TransformersLLM

    try:
        return TransformersLLM(c, gguf_file=b.gguf_file, verbose=b.verbose)
    except LocalModelError as exc:
        raise SetupError(str(exc)) from None


def make_pool(settings: RunSettings, server: ServerInfo) -> LLM:
    """One client per endpoint (in token mode sharing one tokenizer), used as one pool."""
    from nanbeige.agent.backends.pool import EndpointPool, member_config
    from nanbeige.agent.backends.token_mode import TokenModeChat

    configs = [member_config(settings.llm, url) for url in settings.llm.urls()]
    if settings.backend.token_mode:
        first = token_mode_client(dataclasses.replace(settings, llm=configs[0]), server)
        assert isinstance(first, TokenModeChat)
        members: list[OpenAIChat] = [first, *(first.at(config) for config in configs[1:])]
    else:
        members = [OpenAIChat(config, server=server) for config in configs]
    return EndpointPool(members, settings.llm, route=settings.backend.route)


def token_mode_client(settings: RunSettings, server: ServerInfo) -> LLM:
    """The token-mode client, its tokenizer from `--tokenizer`, else the first that loads of the folder the
    server lists as the model's root (when it is a folder here) and the model name."""
    from nanbeige.agent.backends.token_mode import TokenModeChat, load_tokenizer

    b, c = settings.backend, settings.llm
    root = server.weights if server.weights and Path(server.weights).is_dir() else None
    sources = [b.tokenizer] if b.tokenizer else list(dict.fromkeys(s for s in (root, c.model) if s))
    problems = []
    for source in sources:
        chosen = b.chat_template or (search_template(source) if settings.agent.dialect == "mcp-xml" else None)
        try:
            tokenizer, template = load_tokenizer(source, chosen)
            return TokenModeChat(c, tokenizer, template, template_name=chosen and chosen.name)
        except (ModelError, OSError) as exc:
            problems.append(str(exc))
    if b.tokenizer:
        raise SetupError(problems[0])
    raise SetupError(f"token mode needs the model's tokenizer: {'; '.join(problems)}. Pass --tokenizer with the "
                     "model's folder or Hugging Face id")


def for_dialect(settings: RunSettings) -> RunSettings:
    """The settings with what the user left unset (sampling, max turns, ...) taken from the dialect's defaults."""
    agent = settings.agent
    return dataclasses.replace(settings, llm=settings.llm.for_dialect(agent.dialect), agent=agent.for_dialect())


def fit_to_server(settings: RunSettings, server: ServerInfo | None, notice: Notice) -> RunSettings:
    """The settings with the context length filled in (as given, else as the server reports it) and,
    when the default reply length would not fit in a small server context, a shorter one."""
    agent, llm = settings.agent, settings.llm
    if agent.max_context is not None:
        return settings
    max_context = (server.max_model_len if server else None) or DEFAULT_MAX_CONTEXT
    if llm.max_tokens + agent.context_reserve >= max_context:
        if llm.max_tokens != LLMConfig.max_tokens:  # the user asked for this length
            raise SetupError(f"--max-tokens {llm.max_tokens} leaves no room for a prompt in the server's context of "
                             f"{max_context} tokens; pass a smaller --max-tokens", usage=True)
        llm = dataclasses.replace(llm, max_tokens=max_context // 4)
        notice(f"replies shortened: the server's context is {max_context} tokens, so --max-tokens is "
               f"{llm.max_tokens} (the default {LLMConfig.max_tokens} would leave no room for a prompt)")
    return dataclasses.replace(settings, llm=llm, agent=dataclasses.replace(agent, max_context=max_context))


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
    if settings.reference is not None and settings.agent.reference is None:  # eval loaded it already
        settings = with_reference(settings, read_reference(settings.reference))
    if settings.system_prompt_file is not None:
        template = read_template(settings.system_prompt_file)
        settings = dataclasses.replace(settings, agent=dataclasses.replace(settings.agent,
                                                                           system_prompt_template=template))
    path = settings.trajectory or default_trajectory_path()
    check_writable(path)
    cache = settings.tools.cache
    problem = unwritable(cache) if cache is not None and not settings.tools.replay else ""
    if problem:
        raise SetupError(f"cannot write the cache {cache}: {problem}. Pass --cache with a writable path.")
    server = await in_thread(find_model_server, settings, notice)
    if server is None:
        settings = await in_thread(in_process, settings, notice)
    settings = fit_to_server(for_dialect(settings), server, notice)
    specs = (default_servers(settings.llm, notice, settings.tools.upload_dirs, settings.tools.replay,
                             settings.agent.reference)
             if settings.tools.default_servers else []) + extra
    if not specs:
        notice("no tools available: the model answers from its own knowledge. Add MCP servers with --mcp NAME=COMMAND.")
    secrets = secrets_of(settings)
    log_path = Path(os.devnull) if _is_devnull(path) else path.with_name(path.name + ".servers.log")
    new_log, new_folders = not log_path.exists(), [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        errlog = ServerLog(log_path, secrets) if specs else None
    except OSError as exc:
        raise SetupError(f"cannot write the tool servers' log {log_path}: {exc.strerror or exc}. Pass --trajectory "
                         "with a path in a writable folder.") from None
    began, keep_log = False, False
    try:
        async with _toolbox(specs, settings.tools, errlog and errlog.stream, secrets, notice) as toolbox:
            llm = await _backend(settings, server, notice)
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


async def _backend(settings: RunSettings, server: ServerInfo | None, notice: Notice) -> LLM:
    if server is not None:
        return await in_thread(make_llm, settings, server)
    with loading(notice, settings.llm.model):  # tens of seconds: shown as they go where the notice can
        return await in_thread(make_llm, settings, server)


@asynccontextmanager
async def _toolbox(specs: list[ServerSpec], tools: ToolsConfig, errlog: IO[str] | None, secrets: list[str],
                   notice: Notice) -> AsyncIterator[Toolbox | None]:
    if not specs:
        yield None
        return
    cache = await open_cache(tools, notice)
    try:
        async with Toolbox(specs, call_timeout_s=tools.tool_timeout_s, max_result_chars=tools.max_result_chars,
                           errlog=errlog, start_timeout_s=tools.start_timeout_s, secrets=secrets,
                           cache=cache, max_restarts=tools.max_restarts,
                           flags={"mcp": [_without_credentials(spec) for spec in tools.mcp],
                                  "default_servers": tools.default_servers}) as toolbox:
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
        raise SetupError(f"cannot write the trajectory to {path}: {exc.strerror or exc}. "
                         "Pass --trajectory with a writable path.") from None
    except (NotATrajectoryFile, TrajectoryWriteError) as exc:
        raise SetupError(f"{exc}. Pass --trajectory with a writable path.") from None


def _is_devnull(path: Path) -> bool:
    """The trajectory is thrown away: so is the tool servers' log."""
    try:
        return os.path.samefile(path, os.devnull)
    except OSError:
        return False
