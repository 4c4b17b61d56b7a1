"""The `nanbeige` command line.

    nanbeige ask "question"      run the agent; the answer alone on stdout, the turns on stderr
    nanbeige show run.jsonl      print a saved trajectory readably

Settings come from flags, then environment variables (NANBEIGE_*), then defaults.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, NoReturn

import httpx
import orjson
import typer
from rich.console import Console
from rich.markup import escape

from nanbeige.agent import dialects

if TYPE_CHECKING:  # imported lazily at run time so `--help` stays fast
    from nanbeige.agent.llm import LLM, LLMConfig
    from nanbeige.agent.loop import AgentConfig
    from nanbeige.agent.toolbox import ServerSpec
    from nanbeige.agent.trajectory import Trajectory, TrajectoryWriter

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Agent runtime for deep search and tool use with Nanbeige4.1-3B.")
err = Console(stderr=True)
ADVANCED = "Advanced"
BACKENDS = ("auto", "openai", "transformers")


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def default_trajectory_path() -> Path:
    runs = Path(os.environ.get("NANBEIGE_RUNS_DIR", "runs"))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return runs / f"{stamp}-{uuid.uuid4().hex[:6]}.jsonl"


def server_answers(base_url: str, api_key: str | None, timeout: float = 10.0) -> str | None:
    """None when a model server answers at the address (a model list, or 401: up but wanting a key),
    else what went wrong."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if response.status_code == 401:
        return None
    try:
        listed = response.status_code == 200 and isinstance(response.json().get("data"), list)
    except ValueError:
        listed = False
    return None if listed else f"HTTP {response.status_code} from {base_url}/models: not an OpenAI-compatible server"


def make_llm(backend: str, explicit_url: bool, config: LLMConfig, gguf_file: str | None,
             token_mode: bool = False, chat_template: Path | None = None) -> LLM:
    """The model backend. `auto` uses a server at the default address when one answers and runs the
    model in-process otherwise; a server the user named that does not answer is an error."""
    from nanbeige.agent.llm import OpenAIChat

    if token_mode and backend == "transformers":
        fail("--token-mode talks to a vLLM server; the in-process backend records exact tokens by itself", 2)
    if gguf_file and backend == "openai":
        fail("--gguf-file is for the in-process backend (--backend transformers)", 2)
    if token_mode:
        return token_mode_llm(config, chat_template)
    if backend == "openai" or (backend == "auto" and explicit_url):
        problem = server_answers(config.base_url, config.api_key)
        if problem:
            fail(f"cannot reach the model server at {config.base_url} ({problem}). Start one with `nanbeige serve`, "
                 "point --base-url / NANBEIGE_BASE_URL at a running OpenAI-compatible server, or use "
                 "--backend transformers to run the model in this process.")
        return OpenAIChat(config)
    if backend == "auto" and server_answers(config.base_url, config.api_key, timeout=2.0) is None:
        return OpenAIChat(config)
    if backend == "auto":
        err.print(f"[yellow]no model server at {config.base_url}:[/] running {config.model} in this process "
                  "(start one with `nanbeige serve` for speed)", highlight=False)
    return load_local_model(config, gguf_file)


def token_mode_llm(config: LLMConfig, chat_template: Path | None) -> LLM:
    from nanbeige.agent.llm import ModelError
    from nanbeige.agent.token_mode import TokenModeChat, load_tokenizer

    problem = server_answers(config.base_url, config.api_key)
    if problem:
        fail(f"cannot reach the model server at {config.base_url} ({problem}); token mode needs a vLLM server: "
             "start one with `nanbeige serve --rl-logprobs`")
    try:
        tokenizer, template = load_tokenizer(config.model, chat_template)
        return TokenModeChat(config, tokenizer, template)
    except (ModelError, OSError) as exc:
        fail(str(exc))


