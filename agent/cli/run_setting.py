"""The shape of a run setting's one declaration (`options.RUN` holds them): its flag, and the field of
`RunSettings` it fills."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from nanbeige.agent.cli.ranges import RANGES, bounds


@dataclass(frozen=True)
class RunSetting:
    """One run setting: its flag, and the field of `RunSettings` it fills."""

    name: str
    """The flag's name with underscores (`max_turns`: `--max-turns`), the settings file's key (with dashes too)
    and the Python API's keyword."""
    fills: str
    """The field it sets: `part.field` of `RunSettings` (`llm.temperature`), or a field of its own (`reference`)."""
    kind: Any
    """The flag's type as Typer reads it; `X | None` where unset leaves it to the dialect or the server."""
    default: Any
    """The flag's default, which a command that does not take the flag runs with too."""
    help: str
    """The flag's help text."""
    flags: tuple[str, ...] = ()
    """The flag's spellings, where not `--name` (`--summary-turn/--no-summary-turn`)."""
    envvar: str | None = None
    """The environment variable that sets it, if any."""
    panel: str | None = None
    """The help page's panel (`Advanced`), or None for the main one."""
    show_default: bool = True
    """Whether the help shows the default (False where the help says it in words, or it is None)."""
    to_field: Callable[[Any], Any] | None = None
    """The field's value from the flag's, where they differ (`--no-default-servers` -> `default_servers`)."""
    api_kind: type | None = None
    """The type the Python API checks an override against, where not the flag's type without None (a list of
    flags' values is `list`)."""

    def option(self) -> tuple[Any, Any]:
        """The Typer option and its default, as an option table's row."""
        settings: dict[str, Any] = {"help": self.help}
        if self.envvar:
            settings["envvar"] = self.envvar
        if self.panel:
            settings["rich_help_panel"] = self.panel
        if not self.show_default:
            settings["show_default"] = False
        if self.name in RANGES:
            settings |= bounds(self.name)
        return Annotated[self.kind, typer.Option(*self.flags, **settings)], self.default

    def part_and_field(self) -> tuple[str | None, str]:
        """`("llm", "temperature")`, or `(None, "reference")` for a field of `RunSettings` itself."""
        part, _, field = self.fills.rpartition(".")
        return part or None, field
