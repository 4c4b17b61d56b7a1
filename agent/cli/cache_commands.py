"""`nanbeige cache accept PATH`: serve a tool-result cache made by someone else, or on another machine.

Each row of a cache is signed with the key of the user who recorded it (in their own config folder), and
a row that this user's key did not sign is not served: a file handed over could otherwise put any words
in the tools' mouths. Accepting a file signs its rows with this user's key, once, by their choice."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from nanbeige.agent.cli.console import err

cache_app = typer.Typer(no_args_is_help=True, help="Accept a tool-result cache (--cache) made elsewhere.")


@cache_app.command("accept")
def cache_accept(
    path: Annotated[Path, typer.Argument(help="The cache file (SQLite) someone handed over.")],
) -> None:
    """Trust a cache made by someone else or on another machine: its rows are signed with your key.

    The file is then trusted as a recording of what its maker's tools answered: --cache and --replay serve
    its rows (each still only to the server, and the version of it and of its tool, it was recorded from)."""
    from nanbeige.agent.toolbox.cache import accept

    signed, malformed = accept(path)
    left = f"; {malformed} malformed row{'s' * (malformed != 1)} left unsigned (never served)" if malformed else ""
    err.print(
        f"accepted {escape(str(path))}: {signed} row{'s' * (signed != 1)} signed with your key{left}",
        highlight=False,
    )