def load_local_model(config: LLMConfig, gguf_file: str | None) -> LLM:
    from nanbeige.agent.local import LocalModelError, TransformersLLM

    with err.status(f"loading {config.model} …"):
        try:
            return TransformersLLM(config, gguf_file=gguf_file)
        except LocalModelError as exc:
            fail(str(exc))


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    base_url: Annotated[str | None, typer.Option(envvar="NANBEIGE_BASE_URL", show_default=False,
                                                 help="OpenAI-compatible endpoint [default: http://127.0.0.1:8000/v1, "
                                                      "or the in-process model when nothing answers there].")] = None,
    backend: Annotated[str, typer.Option(help="auto, openai (a server) or transformers (in this process).")] = "auto",
    model: Annotated[str, typer.Option(envvar="NANBEIGE_MODEL", help="Model name.")] = "Nanbeige/Nanbeige4.1-3B",
    api_key: Annotated[str | None, typer.Option(envvar="NANBEIGE_API_KEY", help="API key for the endpoint.",
                                                show_default=False)] = None,
    dialect: Annotated[str, typer.Option(help="Tool dialect: mcp-xml or tool-call.")] = "mcp-xml",
    max_turns: Annotated[int, typer.Option(min=1, help="Most model turns before the answer is asked for.")] = 200,
    keep_tool_results: Annotated[int, typer.Option(min=-1, help="Show only the last K tool results (-1: all).")] = 5,
    max_context: Annotated[int, typer.Option(min=1024, help="Model context length in tokens.")] = 131072,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.6,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.95,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per model reply.")] = 16384,
    trajectory: Annotated[Path | None, typer.Option(help="Trajectory file (JSONL, appended). Default: a new "
                                                         "file under runs/.", show_default=False)] = None,
    mcp: Annotated[list[str] | None, typer.Option(help="Extra MCP server, NAME=COMMAND or NAME=URL (repeatable).",
                                                  show_default=False)] = None,
    no_default_servers: Annotated[bool, typer.Option(help="Use only the --mcp servers.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the end record as JSON on stdout.")] = False,
    tool_timeout: Annotated[float, typer.Option(min=1, help="Seconds one tool call may take.",
                                                rich_help_panel=ADVANCED)] = 300.0,
    max_result_chars: Annotated[int, typer.Option(min=100, help="Longer tool results are cut.",
                                                  rich_help_panel=ADVANCED)] = 100_000,
    timeout: Annotated[float | None, typer.Option(help="Wall-clock limit for the run, in seconds.",
                                                  rich_help_panel=ADVANCED, show_default=False)] = None,
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file inside --model, for the in-process backend.",
                                                  rich_help_panel=ADVANCED, show_default=False)] = None,
    token_mode: Annotated[bool, typer.Option(help="Render prompts here with the model's tokenizer and send token "
                                                  "ids to vLLM's /v1/completions (token-exact trajectories).",
                                             rich_help_panel=ADVANCED)] = False,
    chat_template: Annotated[Path | None, typer.Option(help="Chat template file for --token-mode (default: the "
                                                            "tokenizer's).", rich_help_panel=ADVANCED,
                                                       show_default=False)] = None,
) -> None:
    """Research a question with tools; print the answer."""
    from nanbeige.agent.llm import LLMConfig
    from nanbeige.agent.loop import AgentConfig
    from nanbeige.agent.toolbox import secrets_in_env

    if dialect not in dialects.DIALECTS:
        fail(f"--dialect must be one of {', '.join(dialects.DIALECTS)}, not {dialect!r}", 2)
    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}", 2)
    explicit_url = base_url is not None
    base_url = base_url or LLMConfig.base_url
    check_url_flag("--base-url", base_url)
    llm_config = LLMConfig(base_url=base_url, model=model, api_key=api_key, temperature=temperature, top_p=top_p,
                           max_tokens=max_tokens)
    config = AgentConfig(dialect=dialect, max_turns=max_turns, keep_tool_results=keep_tool_results,
                         max_context=max_context, timeout_s=timeout)
    if max_tokens + config.context_reserve >= max_context:
        fail(f"--max-tokens {max_tokens} leaves no room for a prompt in --max-context {max_context}", 2)
    specs = server_specs(mcp or [], not no_default_servers, llm_config)
    path = trajectory or default_trajectory_path()
    llm = make_llm(backend, explicit_url, llm_config, gguf_file, token_mode, chat_template)
    secrets = [api_key or "", *secrets_in_env()]
    writer = open_writer(path, secrets)
    if not specs:
        err.print("[yellow]no tools available:[/] the model answers from its own knowledge. Add MCP servers "
                  "with --mcp NAME=COMMAND.", highlight=False)
    err.print(f"[dim]trajectory: {path}[/]", highlight=False)
    errlog = open(path.with_name(path.name + ".servers.log"), "a") if specs else None
    try:
        result = asyncio.run(_ask(question, llm, specs, config, writer, errlog, secrets,
                                  call_timeout_s=tool_timeout, max_result_chars=max_result_chars))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C; the servers' shutdown may re-cancel the task
        err.print(f"[yellow]interrupted[/]; the trajectory so far is in {path}", highlight=False)
        raise typer.Exit(130) from None
    finally:
        writer.close()
        if errlog:
            errlog.close()
    report(result, json_output)


