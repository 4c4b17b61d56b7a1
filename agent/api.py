"""The runtime from Python: one answer, or many runs at once, with what `nanbeige ask` would use.

    from nanbeige.agent import ask
    trajectory = ask("What is the capital of Mongolia?", base_url="http://127.0.0.1:8000/v1")
    print(trajectory.answer, trajectory.stop_reason)

`ask` / `ask_async` run one question; `ask_many` / `ask_many_async` run a list of questions concurrently
over one setup (one model client, one toolbox, one trajectory file), as `nanbeige eval` and `collect` do.
Each returns the finished `Trajectory` (answer, stop reason, turns with their tool calls and results),
also written to the trajectory file as `nanbeige ask` writes it. The sync forms are for scripts; inside a
running event loop (an async function, a Jupyter notebook) `await` the async ones.

Settings: `settings=None` resolves as `nanbeige ask` with no flags does (NANBEIGE_* environment,
`nanbeige.toml`, then the defaults; the dialect fills in sampling and turn limits); a `RunSettings` passed
is used as given. `**overrides` set single settings on top, by the names of `ask`'s flags (`base_url`,
`max_turns`, `no_default_servers`, ... : `OVERRIDES`), each a TypeError when of another type and a
ValueError when outside the range its flag takes (`max_turns=-1`, `temperature=float("nan")`; the ranges
are `nanbeige.agent.cli.ranges.RANGES`, the flags' own). What the user must fix raises `SetupError`, whose
message names the fix; the setup's notices (search off, the model run in this process) are logged as
warnings on the `nanbeige` logger, which prints them on stderr unless logging is set up otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import logging
import os
import sys
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli.options import RUN
from nanbeige.agent.cli.ranges import RANGES, range_problem
from nanbeige.agent.cli.run_setting import RunSetting
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.setup.setup import Ready, ready, secrets_of
from nanbeige.agent.setup.setup_checks import SetupError
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import redact, usable_secrets

__all__ = [
    "ask",
    "ask_async",
    "ask_many",
    "ask_many_async",
    "RunSettings",
    "LLMConfig",
    "AgentConfig",
    "BackendConfig",
    "ToolsConfig",
    "Trajectory",
    "SetupError",
    "OVERRIDES",
]

DEFAULT_CONCURRENCY = 4  # as `nanbeige eval --concurrency`
log = logging.getLogger("nanbeige")


def _api_kind(setting: RunSetting) -> type:
    """The type an override of the setting is checked against: the flag's, less None (a repeatable flag's
    values: `list`), where the declaration names none of its own."""
    if setting.api_kind is not None:
        return setting.api_kind
    kinds = [kind for kind in typing.get_args(setting.kind) or (setting.kind,) if kind is not type(None)]
    return typing.get_origin(kinds[0]) or kinds[0]


OVERRIDES: dict[str, tuple[str | None, str, type]] = {
    name: (*setting.part_and_field(), _api_kind(setting)) for name, setting in RUN.items()
} | {"trajectory": (None, "trajectory", Path)}
"""The settings `**overrides` may name: `nanbeige ask`'s flags (as `nanbeige.toml` spells them; the run
settings of `cli/options.RUN`, and --trajectory) -> the part of `RunSettings` (None: its own field), the
field, and the type of value. `base_url` may be a list too (a pool of endpoints serving the model, `route`
saying how runs keep to them); `budget` a dict, `{"tokens": 100000}`, or `["tokens=100000"]`; `mcp` one
"NAME=COMMAND" or "NAME=URL" or a list of them. A `RunSettings` reaches the rest."""


def ask(question: str, settings: RunSettings | None = None, **overrides: Any) -> Trajectory:
    """Answer one question and return its trajectory (`.answer` is None when the run found none: its
    `.stop_reason` and `.error` say why). For scripts; inside an event loop, `await ask_async(...)`."""
    _no_running_loop("ask", "ask_async")
    return asyncio.run(ask_async(question, settings, **overrides))


async def ask_async(question: str, settings: RunSettings | None = None, **overrides: Any) -> Trajectory:
    """`ask` for async code. A run that crashes (a bug, a broken connection) raises, as in `nanbeige ask`;
    its trajectory is closed as `crashed` in the file first."""
    text = _question(question, "question")
    settings = resolve(settings, overrides)
    async with ready(settings, _notice(settings)) as runtime:
        log.info("trajectory: %s", runtime.path)
        return await run(text, runtime.llm, runtime.toolbox, runtime.agent, runtime.writer)


def ask_many(
    questions: Iterable[str],
    settings: RunSettings | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    **overrides: Any,
) -> list[Trajectory]:
    """Answer many questions, `concurrency` at a time, over one model client and one toolbox; the
    trajectories in the questions' order. For scripts; inside an event loop, `await ask_many_async(...)`."""
    _no_running_loop("ask_many", "ask_many_async")
    return asyncio.run(ask_many_async(questions, settings, concurrency, **overrides))


