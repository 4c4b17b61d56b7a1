"""The `nanbeige` command line.

    nanbeige ask "question"      run the agent; the answer alone on stdout, the turns on stderr
    nanbeige research "question" the same at length: attempts restarted with a summary, a cited report
    nanbeige resume run.jsonl    continue an interrupted run, in the same file
    nanbeige ask - < q.txt       the question from stdin (or --question-file q.txt)
    nanbeige show run.jsonl      print a saved trajectory readably

Settings come from flags, then environment variables (NANBEIGE_*), then `nanbeige.toml`, then the
defaults of the dataclass configs. The commands only map flags onto those configs; building the
runs is `setup.py`'s, and its `SetupError`, like every user-facing error, becomes a one-line error and an
exit code (`running.Program`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli import (
    cache_commands,
    commands,
    problems_command,
    research_command,
    rl_commands,
    settings_file,
    train_commands,
    trust_command,
)
from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.command_options import RESUME
from nanbeige.agent.cli.console import SafeConsole, err, fail, hide, out, out_json, shown
from nanbeige.agent.cli.help_screen import ShortHelpCommand
from nanbeige.agent.cli.option_tables import with_options, with_run_options
from nanbeige.agent.cli.running import Program, interrupted, notice, question_text, run_command, said
from nanbeige.agent.run.run_config import RunSettings

if TYPE_CHECKING:  # imported lazily at run time so `--help` stays fast
    from nanbeige.agent.trajectory.trajectory import Trajectory

# rich markup named, not left to typer's default: typer 0.16 passes its default on unresolved, and then prints
# the help texts' escaped brackets (`\\[default: ...]`) with their backslashes
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=Program,
    rich_markup_mode="rich",
    help="Agent runtime for deep search and tool use with Nanbeige4.1-3B.",
)


@app.command(cls=ShortHelpCommand)
@with_run_options()
def ask(
    question: o.Question = None,
    question_file: o.QuestionFile = None,
    trajectory: Annotated[
        Path | None,
        typer.Option(help="Trajectory file (JSONL, appended). Default: a new file under runs/.", show_default=False),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the end record as JSON on stdout.")] = False,
    *,
    settings: RunSettings,
) -> None:
    """Research a question with tools; print the answer."""
    from nanbeige.agent.setup.setup import secrets_of

    hide(secrets_of(settings))
    report(run_command(_ask(question_text(question, question_file), settings)), json_output)


async def _ask(question: str, settings: RunSettings, resume_from: Trajectory | None = None) -> Trajectory:
    from nanbeige.agent.cli.view import LiveView
    from nanbeige.agent.run.loop import run
    from nanbeige.agent.setup.setup import ready

    async with ready(settings, notice) as runtime:
        if resume_from is not None:
            from nanbeige.agent.cli.resume import check_unchanged

            check_unchanged(
                resume_from, runtime.llm, runtime.toolbox.tools if runtime.toolbox else [], runtime.agent.reference
            )
        err.print(f"[dim]trajectory: {escape(str(runtime.path))}[/]", highlight=False)
        try:
            streamed = dataclasses.replace(runtime.agent, stream=True)  # a person watches the reply come
            trajectory = await run(
                question,
                runtime.llm,
                runtime.toolbox,
                streamed,
                runtime.writer,
                on_event=LiveView(err, runtime.agent.max_turns),
                resume_from=resume_from,
            )
            if runtime.toolbox is not None and runtime.toolbox.cache is not None:
                err.print(f"[dim]{runtime.toolbox.cache.summary()}[/]", highlight=False)
            return trajectory
        except asyncio.CancelledError:
            interrupted(
                f"the trajectory so far is in {escape(str(runtime.path))}; this goes on with it:",
                f"nanbeige resume {escape(str(runtime.path))}",
            )
            raise
        except Exception:
            err.print(f"[dim]the trajectory, closed as crashed, is in {escape(str(runtime.path))}[/]", highlight=False)
            raise


def report(trajectory: Trajectory, json_output: bool) -> None:
    from nanbeige.agent.trajectory.trajectory_file import end_record

    if json_output:
        out_json(end_record(trajectory))
    elif trajectory.answer is not None:
        out(trajectory.answer)
    err.print(f"[dim]{ending(trajectory)}[/]", highlight=False)
    if trajectory.stop_reason == "write_error":  # the answer, if any, is printed, but the log is not whole
        fail(f"the run stopped: {trajectory.error}; the lines written before are kept")
    if trajectory.answer is None and trajectory.stop_reason == "answered":
        fail(
            "no answer: the model ended the run, but its final reply held no usable answer "
            "(`nanbeige show` shows its replies)"
        )
    if trajectory.answer is None:
        detail = f": {trajectory.error}" if trajectory.error else ""
        fail(f"no answer (stop reason {trajectory.stop_reason}){detail}")


def ending(trajectory: Trajectory) -> str:
    """`answered after 3 turns (1 reply rolled back) in 4.0s`: turns counted as `max_turns` counts them."""
    from nanbeige.agent.trajectory.trajectory import counted_turns, rolled_back_replies

    turns, dropped = counted_turns(trajectory.turns), rolled_back_replies(trajectory.turns)
    reason = (
        trajectory.stop_reason
        if trajectory.answer is not None or trajectory.stop_reason != "answered"
        else "ended without a usable answer"
    )
    return (
        f"{reason} after {turns} turn{'s' * (turns != 1)}"
        + (f" ({dropped} repl{'ies' if dropped != 1 else 'y'} rolled back)" if dropped else "")
        + f" in {trajectory.timings.get('wall_s', 0):.1f}s"
    )


@app.command(cls=ShortHelpCommand)
@with_options(RESUME)
def resume(
    path: Annotated[Path, typer.Argument(help="The trajectory file of the run; the run goes on in it.")],
    *,
    flags: dict[str, Any],
) -> None:
    """Continue a run cut short (killed, Ctrl-C, crashed, model server error) from its last complete turn,
    with its own settings; print the answer. Tool servers and backend flags must be the run's."""
    from nanbeige.agent.cli.resume import check_not_in_use, pick, settings_for
    from nanbeige.agent.run.restore import complete_turns
    from nanbeige.agent.setup.setup import secrets_of
    from nanbeige.agent.trajectory.trajectory import counted_turns

    if flags["replay"] and flags["cache"] is None:
        fail("--replay needs --cache PATH: the cache file to answer tool calls from", 2)
    trajectory = pick(path, flags["trajectory_id"])
    check_not_in_use(path)
    settings = settings_for(trajectory, path, **flags)
    # where tool results come from is given anew, like the tool servers: the start record does not keep it
    settings.tools.cache, settings.tools.replay = flags["cache"], flags["replay"]
    hide(secrets_of(settings))
    kept = counted_turns(trajectory.turns[: complete_turns(trajectory.turns)])  # counted as max_turns counts
    err.print(
        f"[dim]resuming trajectory {trajectory.id} after {kept} turn{'s' * (kept != 1)} "
        f"({trajectory.stop_reason or 'no end record'})[/]",
        highlight=False,
    )
    report(run_command(_ask(trajectory.question, settings, resume_from=trajectory)), flags["json_output"])