def check_url_flag(flag: str, url: str) -> None:
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL as exc:
        fail(f"{flag} {url!r} is not a valid URL: {exc}", 2)
    if scheme not in ("http", "https"):
        fail(f"{flag} must be an http(s) URL, not {url!r}", 2)


def server_specs(mcp: list[str], defaults: bool, llm_config: LLMConfig) -> list[ServerSpec]:
    """The MCP servers of a run: the built-in ones (unless turned off), then the user's."""
    from nanbeige.agent.toolbox import parse_server_spec

    try:
        extra = [parse_server_spec(text) for text in mcp]
    except ValueError as exc:
        fail(str(exc), 2)
    specs = (default_servers(llm_config) if defaults else []) + extra
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        fail(f"two MCP servers share a name: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}", 2)
    return specs


async def _ask(question: str, llm: LLM, specs: list[ServerSpec], config: AgentConfig,
               writer: TrajectoryWriter, errlog: IO[str] | None, secrets: list[str], **toolbox_options: float) -> Trajectory:
    from nanbeige.agent.loop import run
    from nanbeige.agent.toolbox import Toolbox, ToolboxError
    from nanbeige.agent.view import LiveView

    try:
        async with Toolbox(specs, errlog=errlog, secrets=secrets, **toolbox_options) as toolbox:
            return await run(question, llm, toolbox, config, writer, on_event=LiveView(err, config.max_turns))
    except ToolboxError as exc:
        fail(str(exc))
    finally:
        await llm.aclose()


def default_servers(llm_config: LLMConfig) -> list[ServerSpec]:
    """The built-in tool servers `ask` launches: Python sandbox, search (when a backend is set up;
    otherwise a warning says how), and scrape + extract (extracting with the run's own model unless
    NANBEIGE_SUMMARY_* say otherwise)."""
    from nanbeige.agent.toolbox import ServerSpec, passed_env
    from nanbeige.tools.search import search_setup_problem

    env = passed_env(with_secrets=True) | {"NANBEIGE_BASE_URL": llm_config.base_url,
                                           "NANBEIGE_MODEL": llm_config.model}
    if llm_config.api_key:
        env["NANBEIGE_API_KEY"] = llm_config.api_key
    modules = {"tool-python": "python", "search_and_scrape_webpage": "search", "jina_scrape_llm_summary": "scrape"}
    problem = search_setup_problem()
    if problem:
        err.print(f"[yellow]search is off:[/] {problem}", highlight=False, soft_wrap=True)
        del modules["search_and_scrape_webpage"]
    return [ServerSpec(name=name, command=[sys.executable, "-m", f"nanbeige.servers.{module}"], env=env)
            for name, module in modules.items()]


def open_writer(path: Path, secrets: list[str]) -> TrajectoryWriter:
    from nanbeige.agent.trajectory import TrajectoryWriter

    try:
        return TrajectoryWriter(path, secrets=secrets)
    except OSError as exc:
        fail(f"cannot write the trajectory to {path}: {exc.strerror or exc}. Pass --trajectory with a writable path.")


def report(trajectory: Trajectory, json_output: bool) -> None:
    from nanbeige.agent.trajectory import end_record

    if json_output:
        sys.stdout.write(orjson.dumps(end_record(trajectory)).decode() + "\n")
    elif trajectory.answer is not None:
        sys.stdout.write(trajectory.answer + "\n")
    turns = len(trajectory.turns)
    err.print(f"[dim]{trajectory.stop_reason} after {turns} turn{'s' * (turns != 1)} in "
              f"{trajectory.timings.get('wall_s', 0):.1f}s[/]", highlight=False)
    if trajectory.answer is None:
        detail = f": {trajectory.error}" if trajectory.error else ""
        fail(f"no answer (stop reason {trajectory.stop_reason}){detail}")


