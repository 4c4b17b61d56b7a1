"""What every command shares in running: its notices on stderr, its coroutine run with Ctrl-C, SIGTERM,
setup errors and bugs each turned into one line and an exit status, and the question it was given."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.markup import escape

from nanbeige.agent.cli.console import err, fail, shown
from nanbeige.agent.cli.sigterm import exit_on_sigterm

T = TypeVar("T")


def notice(text: str) -> None:
    head, sep, rest = shown(text).partition(": ")
    line = f"[yellow]{escape(head)}:[/] {escape(rest)}" if sep else escape(head)
    err.print(line, highlight=False, soft_wrap=True)


async def resumable(work: Awaitable[T], errors: type[Exception], kept: str,
                    before_error: Callable[[], None] = lambda: None) -> T:
    """Await a command's resumable work (eval, collect, judge): an error the user must fix (`errors`) is one
    line and exit 1, after `before_error` (a live view's stop); Ctrl-C first says what is kept (`kept`: "finished
    runs are kept in OUT") and that the same command goes on."""
    try:
        return await work
    except errors as exc:
        before_error()
        fail(str(exc))
    except asyncio.CancelledError:
        err.print(f"[yellow]interrupted[/]; {kept}: run the same command to go on", highlight=False)
        raise


def run_command(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine. A SetupError is one line and exit 1 (2 for a bad value); Ctrl-C
    and SIGTERM cancel it, so every open trajectory is closed first, then exit 130 or 143. A bug is
    one line too (exit 1), its traceback shown only with NANBEIGE_DEBUG=1."""
    from nanbeige.agent.setup import SetupError

    terminated = []

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: terminated.append(task.cancel()))
        return await main

    try:
        return asyncio.run(guarded())
    except SetupError as exc:
        fail(str(exc), 2 if exc.usage else 1)
    except (KeyboardInterrupt, asyncio.CancelledError):  # the servers' shutdown may re-cancel the task
        raise typer.Exit(143 if terminated else 130) from None
    except typer.Exit:  # a command's own `fail`: its line is already printed
        raise
    except Exception as exc:
        if os.environ.get("NANBEIGE_DEBUG"):
            raise
        fail(f"nanbeige crashed: {type(exc).__name__}: {exc} (NANBEIGE_DEBUG=1 shows where; please report it)")
    finally:
        exit_on_sigterm()  # closing the event loop put back the default action, which kills without an exit status


def question_text(question: str | None, question_file: Path | None) -> str:
    """The question from the argument, stdin (`-`) or --question-file; a usage error when there is none."""
    from nanbeige.agent.cli.question import QuestionError, read_question

    try:
        text, problem = read_question(question, question_file)
    except QuestionError as exc:
        fail(str(exc), 2)
    if problem:
        notice(problem)
    return text
