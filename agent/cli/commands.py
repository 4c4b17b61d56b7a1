"""The `nanbeige` commands around the agent: `serve` (vLLM), `server` (a built-in MCP tool server),
`index` (the local search index) and `eval` (benchmarks). Registered on the app in program.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from nanbeige.agent.cli.command_options import EVAL, SERVE
from nanbeige.agent.cli.console import err, fail, hide
from nanbeige.agent.cli.console import out as print_line
from nanbeige.agent.cli.help_screen import ShortHelpCommand
from nanbeige.agent.cli.judge_options import judge_endpoint
from nanbeige.agent.cli.option_tables import with_options, with_run_options
from nanbeige.agent.cli.serve_config import ServeConfig, real_address, real_api_key
from nanbeige.agent.run.run_config import RunSettings


@with_options(SERVE)
def serve(ctx: typer.Context, *, flags: dict[str, Any]) -> None:
    """Start vLLM's OpenAI-compatible server for the model and wait until it answers. Arguments after `--`
    go to vLLM unchanged."""
    from nanbeige.agent.cli.exposure import exposure_problem
    from nanbeige.agent.cli.serve import ON_CPU, check_vllm_available, cpu_build, gpu_visible, weights_problem
    from nanbeige.agent.cli.serve import serve as serve_vllm

    api_key, no_api_key, weight_sync = flags["api_key"], flags["no_api_key"], flags["weight_sync"]
    try:  # the address vLLM will use: a --host after `--` wins over ours
        host = real_address(ServeConfig(host=flags["host"], port=flags["port"], extra_args=list(ctx.args))).host
    except ValueError as exc:
        fail(str(exc), 2)
    problem = exposure_problem(
        host, weight_sync=weight_sync, api_key=api_key, no_api_key=no_api_key, extra_args=list(ctx.args)
    )
    if problem:
        fail(problem, 2)
    on_cpu = not gpu_visible() and cpu_build()
    hide([key for key in (api_key, real_api_key(api_key, list(ctx.args))) if key])  # one after -- is a secret too
    same = (
        "model",
        "served_model_name",
        "host",
        "port",
        "api_key",
        "no_api_key",
        "dialect",
        "max_model_len",
        "gpu_memory_utilization",
        "data_parallel_size",
        "chat_template",
        "rl_logprobs",
        "tool_call_parser",
        "weight_sync",
    )
    reasoning_parser = flags["reasoning_parser"]
    config = ServeConfig(
        on_cpu=on_cpu,
        **{name: flags[name] for name in same},
        reasoning_parser=None if reasoning_parser.lower() == "none" else reasoning_parser,
        enable_prefix_caching=not flags["no_prefix_caching"],
        extra_args=list(ctx.args),
    )
    problem = check_vllm_available(config) or weights_problem(config.model)
    if problem:
        fail(problem)
    if on_cpu:
        err.print(f"[yellow]{ON_CPU}[/]", highlight=False)
    raise typer.Exit(serve_vllm(config, lambda text: err.print(text, markup=False, highlight=False, soft_wrap=True)))


def server(
    name: Annotated[str, typer.Argument(help="search, scrape or python.")],
    transport: Annotated[str, typer.Option(help="stdio or http (streamable HTTP at /mcp).")] = "stdio",
    host: Annotated[str, typer.Option(help="Address to listen on (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on (http).")] = 8001,
) -> None:
    """Run one of the built-in MCP tool servers, for any MCP client (settings: environment variables)."""
    import importlib

    if name not in ("search", "scrape", "python"):
        fail(f"unknown server {name!r}: choose search, scrape or python", 2)
    if transport not in ("stdio", "http"):
        fail(f"--transport must be stdio or http, not {transport!r}", 2)
    if transport == "http":
        err.print(f"[dim]serving {name} at http://{host}:{port}/mcp[/]", highlight=False)
    importlib.import_module(f"nanbeige.servers.{name}").serve(transport, host, port)


reference_app = typer.Typer(
    no_args_is_help=True, help="Read the reference harness (MiroThinker) the model was trained in."
)


@reference_app.command("check")
def reference_check(
    path: Annotated[Path, typer.Argument(help="A checkout of MiroThinker (the repository's root folder).")],
    python: Annotated[
        str,
        typer.Option(
            envvar="NANBEIGE_REFERENCE_PYTHON",
            help=(
                "The Python the reference ran on, 3.12 or 3.13: 3.13 strips the indentation of the docstrings its tool "
                "descriptions are made of."
            ),
        ),
    ] = "3.12",
) -> None:
    """Say, for each text and rule the model reads, whether this checkout was understood: what
    `--reference PATH` would use. Exit 1 when something is missing. Reading a checkout runs its
    prompt_utils.py (and input_handler's process_input) with your rights, as `--reference` does: check
    only a checkout you trust."""
    from nanbeige.agent.reference.checkout import inspect

    report, reference = inspect(path, python)
    for name, ok, detail in report:
        print_line(f"{'✓' if ok else '✗'} {name}: {detail}")
    if reference is None:
        fail(f"{path} cannot be used as --reference: see the lines marked ✗", 1)
    print_line(f"sha256 {reference.sha256}")


index_app = typer.Typer(no_args_is_help=True, help="Build and query the local search index.")


@index_app.command("build")
def index_build(
    sources: Annotated[list[Path], typer.Argument(help="Folders or files: .txt .md .html .pdf, JSON/JSONL records.")],
    out: Annotated[
        Path | None, typer.Option(help="Index folder (default: NANBEIGE_INDEX or the data folder).", show_default=False)
    ] = None,
) -> None:
    """Build the local index that the search server uses when no web search is configured."""
    from rich.progress import Progress

    from nanbeige.tools.index import build_index, default_index_dir

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
        except OSError as exc:
            fail(f"cannot write the index to {out}: {exc.strerror or exc}")
    err.print(
        f"indexed {stats.documents} documents ({stats.passages} passages) from {stats.files} files in "
        f"{stats.seconds:.1f}s; {size_text(stats.bytes_on_disk)} in {out}",
        highlight=False,
    )
    # Unreadable files last, so that they sit right above the error line that counts them.
    for label, reasons in (("[yellow]skipped[/]", stats.skipped), ("[red]unreadable[/]", stats.unreadable)):
        for reason in reasons[:20]:
            err.print(f"{label} {escape(reason)}", highlight=False)
        if len(reasons) > 20:
            err.print(f"{label} ... and {len(reasons) - 20} more", highlight=False)
    if stats.unreadable:
        # The index is written and usable, but what the user asked for is not all in it: say so, exit 1.
        fail(
            f"{len(stats.unreadable)} of {stats.files} files could not be read (listed above); the index holds the rest"
        )


def size_text(size: int) -> str:
    """A size in the unit that fits it (`512 B`, `12 KB`, `1.2 MB`), so a small index never shows as 0.0 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


@index_app.command("search")
def index_search(
    index_dir: Annotated[Path, typer.Argument(help="The index folder.")],
    query: Annotated[str, typer.Argument(help="What to look for.")],
    k: Annotated[int, typer.Option("-k", min=1, help="How many results.")] = 10,
) -> None:
    """Query a local index and print the hits."""
    from nanbeige.tools.index import search_index

    hits = search_index(index_dir, query, k)
    out = Console()
    for hit in hits:
        out.print(f"[bold]{hit['position']}. {escape(hit['title'])}[/]  [dim]{escape(hit['link'])}[/]", highlight=False)
        out.print(escape(hit["snippet"]), highlight=False)
    if not hits:
        err.print("no results")


# ---------------------------------------------------------------- nanbeige eval


@with_run_options(EVAL, leave_out=("tokenizer",))
def evaluate(
    bench: Annotated[
        str,
        typer.Argument(
            help="The benchmark (see the list below), or `report` to re-render the report of the eval in FOLDER."
        ),
    ],
    folder: Annotated[
        Path | None, typer.Argument(help="With `report`: the eval's out folder.", show_default=False)
    ] = None,
    *,
    flags: dict[str, Any],
    settings: RunSettings,
) -> None:
    """Score the agent on a benchmark from its official files: every task k times, graded, resumable."""
    from nanbeige.evals.benchmarks import BENCHMARKS

    if bench == "report":
        return eval_report(folder)
    if bench not in BENCHMARKS:
        fail(f"unknown benchmark {bench!r}; known: {', '.join(BENCHMARKS)}", 2)
    if folder is not None:
        fail(f"unexpected argument {str(folder)!r}: the benchmark's file goes in --data", 2)
    if flags["ray"] is not None and BENCHMARKS[bench].pipeline is not None:
        fail(f"{bench} runs through its own pipeline, not the agent loop: --ray is for the other benchmarks", 2)
    config = replace(eval_config(BENCHMARKS[bench], flags), ray=flags["ray"])
    from nanbeige.agent.setup.setup import secrets_of

    hide(secrets_of(settings) + ([flags["judge_api_key"]] if flags["judge_api_key"] else []))
    # the folder a run without --out gets is new each time: going on needs its name
    again = "the same command" if flags["out_dir"] else f"the same command with --out {config.out}"
    run_eval(config, settings, again)


class EvalCommand(ShortHelpCommand):
    """eval's help ends with the benchmarks: by name on --help, each with its file and grader on --help-all."""

    def page_epilog(self, shown_all: bool) -> str:
        return benchmark_list() if shown_all else benchmark_names()


def benchmark_names() -> str:
    from nanbeige.evals.benchmarks import describe

    benches = describe()
    names = ", ".join(b["name"] for b in benches if b["grader"] != "bfcl-eval")
    bfcl = [b["name"] for b in benches if b["grader"] == "bfcl-eval"]
    return (
        f"Benchmarks: {names}; BFCL-V4: {bfcl[0]} and its {len(bfcl) - 1} parts (--help-all lists them, and "
        "each benchmark's file and grader)."
    )


def benchmark_list() -> str:
    from nanbeige.evals.benchmarks import describe

    benches = describe()
    files = "; ".join(
        f"{b['name']} ({b['about']}; graded by {b['grader']})" for b in benches if b["grader"] != "bfcl-eval"
    )
    bfcl = ", ".join(b["name"] for b in benches if b["grader"] == "bfcl-eval")
    return (
        f"Benchmarks: {files}. BFCL-V4 through the bfcl-eval package's own handler and evaluation runner, on "
        f"its data: {bfcl}."
    )


def eval_config(bench: Any, flags: dict[str, Any]) -> Any:
    """The eval's config from its flags (the out folder defaults to a new one under runs/)."""
    import datetime
    import os

    from nanbeige.evals.runner import EvalConfig

    data, out_dir = flags["data"], flags["out_dir"]
    if bench.needs_data and data is None:
        fail(f"--data is required: the path of {bench.about}", 2)
    if data is not None and not data.exists():
        fail(f"--data {data}: no such file or folder", 2)
    if out_dir is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out_dir = Path(os.environ.get("NANBEIGE_RUNS_DIR", "runs")) / f"eval-{bench.name}-{stamp}"
    judge = judge_endpoint(
        flags["judge_base_url"], flags["judge_model"], flags["judge_api_key"], flags["judge_template"]
    )
    if flags["request_timeout"] is not None:  # the agent's model has it too (`run_settings`)
        judge = replace(judge, timeout_s=flags["request_timeout"])
    return EvalConfig(
        bench=bench,
        data=data,
        out=out_dir,
        k=flags["k"],
        concurrency=flags["concurrency"],
        limit=flags["limit"],
        grader=flags["grader"],
        judge=judge,
    )


def run_eval(config: Any, settings: Any, again: str = "the same command") -> None:
    """Run the eval with a progress display on stderr; print the report on stdout. `again`: what to run to go
    on where it stopped."""
    from nanbeige.agent.cli.running import notice, resumable, run_command
    from nanbeige.agent.cli.view import RunsView
    from nanbeige.evals.runner import evaluate
    from nanbeige.evals.scores import markdown

    err.print(f"[dim]eval {config.bench.name}: results in {escape(str(config.out))}[/]", highlight=False)

    runs = None
    if config.ray is not None:  # Ray is loaded only then
        from nanbeige.evals.sharded import run_on_ray as runs
    work = evaluate(config, settings, notice, lambda progress: RunsView(err, progress, config.bench.name), runs)
    kept = f"finished runs are kept in {escape(str(config.out))}"
    report = run_command(resumable(work, kept, again=escape(again)))
    print_line(markdown(report))
    if report.get("failed_runs"):
        err.print(
            f"[yellow]{report['failed_runs']} runs failed[/] (model server errors or crashes) and are not "
            f"counted; run {escape(again)} to retry them",
            highlight=False,
        )
        if settings.tools.replay:  # a replay that did not replay every run is not the recorded eval
            failed = report["failed_runs"]
            fail(
                f"{failed} run{'s' * (failed != 1)} could not be replayed; their trajectories in "
                f"{config.out} say which tool call the cache did not hold"
            )


def eval_report(folder: Path | None) -> None:
    """Re-render the report of an eval from its out folder."""
    import json

    from nanbeige.agent.cli.running import notice
    from nanbeige.evals.out_folder import MANIFEST, REPORT, read_manifest, read_results
    from nanbeige.evals.scores import build_report, markdown

    if folder is None:
        fail("`nanbeige eval report` needs the eval's out folder", 2)
    found = read_manifest(folder / MANIFEST)
    rows = [] if str(found.get("bench", "")).startswith("bfcl") else read_results(folder, notice)
    if str(found.get("bench", "")).startswith("bfcl"):
        from nanbeige.evals.bfcl_grading import rerender

        report = rerender(folder)
    else:
        report = build_report(found, rows)
        (folder / REPORT).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print_line(markdown(report))