@app.command("show")
def show_command(
    path: Annotated[Path, typer.Argument(help="A trajectory file (JSONL).")],
    full: Annotated[bool, typer.Option(help="Show reasoning and tool results in full.")] = False,
) -> None:
    """Print a saved trajectory readably."""
    from nanbeige.agent.trajectory import load_trajectories
    from nanbeige.agent.view import show

    try:
        trajectories = load_trajectories(path)
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"{exc}: is this a trajectory file?")
    if not trajectories:
        fail(f"{path} holds no trajectory")
    out = Console()
    for trajectory in trajectories:
        show(out, trajectory, full=full)


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve_command(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Model id or folder.")] = "Nanbeige/Nanbeige4.1-3B",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    dialect: Annotated[str, typer.Option(help="mcp-xml (no tool parser) or tool-call (hermes parser).")] = "mcp-xml",
    max_model_len: Annotated[int, typer.Option(min=1024, help="Context length.")] = 131072,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.05, max=1.0)] = 0.92,
    data_parallel_size: Annotated[int, typer.Option("--data-parallel-size", "-dp", min=1)] = 1,
    chat_template: Annotated[Path | None, typer.Option(help="Chat template: a .jinja file, or a tokenizer config "
                                                            "JSON whose chat_template is used.",
                                                       show_default=False)] = None,
    rl_logprobs: Annotated[bool, typer.Option(help="Report processed logprobs, for RL rollouts.")] = False,
    no_prefix_caching: Annotated[bool, typer.Option(help="Turn prefix caching off.")] = False,
) -> None:
    """Start vLLM's OpenAI-compatible server for the model and wait until it answers. Arguments after
    `--` go to vLLM unchanged."""
    from nanbeige.agent.serve import ServeConfig, check_vllm_available, serve

    config = ServeConfig(model=model, host=host, port=port, dialect=dialect, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization, data_parallel_size=data_parallel_size,
                         chat_template=chat_template, rl_logprobs=rl_logprobs,
                         enable_prefix_caching=not no_prefix_caching, extra_args=list(ctx.args))
    problem = check_vllm_available(config)
    if problem:
        fail(problem)
    raise typer.Exit(serve(config, lambda text: err.print(text, markup=False, highlight=False, soft_wrap=True)))


@app.command("server")
def server_command(
    name: Annotated[str, typer.Argument(help="search, scrape or python.")],
    transport: Annotated[str, typer.Option(help="stdio or http (streamable HTTP at /mcp).")] = "stdio",
    host: Annotated[str, typer.Option(help="Address to listen on (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on (http).")] = 8001,
) -> None:
    """Run one of the built-in MCP tool servers, for any MCP client. Settings come from the
    environment (see the README)."""
    import importlib

    if name not in ("search", "scrape", "python"):
        fail(f"unknown server {name!r}: choose search, scrape or python", 2)
    if transport not in ("stdio", "http"):
        fail(f"--transport must be stdio or http, not {transport!r}", 2)
    if transport == "http":
        err.print(f"[dim]serving {name} at http://{host}:{port}/mcp[/]", highlight=False)
    importlib.import_module(f"nanbeige.servers.{name}").serve(transport, host, port)


index_app = typer.Typer(no_args_is_help=True, help="Build and query the local search index.")
app.add_typer(index_app, name="index")


@index_app.command("build")
def index_build(
    sources: Annotated[list[Path], typer.Argument(help="Folders or files: .txt .md .html .pdf, JSON/JSONL records.")],
    out: Annotated[Path | None, typer.Option(help="Index folder (default: NANBEIGE_INDEX or the data folder).",
                                             show_default=False)] = None,
) -> None:
    """Build the local index that the search server uses when no web search is configured."""
    from rich.progress import Progress

    from nanbeige.tools.index import IndexBuildError, build_index, default_index_dir

    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        fail(f"no such file or folder: {', '.join(missing)}", 2)
    out = out or default_index_dir()
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("reading", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            stats = build_index(sources, out, progress)
        except IndexBuildError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"cannot write the index to {out}: {exc.strerror or exc}")
    err.print(f"indexed {stats.documents} documents ({stats.passages} passages) from {stats.files} files in "
              f"{stats.seconds:.1f}s; {stats.bytes_on_disk / 1e6:.1f} MB in {out}", highlight=False)
    for reason in stats.skipped[:20]:
        err.print(f"[yellow]skipped[/] {reason}", highlight=False)


@index_app.command("search")
def index_search(
    index_dir: Annotated[Path, typer.Argument(help="The index folder.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    k: Annotated[int, typer.Option("-k", min=1, help="How many results.")] = 10,
) -> None:
    """Query a local index and print the hits."""
    from nanbeige.tools.index import IndexNotFound, search_index

    try:
        hits = search_index(index_dir, query, k)
    except IndexNotFound as exc:
        fail(str(exc))
    out = Console()
    for hit in hits:
        out.print(f"[bold]{hit['position']}. {escape(hit['title'])}[/]  [dim]{escape(hit['link'])}[/]",
                  highlight=False)
        out.print(escape(hit["snippet"]), highlight=False)
    if not hits:
        err.print("no results")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