async def ask_many_async(
    questions: Iterable[str],
    settings: RunSettings | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    **overrides: Any,
) -> list[Trajectory]:
    """`ask_many` for async code. A run that fails does not stop the others: a model error ends it with
    stop reason `model_error`, a crash with `crashed` (and `.error` says what happened); all runs go to
    one trajectory file, each its own trajectory, as in `nanbeige eval`."""
    texts = _questions(questions)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"concurrency must be an int, not {type(concurrency).__name__}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    settings = resolve(settings, overrides)
    if not texts:
        return []
    async with ready(settings, _notice(settings)) as runtime:
        log.info("trajectories: %s", runtime.path)
        slots = asyncio.Semaphore(concurrency)

        async def one(text: str) -> Trajectory:
            async with slots:
                return await _kept_run(text, runtime)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(text)) for text in texts]
        except* Exception as errors:  # a run that failed before its trajectory began: a bug, raised as itself
            raise errors.exceptions[0] from None
        return [task.result() for task in tasks]


async def _kept_run(text: str, runtime: Ready) -> Trajectory:
    """One of many runs; a crash returns its trajectory, closed as `crashed`, instead of raising."""
    ended: list[Trajectory] = []

    def on_event(kind: str, data: Any) -> None:
        if kind == "end":
            ended.append(data)

    try:
        return await run(text, runtime.llm, runtime.toolbox, runtime.agent, runtime.writer, on_event=on_event)
    except Exception:
        if not ended:
            raise
        log.warning("a run crashed (%s); the other runs go on", ended[0].error)
        return ended[0]


def resolve(settings: RunSettings | None, overrides: dict[str, Any]) -> RunSettings:
    """The settings a call runs with: the given ones (else `nanbeige ask`'s), with the overrides set."""
    if settings is not None and not isinstance(settings, RunSettings):
        raise TypeError(f"settings must be a RunSettings, not {type(settings).__name__}")
    for name in overrides:
        if name not in OVERRIDES:
            raise TypeError(_unknown(name))
    return with_overrides(settings if settings is not None else command_settings(), overrides)


def command_settings() -> RunSettings:
    """What `nanbeige ask` with no flags runs with: its flags' values from the NANBEIGE_* environment and
    `nanbeige.toml`, else their defaults, read by the command line's own parser."""
    import typer

    from nanbeige.agent.cli import options, program, settings_file

    try:
        found = settings_file.find()
        for _, why in found.ignored:  # said as the command line says it: a folder's file is not obeyed unasked
            print(why, file=sys.stderr)
        defaults = (settings_file.default_map(program.app, found) or {}).get("ask")
        command = typer.main.get_command(program.app).commands["ask"]  # type: ignore[attr-defined]
        params = command.make_context("ask", [], default_map=defaults).params
        # a repeatable flag's values come as a tuple; the command itself is handed a list
        params = {name: list(value) if isinstance(value, tuple) else value for name, value in params.items()}
        return options.run_settings(params)
    except settings_file.SettingsError as exc:
        raise SetupError(str(exc), usage=True) from None
    except typer.BadParameter as exc:
        raise SetupError(
            f"the settings of `nanbeige ask` (environment, nanbeige.toml): {exc.format_message()}", usage=True
        ) from None
    except typer.Exit:  # its one line is printed on stderr
        raise SetupError(
            "the settings of `nanbeige ask` (environment, nanbeige.toml) are not valid: see the error above", usage=True
        ) from None


