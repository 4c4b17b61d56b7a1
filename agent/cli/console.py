"""Where the command line talks to a person: stderr, and one-line errors. Every key the command
knows is replaced by `[REDACTED]` in all it prints (a server's error message may quote the key it
was sent), and control characters from outside (a question, a web page, a tool's output) are shown
escaped (`\\x1b`), never sent raw to the terminal, where they could clear it or retitle it."""

from __future__ import annotations

import re
import sys
from typing import Any, NoReturn

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from nanbeige.agent.trajectory.trajectory_file import redact, usable_secrets

_secrets: list[str] = []


def hide(secrets: list[str]) -> None:
    """Keep these strings (8 characters or more: shorter ones would match ordinary text) out of
    everything printed from now on."""
    spelled = usable_secrets(secrets)
    _secrets[:] = usable_secrets(spelled + [orjson.dumps(s).decode()[1:-1] for s in spelled])  # and as JSON spells it


def visible(text: str) -> str:
    return redact(text, _secrets)


# C0 controls but newline and tab, DEL and C1 controls: what a terminal may act on. ESC starts
# sequences that clear the screen or set the window title; C1's CSI (0x9b) does the same alone.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """The text with every control character written out (`\\x1b`), so a terminal shows it and
    acts on none. Newlines and tabs stay."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def shown(text: Any) -> str:
    """Text from outside (a question, a reply, a tool result, an error), ready to print: the secrets
    taken out first (before any cutting or wrapping could split one), control characters escaped."""
    return printable(visible(text if isinstance(text, str) else str(text)))


def _real_stderr() -> Any:
    """sys.stderr as it is now (tests swap it), but never rich's proxy of it. While a live display
    runs, rich puts a proxy in sys.stderr that prints what others write through our console; writing
    our console's own output to that proxy would feed it back into the console forever (a refresh
    thread spinning between the two while the command waits for it, in every real terminal)."""
    from rich.file_proxy import FileProxy

    stream = sys.stderr
    while isinstance(stream, FileProxy):
        stream = stream.rich_proxied_file
    return stream


class _Stderr:
    """The real stderr (looked up at each write), with the secrets taken out."""

    def write(self, text: str) -> int:
        return _real_stderr().write(visible(text))

    def flush(self) -> None:
        _real_stderr().flush()

    def isatty(self) -> bool:
        return _real_stderr().isatty()

    def fileno(self) -> int:
        return _real_stderr().fileno()


class SafeConsole(Console):
    """A rich Console that takes the secrets out of every string it prints and escapes its control
    characters, before laying it out (control characters are no markup, so markup stays markup).
    What callers format themselves (a path, an exception's text) is covered without their help."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(shown(text), **kwargs)

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        """On a terminal, lines wrapped between words to its width (the terminal's own fold cuts words and the
        paths a note asks to copy); elsewhere (a log, a pipe) each line whole, as written. The secrets are out
        before either: `render_str` takes them out of the text before it is laid out."""
        super().print(*objects, soft_wrap=not self.is_terminal if soft_wrap is None else soft_wrap, **kwargs)


err = SafeConsole(file=_Stderr())  # type: ignore[arg-type]


def out(text: str) -> None:
    """A line on stdout, the secrets taken out and control characters escaped."""
    sys.stdout.write(shown(text) + "\n")


def out_json(value: Any) -> None:
    """A value as one JSON line on stdout, the secrets taken out. JSON already escapes C0 controls;
    DEL and C1 are escaped too (`\\u009b`), which keeps the line valid JSON."""
    text = visible(orjson.dumps(value, default=str).decode())
    sys.stdout.write(CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 turn`, `3 turns`: a count and its noun in agreement."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def error_line(message: str) -> None:
    """`error: ` and the message on stderr: how the program says what the user must fix."""
    err.print(f"[red]error:[/] {escape(shown(message))}", highlight=False)


def fail(message: str, code: int = 1) -> NoReturn:
    error_line(message)
    raise typer.Exit(code)
