"""Where the command line talks to a person: stderr, and one-line errors. Every key the command
knows is replaced by `[REDACTED]` in all it prints (a server's error message may quote the key it
was sent)."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from nanbeige.agent.trajectory import redact

_secrets: list[str] = []


def hide(secrets: list[str]) -> None:
    """Keep these strings (8 characters or more: shorter ones would match ordinary text) out of
    everything printed from now on."""
    _secrets[:] = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)


def visible(text: str) -> str:
    return redact(text, _secrets)


class _Stderr:
    """sys.stderr (looked up at each write, as tests swap it), with the secrets taken out."""

    def write(self, text: str) -> int:
        return sys.stderr.write(visible(text))

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    def fileno(self) -> int:
        return sys.stderr.fileno()


err = Console(file=_Stderr())  # type: ignore[arg-type]


def out(text: str) -> None:
    """A line on stdout, the secrets taken out."""
    sys.stdout.write(visible(text) + "\n")


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