def with_overrides(settings: RunSettings, overrides: dict[str, Any]) -> RunSettings:
    """A copy of the settings with each override set on its part (the settings given are not changed)."""
    parts: dict[str, dict[str, Any]] = {}
    own: dict[str, Any] = {}
    for name, value in overrides.items():
        part, field, kind = OVERRIDES[name]
        if name == "base_url" and isinstance(value, (list, tuple)) and value:  # a pool: the first, and the rest
            value, parts.setdefault("llm", {})["more_base_urls"] = (
                value[0],
                tuple(_checked(name, str, url, False) for url in value[1:]),
            )
        value = _checked(name, kind, value, _nullable(part, field))
        problem = range_problem(name, value) if name in RANGES and value is not None else None
        if problem:  # the bounds `nanbeige ask` holds its flag to
            raise ValueError(problem)
        setting = RUN.get(name)
        if setting is not None and setting.to_field is not None:
            value = setting.to_field(value)  # --no-default-servers: default_servers is its opposite
        (parts.setdefault(part, {}) if part else own)[field] = value
        if name == "base_url":
            parts.setdefault("backend", {})["base_url_given"] = True
    changed = {part: dataclasses.replace(getattr(settings, part), **fields) for part, fields in parts.items()}
    return dataclasses.replace(settings, **changed, **own)


def _nullable(part: str | None, field: str) -> bool:
    """Whether the field may be None (its default is: the dialect or the server fills it in)."""
    defaults = RunSettings()
    return getattr(getattr(defaults, part) if part else defaults, field) is None


def _checked(name: str, kind: type, value: Any, nullable: bool) -> Any:
    """The override's value in the type its field holds; a TypeError naming it when it has another."""
    if value is None and nullable:
        return None
    if kind is dict:
        return _budgets(name, value)
    if kind is list and isinstance(value, str):
        value = [value]
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        Path: lambda v: isinstance(v, (str, os.PathLike)),
        list: lambda v: isinstance(v, (list, tuple)) and all(isinstance(item, str) for item in v),
    }[kind]
    if not ok(value):
        wanted = {Path: "a path", list: "a string or a list of strings", float: "a number"}.get(kind, kind.__name__)
        raise TypeError(f"{name} must be {wanted}{'' if not nullable else ' or None'}, not {type(value).__name__}")
    return {float: float, Path: Path, list: list}.get(kind, lambda v: v)(value)


def _budgets(name: str, value: Any) -> dict[str, float]:
    """Budgets as `{"tokens": 100000}` or `["tokens=100000"]`, checked as `--budget` checks them."""
    from nanbeige.agent.run.usage import parse_budgets

    if isinstance(value, dict):
        value = [f"{unit}={amount}" for unit, amount in value.items()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"{name} must be a dict of UNIT: N, or a list of 'UNIT=N', not {type(value).__name__}")
    try:
        return parse_budgets(list(value))
    except ValueError as exc:
        raise ValueError(str(exc).replace("--budget", name)) from None


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, OVERRIDES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown setting {name!r}{hint}; the settings are {', '.join(OVERRIDES)}; pass a RunSettings for the rest"


def _question(question: Any, name: str) -> str:
    if not isinstance(question, str):
        raise TypeError(f"{name} must be a string, not {type(question).__name__}")
    text = question.strip()  # as `nanbeige ask` reads it
    if not text:
        raise ValueError(f"{name} is empty")
    return text


def _questions(questions: Any) -> list[str]:
    if isinstance(questions, (str, bytes)):
        raise TypeError("ask_many takes a list of questions, not one string (ask answers one question)")
    try:
        items = list(questions)
    except TypeError:
        raise TypeError(f"questions must be a list of strings, not {type(questions).__name__}") from None
    return [_question(question, f"questions[{i}]") for i, question in enumerate(items)]


def _notice(settings: RunSettings) -> Callable[[str], None]:
    """The setup's notices, as warnings on the `nanbeige` logger, every key the runs know taken out."""
    secrets = usable_secrets(secrets_of(settings))
    return lambda text: log.warning("%s", redact(text, secrets))


def _no_running_loop(name: str, async_name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{name}() cannot run inside a running event loop (an async function, a Jupyter notebook): "
        f"use `await {async_name}(...)` there"
    )
