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
from typing import IO, TYPE_CHECKING, Annotated

import httpx
import orjson
import typer
from rich.console import Console

from nanbeige.agent import commands, dialects
from nanbeige.agent.console import err, fail

if TYPE_CHECKING:  # imported lazily at run time so `--help` stays fast
    from nanbeige.agent.llm import LLM, LLMConfig
    from nanbeige.agent.loop import AgentConfig
    from nanbeige.agent.toolbox import ServerSpec
    from nanbeige.agent.trajectory import Trajectory, TrajectoryWriter

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Agent runtime for deep search and tool use with Nanbeige4.1-3B.")
ADVANCED = "Advanced"
BACKENDS = ("auto", "openai", "transformers")


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


app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    commands.serve)
app.command("server")(commands.server)
app.add_typer(commands.index_app, name="index")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