@app.command("show")
def show_command(
    path: Annotated[Path, typer.Argument(help="A trajectory file (JSONL).")],
    full: Annotated[bool, typer.Option(help="Show reasoning and tool results in full.")] = False,
) -> None:
    """Print a saved trajectory readably."""
    from nanbeige.agent.cli.view import show, show_total
    from nanbeige.agent.trajectory.trajectory_file import load_trajectories

    try:
        trajectories = load_trajectories(path, warn=lambda text: notice(f"warning: {text}"))
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"{exc}: is this a trajectory file?")
    if not trajectories:
        fail(f"{path} holds no trajectory")
    out = SafeConsole()
    for trajectory in trajectories:
        show(out, trajectory, full=full)
    if len(trajectories) > 1:
        show_total(out, trajectories)


@app.command()
def doctor(
    ctx: typer.Context,
    base_url: o.flag("base_url") = None,
    model: o.flag("model") = LLMConfig.model,
    api_key: o.flag("api_key") = None,
) -> None:
    """Say what a run would use here (settings files, model, search, scrape, sandbox, keys), each with its fix
    when missing. Exit 1 when no model can be had."""
    from nanbeige.agent.cli.doctor import check_settings_files, findings

    hide([api_key] if api_key else [])
    files = ctx.obj if isinstance(ctx.obj, settings_file.Found) else settings_file.find()
    urls = base_url or [LLMConfig.base_url]
    found = [check_settings_files(files), *findings(urls, model, api_key)]
    screen = SafeConsole()
    for finding in found:
        mark = "[green]✓[/]" if finding.ok else "[red]✗[/]"
        screen.print(f"{mark} [bold]{finding.part}[/]: {escape(shown(finding.found))}", highlight=False)
        if finding.fix:
            screen.print(
                f"    [dim]{'fix' if not finding.ok else 'tip'}: {escape(shown(finding.fix))}[/]", highlight=False
            )
    if not all(finding.ok for finding in found[1 : len(urls) + 1]):  # the model, at each endpoint of a pool
        raise typer.Exit(1)


