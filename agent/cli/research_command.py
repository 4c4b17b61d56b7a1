"""The `nanbeige research` command: its flags, the research run in the terminal (its live view, Ctrl-C),
and the report with cited sources it writes. The attempts themselves, and the notes between them, are
research.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import webbrowser
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape

from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.console import counted, err, fail, hide, out, visible
from nanbeige.agent.cli.option_tables import with_run_options
from nanbeige.agent.cli.ranges import bounds
from nanbeige.agent.cli.research import ATTEMPTS, MAX_TURNS, Research, research
from nanbeige.agent.run.loop import Event
from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.trajectory.trajectory_file import end_record, load_trajectories

ResearchMaxTurns = Annotated[
    int,
    typer.Option(
        **bounds("max_turns"), help="Most model turns per attempt before the answer is asked for (both dialects)."
    ),
]
Attempts = Annotated[
    int,
    typer.Option(
        min=1, help="Most attempts: one that ends without an answer is summarised and the next starts from its notes."
    ),
]
ReportPath = Annotated[
    Path | None,
    typer.Option(
        "--report",
        show_default=False,
        help=("Write a report with cited sources: markdown, or HTML for a path ending in .html."),
    ),
]
OpenReport = Annotated[
    bool,
    typer.Option(
        "--open",
        help="Open the report in a browser (a markdown report gets an HTML copy beside it, same name ending in .html).",
    ),
]
ResearchTimeout = Annotated[
    float | None,
    typer.Option(
        help="Wall-clock limit for the whole research, all attempts together, in seconds.",
        rich_help_panel=o.ADVANCED,
        show_default=False,
    ),
]
ResearchTrajectory = Annotated[
    Path | None,
    typer.Option(
        help="Trajectory file (JSONL, appended; every attempt goes in it). Default: a new file under runs/.",
        show_default=False,
    ),
]
JsonOutput = Annotated[
    bool, typer.Option("--json", help="Print the answer and every attempt's end record as JSON on stdout.")
]


@with_run_options(leave_out=("tokenizer",))
def research_command(
    question: o.Question = None,
    question_file: o.QuestionFile = None,
    attempts: Attempts = ATTEMPTS,
    report: ReportPath = None,
    open_report: OpenReport = False,
    max_turns: ResearchMaxTurns = MAX_TURNS,
    trajectory: ResearchTrajectory = None,
    json_output: JsonOutput = False,
    timeout: ResearchTimeout = None,
    *,
    settings: RunSettings,
) -> None:
    """Research a question at length (600 turns an attempt; an attempt that ends without an answer
    is summarised and the next starts from its notes); print the answer, optionally write a cited report."""
    from nanbeige.agent.cli.running import question_text, run_command
    from nanbeige.agent.setup.setup import secrets_of

    hide(secrets_of(settings))
    if open_report and report is None:
        fail("--open opens the report: pass --report PATH too", 2)
    if report is not None:
        check_report_path(report, trajectory)
    question = question_text(question, question_file)
    result, path = run_command(_research(question, settings, attempts))
    answer = result.answer
    if json_output:
        out(
            orjson.dumps(
                {
                    "question": question,
                    "answer": answer,
                    "trajectory": str(path),
                    "attempts": [end_record(t) for t in result.attempts],
                }
            ).decode()
        )
    elif answer is not None:
        out(answer)
    turns = sum(len(t.turns) for t in result.attempts)
    wall = sum(t.timings.get("wall_s", 0.0) for t in result.attempts)
    err.print(
        f"[dim]{result.attempts[-1].stop_reason} after {counted(len(result.attempts), 'attempt')}, "
        f"{counted(turns, 'turn')} in {wall:.1f}s[/]",
        highlight=False,
    )
    if report is not None:
        write_report(report, result, path, open_report)
    if answer is None:
        fail(
            f"no answer after {len(result.attempts)} attempt{'s' * (len(result.attempts) != 1)} "
            f"(last stop reason {result.attempts[-1].stop_reason})"
        )


async def _research(question: str, settings: RunSettings, attempts: int) -> tuple[Research, Path]:
    from nanbeige.agent.cli.running import interrupted, notice
    from nanbeige.agent.cli.view import LiveView
    from nanbeige.agent.setup.setup import ready

    async with ready(settings, notice) as runtime:
        err.print(f"[dim]trajectory: {escape(str(runtime.path))}[/]", highlight=False)

        def view(number: int) -> Event:
            if number > 1:
                err.print(f"[bold]attempt {number} of {attempts}[/]", highlight=False)
            return LiveView(err, runtime.agent.max_turns or MAX_TURNS)

        try:
            streamed = dataclasses.replace(runtime.agent, stream=True)  # a person watches the reply come
            result = await research(
                question, runtime.llm, runtime.toolbox, streamed, runtime.writer, attempts, view, notice
            )
        except asyncio.CancelledError:
            interrupted(f"the trajectories so far are in {escape(str(runtime.path))}")
            raise
        except Exception:
            err.print(f"[dim]the trajectory, closed as crashed, is in {escape(str(runtime.path))}[/]", highlight=False)
            raise
        return result, runtime.path


def check_report_path(path: Path, trajectory: Path | None) -> None:
    """That the report can be written, checked before hours of research rather than after, and would
    overwrite nothing the run needs."""
    try:
        if path.is_dir():
            fail(f"--report {path} is a folder; pass a file path", 2)
        if path.exists() and not path.is_file():
            fail(f"--report {path} is not a regular file (a FIFO, socket or device); pass a file path", 2)
        if trajectory is not None and path.resolve() == trajectory.resolve():
            fail(f"--report {path} is the trajectory file; pass another path", 2)
    except OSError as exc:  # even looking fails: a name over 255 bytes, a folder that cannot be read
        fail(f"cannot write the report to {path}: {exc.strerror or exc}", 2)
    from nanbeige.agent.trajectory.writable import unwritable

    problem = unwritable(path)
    if problem:
        fail(f"cannot write the report to {path}: {problem}", 2)


def write_report(path: Path, result: Research, trajectory_file: Path, open_it: bool) -> None:
    """Write the report (HTML for a .html path, else markdown), and open it in a browser when asked."""
    from nanbeige.agent.cli import research_report as report

    # the attempts as written: the run let go of tool results the model no longer saw, the file has them all
    ids = {t.id for t in result.attempts}
    try:
        written = {t.id: t for t in load_trajectories(trajectory_file, warn=lambda text: None) if t.id in ids}
    except (OSError, ValueError):  # gone or unreadable since: the report makes do with what is in memory
        written = {}
    attempts = [written.get(t.id, t) for t in result.attempts]
    content = report.build(result.question, attempts, result.answer, str(trajectory_file))
    is_html = path.suffix.lower() in (".html", ".htm")
    page = path if is_html or not open_it else path.with_suffix(".html")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the keys the run knows are taken out, as from every other output
        path.write_text(visible(report.to_html(content) if is_html else report.to_markdown(content)), encoding="utf-8")
        if page != path:
            page.write_text(visible(report.to_html(content)), encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write the report to {path}: {exc.strerror or exc} (the trajectories are in {trajectory_file})")
    err.print(
        f"[dim]report: {escape(str(path))}" + (f" and {escape(str(page))}" if page != path else "") + "[/]",
        highlight=False,
    )
    if open_it and not webbrowser.open(page.resolve().as_uri()):
        err.print(f"[yellow]no browser could be opened[/]; the report is {escape(str(page))}", highlight=False)
