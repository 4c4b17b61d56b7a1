"""A long wait before a run can begin (the model loading in this process: tens of seconds) shown as it
goes: in a terminal one line with the seconds so far, redrawn, then replaced by how long it took; where
stderr is no terminal (a log file, a pipe) a plain line when it starts and one when it ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape

from nanbeige.agent.cli.view import clear_of_the_edge, elapsed


@contextmanager
def shown_wait(console: Console, what: str) -> Iterator[None]:
    """`what` ("loading SmolLM2-135M-Instruct in this process") while the block runs; `what: done in 25s`
    once it ended well. A failure or Ctrl-C leaves no end line: the line that says so follows."""
    started = time.monotonic()
    live = None
    if console.is_terminal:
        from rich.live import Live
        from rich.text import Text

        def line() -> object:
            text = Text.from_markup(f"[dim]{escape(what)} … {elapsed(time.monotonic() - started)}[/]")
            return clear_of_the_edge(console, text)

        live = Live(console=console, get_renderable=line, refresh_per_second=4, transient=True)
        live.start()
    else:
        console.print(f"[dim]{escape(what)} …[/]", highlight=False)
    try:
        yield
    finally:
        if live is not None:
            live.stop()
    console.print(f"[dim]{escape(what)}: done in {elapsed(time.monotonic() - started)}[/]", highlight=False)