def version(value: bool) -> None:
    if value:
        from importlib.metadata import version as installed

        out(f"nanbeige {installed('nanbeige')}")
        raise typer.Exit()


@app.callback()
def options(
    show_version: Annotated[
        bool, typer.Option("--version", callback=version, is_eager=True, help="Print the version and exit.")
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="A settings file to use (before the command), besides your own.", show_default=False
        ),
    ] = None,
) -> None:
    """Agent runtime for deep search and tool use with Nanbeige4.1-3B."""


app.command("research", cls=ShortHelpCommand)(research_command.research_command)
app.command("serve", cls=ShortHelpCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    commands.serve
)
app.command("server")(commands.server)
app.add_typer(commands.index_app, name="index")
app.add_typer(commands.reference_app, name="reference")
app.add_typer(cache_commands.cache_app, name="cache")
app.command("eval", cls=commands.EvalCommand)(commands.evaluate)
app.command("collect", cls=ShortHelpCommand)(rl_commands.collect)
app.command("judge", cls=ShortHelpCommand)(rl_commands.judge)
app.command("synth")(rl_commands.synth)
app.command("problems")(problems_command.problems)
app.command("trust")(trust_command.trust_command)
# `train` trains; `train report RUN_DIR` draws a run's curves
app.add_typer(train_commands.train_app, name="train")
app.command("loop", cls=ShortHelpCommand)(train_commands.loop)
# The command list shows each command's first paragraph as one line: left to itself it keeps the docstring's
# line breaks, which cut the list's descriptions mid-sentence.
for _command in app.registered_commands:
    if _command.short_help is None and _command.callback is not None:
        _command.short_help = " ".join(inspect.cleandoc(_command.callback.__doc__ or "").split("\n\n")[0].split())


def main() -> None:
    named, args = named_config(sys.argv[1:])
    try:
        found = settings_file.find(named)
        defaults = settings_file.default_map(app, found)
    except settings_file.SettingsError as exc:  # before the app runs, so before its handler (`Program`)
        said(exc)
        sys.exit(exc.exit_code)
    if args[:1] != ["trust"]:
        for _, why in found.ignored:
            err.print(f"[yellow]{escape(shown(why))}[/]", highlight=False)
    app(args, default_map=defaults, obj=found)


def named_config(args: list[str]) -> tuple[Path | None, list[str]]:
    """`--config PATH` given before the command (read here: the settings must be known before the command's
    flags are), and the arguments without it."""
    for index, arg in enumerate(args):
        if not arg.startswith("-"):  # the command's name: what follows is the command's own
            break
        if arg == "--config" and index + 1 < len(args):
            return Path(args[index + 1]), args[:index] + args[index + 2 :]
        if arg.startswith("--config="):
            return Path(arg.removeprefix("--config=")), args[:index] + args[index + 1 :]
    return None, args


if __name__ == "__main__":
    main()
