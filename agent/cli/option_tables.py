"""How a command takes its flags from a table (name -> (the flag, its default)) rather than from fifty
parameters: `with_options` for a table of its own, `with_run_options` for the run flags of options.py too. Typer
reads the signature made here; the command reads its values from one dict."""

from __future__ import annotations

import copy
import enum
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

from nanbeige.agent.cli.options import RUN_OPTIONS, run_settings


def with_run_options(
    table: dict[str, tuple[Any, Any]] | None = None, leave_out: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that takes its own parameters, then the flags of its own `table` (as `with_options`), then
    every flag of `RUN_OPTIONS` but `leave_out` and those it declares itself (research's own `--max-turns`,
    eval's own `--temperature`). It is called with its own values, `flags` (the table's values by name) if it
    takes them, and `settings`, the RunSettings all of them make (its own values of run settings, such as
    `--trajectory`, included). Typer reads the command's parameters from the signature made here."""
    table = table or {}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        mine = [p for p in own.parameters.values() if p.name not in ("flags", "settings")]
        added = table | {
            name: flag
            for name, flag in RUN_OPTIONS.items()
            if name not in leave_out and name not in own.parameters and name not in table
        }

        @functools.wraps(command)
        def with_settings(**values: Any) -> Any:
            given = {p.name: values[p.name] for p in mine}
            if "flags" in own.parameters:
                given["flags"] = {name: plain(values[name]) for name in table}
            return command(**given, settings=run_settings(values))

        return declared(with_settings, own, mine, added)

    return decorate


def with_options(table: dict[str, tuple[Any, Any]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that takes every flag of `table` (name -> (the flag, its default)) after its own parameters,
    and is called with its own values and `flags`, the table's values by name: a choice's as its plain text,
    so that the configs it fills hold the same strings as ever. This keeps a command of fifty flags a short
    function: its flags are a table, its body reads them from one dict."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        mine = [p for p in own.parameters.values() if p.name != "flags"]

        @functools.wraps(command)
        def with_flags(**values: Any) -> Any:
            flags = {name: plain(values[name]) for name in table}
            return command(**{p.name: values[p.name] for p in mine}, flags=flags)

        return declared(with_flags, own, mine, table)

    return decorate


def declared(
    wrapper: Callable[..., Any],
    own: inspect.Signature,
    mine: list[inspect.Parameter],
    table: dict[str, tuple[Any, Any]],
) -> Callable[..., Any]:
    """`wrapper` given the signature Typer reads its options from: the command's own parameters, then the
    table's flags."""
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=flag)
        for name, (flag, default) in table.items()
    ]
    parameters = mine + added
    wrapper.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": own.return_annotation}
    return wrapper


def plain(value: Any) -> Any:
    """A choice's value as its text (`Sync.lora` -> "lora"); any other value as it is."""
    return value.value if isinstance(value, enum.Enum) else value


def in_panel(table: dict[str, tuple[Any, Any]], panel: str) -> dict[str, tuple[Any, Any]]:
    """An option table's rows shown in the help page's `panel`, for a command that lists another's flags
    among its own (the loop lists judge's critic flags in its Loop panel)."""
    shown = {}
    for name, (flag, default) in table.items():
        kind, info = typing.get_args(flag)
        info = copy.copy(info)
        info.rich_help_panel = panel
        shown[name] = (Annotated[kind, info], default)
    return shown
