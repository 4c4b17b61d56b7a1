"""The `nanbeige` commands around the agent: `serve` (vLLM), `server` (a built-in MCP tool server) and
`index` (the local search index). Registered on the app in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from nanbeige.agent.console import err, fail
from nanbeige.agent.serve import ServeConfig


def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Model id or folder.")] = ServeConfig.model,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = ServeConfig.host,
    port: Annotated[int, typer.Option(min=1, max=65535)] = ServeConfig.port,
    dialect: Annotated[str, typer.Option(help="mcp-xml (no tool parser) or tool-call (hermes parser).")
                       ] = ServeConfig.dialect,
    max_model_len: Annotated[int, typer.Option(min=1024, help="Context length.")] = ServeConfig.max_model_len,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.05, max=1.0)] = ServeConfig.gpu_memory_utilization,
    data_parallel_size: Annotated[int, typer.Option("--data-parallel-size", "-dp", min=1)
                                  ] = ServeConfig.data_parallel_size,
    chat_template: Annotated[Path | None, typer.Option(help="Chat template: a .jinja file, or a tokenizer config "
                                                            "JSON whose chat_template is used.",
                                                       show_default=False)] = None,
    rl_logprobs: Annotated[bool, typer.Option(help="Report processed logprobs, for RL rollouts.")] = False,
    no_prefix_caching: Annotated[bool, typer.Option(help="Turn prefix caching off.")] = False,
) -> None:
    """Start vLLM's OpenAI-compatible server for the model and wait until it answers. Arguments after `--`
    go to vLLM unchanged."""
    from nanbeige.agent.serve import check_vllm_available
    from nanbeige.agent.serve import serve as serve_vllm

    config = ServeConfig(model=model, host=host, port=port, dialect=dialect, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization, data_parallel_size=data_parallel_size,
                         chat_template=chat_template, rl_logprobs=rl_logprobs,
                         enable_prefix_caching=not no_prefix_caching, extra_args=list(ctx.args))
    problem = check_vllm_available(config)
    if problem:
        fail(problem)
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


index_app = typer.Typer(no_args_is_help=True, help="Build and query the local search index.")


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
    # Unreadable files last, so that they sit right above the error line that counts them.
    for label, reasons in (("[yellow]skipped[/]", stats.skipped), ("[red]unreadable[/]", stats.unreadable)):
        for reason in reasons[:20]:
            err.print(f"{label} {escape(reason)}", highlight=False)
        if len(reasons) > 20:
            err.print(f"{label} ... and {len(reasons) - 20} more", highlight=False)
    if stats.unreadable:
        # The index is written and usable, but what the user asked for is not all in it: say so, exit 1.
        fail(f"{len(stats.unreadable)} of {stats.files} files could not be read (listed above); "
             "the index holds the rest")


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
