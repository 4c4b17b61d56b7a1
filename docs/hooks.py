"""MkDocs hook, and the writer of the configuration page's option reference.

The option reference on docs/configuration.md is written from the command line itself: the real command tree
(`typer.main.get_command(app)`, a click group) is walked, and every command's every option is written out: its
names, type, default, environment variable and help text, the options `--help` hides included, with the
`nanbeige.toml` key that sets it. It is committed, so that the page reads whole on GitHub too, and kept equal
to the program by tests/test_docs_site.py; after changing an option, write it again:

    python docs/hooks.py

On every page, a table cell's code span may write a pipe as GitHub wants it (see `table_pipes`).
"""

from __future__ import annotations

import copy
import html
import inspect
import re
from pathlib import Path
from typing import Any

PAGE = Path(__file__).with_name("configuration.md")
BEGIN = "<!-- the option reference, written by `python docs/hooks.py` from the command line: do not edit -->"
END = "<!-- the end of the option reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return table_pipes(markdown)


def committed_reference(page: str) -> str:
    """The option reference as the page holds it, between its two markers."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"docs/configuration.md has lost a marker of its option reference: {BEGIN} ... {END}")
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write_reference() -> None:
    """Write the option reference into docs/configuration.md, between its markers."""
    page = PAGE.read_text(encoding="utf-8")
    committed_reference(page)  # both markers are there
    head, rest = page.split(BEGIN, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{reference()}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")


def table_pipes(markdown: str) -> str:
    """A table cell's code span writes a pipe as `\\|` so that GitHub keeps the cell whole; Python-Markdown
    already ignores pipes inside code spans and would show the backslash."""

    def unescaped(row: re.Match[str]) -> str:
        return re.sub(r"`[^`]+`", lambda span: span.group(0).replace("\\|", "|"), row.group(0))

    return re.sub(r"^\|.*$", unescaped, markdown, flags=re.M)


def reference() -> str:
    import typer

    from nanbeige.agent.cli.program import app

    root = typer.main.get_command(app)
    lines: list[str] = []
    for path, command, parent in commands(root, "nanbeige"):
        lines += section(path, command, parent)
    return "\n".join(lines)


def commands(command: Any, path: str, parent: Any = None) -> list[tuple[str, Any, Any]]:
    """The command and every command under it, in the order the program lists them."""
    found = [(path, command, parent)]
    for name, sub in getattr(command, "commands", {}).items():
        found += commands(sub, f"{path} {name}", command)
    return found


def section(path: str, command: Any, parent: Any) -> list[str]:
    import typer

    ctx = typer.Context(command, info_name=path)
    lines = [f"### `{path}`", ""]
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(command.help or "")):
        if paragraph.strip() and paragraph.strip() != "\b":
            lines += [text(paragraph.replace("\b", "")), ""]
    options = [param for param in command.params if param.param_type_name == "option"]
    arguments = [param for param in command.params if param.param_type_name == "argument"]
    table = path.split(" ", 1)[1].replace(" ", ".") if " " in path else ""
    if parent is None:
        lines += ["These go before the command (`nanbeige --config PATH COMMAND ...`); they are not settings.", ""]
    elif getattr(command, "commands", None):
        tables = ", ".join(f"`[{table}.{name}]`" for name in command.commands)
        if options:
            lines += [
                f"Settings: a top-level key, or the same key in the `[{table}]` table (which wins); its "
                f"commands' settings go in their own tables: {tables}.",
                "",
            ]
    elif options:
        lines += [f"Settings: a top-level key, or the same key in the `[{table}]` table (which wins).", ""]
    for argument in arguments:
        names, help_text = record(argument, ctx)
        lines.append(f"- argument `{names}`" + (f": {text(help_text)}" if help_text else ""))
    for option in options:
        names, help_text = record(option, ctx)
        entry = f"- `{names}`" + (f": {text(help_text)}" if help_text else "")
        if option.hidden:
            entry += " *(hidden from `--help`)*"
        if parent is not None and not getattr(command, "commands", None) and option.expose_value:
            entry += f" Setting: `{setting_key(option)}`."
        lines.append(entry)
    if not arguments and not options:
        lines.append("No options of its own.")
    return lines + [""]


def record(param: Any, ctx: Any) -> tuple[str, str]:
    """What `--help` prints for the parameter (names and type; help with default and environment variable),
    for a hidden one too."""
    shown = copy.copy(param)
    shown.hidden = False
    try:
        found = shown.get_help_record(ctx)
    except (AttributeError, TypeError):
        found = None
    if found:
        return found[0], found[1]
    names = ", ".join([*param.opts, *getattr(param, "secondary_opts", [])]) or str(param.name).upper()
    return names, getattr(param, "help", None) or ""


def setting_key(option: Any) -> str:
    """The `nanbeige.toml` key: the long flag's name with underscores (agent/cli/settings_file.py)."""
    long = next((name for name in option.opts if name.startswith("--")), None)
    return long.lstrip("-").replace("-", "_") if long else option.name


def text(raw: str) -> str:
    """Help text as Markdown: one line, code spans kept, everything else shown as written."""
    raw = " ".join(raw.replace("\\[", "[").split())
    pieces = re.split(r"(`[^`]+`)", raw)
    return "".join(
        piece
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1
        else re.sub(r"([\\`*_\[\]])", r"\\\1", html.escape(piece, quote=False))
        for piece in pieces
    )


if __name__ == "__main__":
    write_reference()
