"""What every command shares in running: its notices on stderr, its coroutine run with Ctrl-C, SIGTERM,
user-facing errors and bugs each turned into a message and an exit status, and the question it was given."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.markup import escape

from nanbeige.agent.cli.command_group import Commands
from nanbeige.agent.cli.console import err, error_line, fail, shown
from nanbeige.agent.cli.sigterm import exit_on_sigterm
from nanbeige.tools.errors import NanbeigeError

T = TypeVar("T")


class Program(Commands):
    """The program's command group: the one place where a user-facing error (a NanbeigeError) a command lets
    out is said and ends the command with its exit code. A command catches one only to add to its message,
    to give it another exit code or to clean up first."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except NanbeigeError as exc:
            said(exc)
            raise typer.Exit(exc.exit_code) from None


def said(exc: NanbeigeError) -> None:
    """A user-facing error on stderr, its line as `fail` prints one; with NANBEIGE_DEBUG=1 its traceback first."""
    debug_traceback(exc)
    error_line(str(exc))


class Moment:
    """What Ctrl-C would cut short now, for the line that says so where the command itself does not."""

    doing: str | None = None
    """What the command is busy with before its runs begin, while nothing is written ("loading the model");
    None where that is not known (the line then claims nothing)."""
    told = False
    """Whether the command has said itself what the interruption kept (`interrupted`)."""


def interrupted(kept: str, command: str | None = None) -> None:
    """Say that Ctrl-C stopped the command, and what is kept (`kept`: "the trajectory so far is in …"); then the
    `command` that goes on, if any, on a line of its own that is never wrapped between its words (the terminal
    folds it, and a copy of it is the command whole)."""
    err.print(f"[yellow]interrupted[/]; {kept}", highlight=False)
    if command is not None:
        err.print(f"  {command}", highlight=False, soft_wrap=True)
    Moment.told = True


class Notices:
    """The setup's notices on stderr (`notice(text)`); its long wait, the model loading in this process,
    shown as it goes (`waiting`); the notice that search is not set up said once for good, short."""

    def __call__(self, text: str) -> None:
        if text.startswith(SEARCH_NOT_SET_UP) and not first_time("search-off"):
            return
        if text.startswith(SEARCH_NOT_SET_UP):  # `nanbeige doctor` keeps saying it in full
            text = "search is off: set SERPER_API_KEY or SEARXNG_URL, or see `nanbeige doctor` (said once)"
        head, sep, rest = shown(text).partition(": ")
        line = f"[yellow]{escape(head)}:[/] {escape(rest)}" if sep else escape(head)
        err.print(line, highlight=False)

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        from nanbeige.agent.cli.waiting import shown_wait

        before, Moment.doing = Moment.doing, "loading the model"
        with shown_wait(err, what):
            yield
        Moment.doing = before


notice = Notices()
SEARCH_NOT_SET_UP = "search is off: no search backend is configured"


def first_time(what: str) -> bool:
    """True once per user for `what` (a mark left in the user's config folder); True again where the mark
    cannot be left, so nothing is kept quiet that was never said."""
    from nanbeige.agent.user_dirs import config_dir

    mark = config_dir() / "said" / what
    if mark.exists():
        return False
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except OSError:
        pass
    return True


async def resumable(
    work: Awaitable[T],
    kept: str,
    before_error: Callable[[], None] = lambda: None,
    again: str = "the same command",
) -> T:
    """Await a command's resumable work (eval, collect, judge): any error stops `before_error` (a live view)
    before it is said; Ctrl-C first says what is kept (`kept`: "finished runs are
    kept in OUT") and what goes on (`again`: the same command, or with the --out it got by default)."""
    try:
        return await work
    except Exception:
        before_error()
        raise
    except asyncio.CancelledError:
        interrupted(f"{kept}: run {again} to go on")
        raise


def run_command(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine. A user-facing error (a SetupError, ...) goes on to `Program`, which says it;
    Ctrl-C and SIGTERM cancel it, so every open trajectory is closed first, then exit 130 or 143, after a line
    that says what was cut short where the command did not say it. A bug is its message (exit 1), with its
    traceback under NANBEIGE_DEBUG=1."""
    terminated = []

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: terminated.append(task.cancel()))
        return await main

    try:
        return asyncio.run(guarded())
    except NanbeigeError:  # the user's to fix, not a bug: `Program` says it
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):  # the servers' shutdown may re-cancel the task
        if not Moment.told:
            stopped = "stopped (SIGTERM)" if terminated else "interrupted"
            where = f" while {Moment.doing}; nothing was written" if Moment.doing else ""
            err.print(f"[yellow]{stopped}[/]{where}", highlight=False)
        raise typer.Exit(143 if terminated else 130) from None
    except typer.Exit:  # a command's own `fail`: its line is already printed
        raise
    except Exception as exc:
        debug_traceback(exc)
        fail(f"nanbeige crashed: {type(exc).__name__}: {exc} (NANBEIGE_DEBUG=1 shows where; please report it)")
    finally:
        exit_on_sigterm()  # closing the event loop put back the default action, which kills without an exit status


def debug_traceback(exc: BaseException) -> None:
    """With NANBEIGE_DEBUG=1, the exception's traceback on stderr, and that of the one it was raised from
    even where `from None` hid it from the user (keys taken out, as everywhere)."""
    import traceback

    if not os.environ.get("NANBEIGE_DEBUG"):
        return
    exc.__suppress_context__ = False
    err.file.write("".join(traceback.format_exception(exc)))


def question_text(question: str | None, question_file: Path | None) -> str:
    """The question from the argument, stdin (`-`) or --question-file; a usage error when there is none."""
    from nanbeige.agent.cli.question import read_question

    try:
        text, problem = read_question(question, question_file)
    except KeyboardInterrupt:  # waiting for stdin to end
        err.print("[yellow]interrupted[/] while reading the question; nothing was written", highlight=False)
        raise typer.Exit(130) from None
    if problem:
        notice(problem)
    Moment.doing = "starting"  # a question's command (ask, research) writes nothing until its run begins
    return text
