"""Where the command line talks to a person: stderr, and one-line errors."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
