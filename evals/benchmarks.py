"""The benchmarks `nanbeige eval` knows: how each is loaded, graded and run.

Default graders follow the reference harness (MiroThinker) where it scores the benchmark, and the
benchmark's own official grader otherwise: GAIA validation by the official quasi-exact match;
GAIA-Text-103 and SEAL-0 by the "equivalent" judge; BrowseComp, BrowseComp-ZH, HLE and xBench by
their official judges' profiles; BFCL by its package's AST checker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.agent.config import RunSettings
from nanbeige.evals.bfcl import CATEGORIES as BFCL_CATEGORIES
from nanbeige.evals.bfcl import GRADER
from nanbeige.evals.tasks import LoadError, Task

if TYPE_CHECKING:
    import httpx

    from nanbeige.agent.setup import Ready
    from nanbeige.evals.runner import Attempt, EvalConfig


def _agent_attempt(runtime: Ready, config: EvalConfig, client: httpx.AsyncClient) -> Attempt:
    from nanbeige.evals.runner import agent_attempt

    return agent_attempt(runtime, config, client)


def _unchanged(settings: RunSettings) -> RunSettings:
    return settings


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The name on the command line."""
    load: Callable[[Path | None], list[Task]]
    """Reads the official file (or folder) into tasks."""
    grader: str
    """The default grader: `gaia-exact`, `bfcl-ast` or a judge profile."""
    about: str
    """One line for `--help`: the file it reads."""
    attempt: Callable[[Ready, EvalConfig, httpx.AsyncClient], Attempt] = _agent_attempt
    """Makes the function that runs one task once (the agent loop, or BFCL's single call)."""
    adjust: Callable[[RunSettings], RunSettings] = _unchanged
    """What the benchmark changes in the run settings (BFCL: the tool-call dialect, no servers)."""
    needs_data: bool = True
    """Whether `--data` is required (BFCL's data ships in its package)."""


def _lazy(module: str, function: str = "load") -> Callable[[Path | None], list[Task]]:
    """A loader imported when used, so that `--help` does not import every benchmark module."""
    def load(path: Path | None) -> list[Task]:
        if path is None:
            raise LoadError("--data is required: the path of the benchmark's file")
        import importlib

        return getattr(importlib.import_module(f"nanbeige.evals.{module}"), function)(path)
    return load


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("gaia", _lazy("gaia"), "gaia-exact",
              "GAIA validation: metadata.jsonl / metadata.parquet (or its folder)"),
    Benchmark("gaia-text-103", _lazy("gaia"), "equivalent", "GAIA text-only subset: the 103-question dev.json"),
    Benchmark("browsecomp", _lazy("browsecomp"), "browsecomp", "BrowseComp: browse_comp_test_set.csv"),
    Benchmark("browsecomp-zh", _lazy("browsecomp", "load_zh"), "browsecomp-zh",
              "BrowseComp-ZH: browsecomp-zh-encrypted.xlsx"),
    Benchmark("xbench-2505", _lazy("xbench"), "xbench", "xBench-DeepSearch 2505: DeepSearch-2505.csv"),
    Benchmark("xbench-2510", _lazy("xbench"), "xbench", "xBench-DeepSearch 2510: DeepSearch-2510.csv"),
    Benchmark("hle", _lazy("hle"), "hle", "HLE text-only: the test parquet (rows with an image are left out)"),
    Benchmark("hle-500", _lazy("hle"), "hle", "HLE 500-question subset: test.json"),
    Benchmark("seal-0", _lazy("seal"), "equivalent", "SEAL-0: seal-0.parquet"),
]}


def _bfcl_attempt(runtime: Ready, config: EvalConfig, client: httpx.AsyncClient) -> Attempt:
    """One model call on the item's first turn with its functions as tools; the calls it makes are
    graded by BFCL's checker and never run."""
    import json

    from nanbeige.agent.llm import ModelError
    from nanbeige.evals import bfcl
    from nanbeige.evals.runner import result_row

    async def attempt(task: Task, run_index: int) -> dict[str, Any] | str:
        try:
            calls, _ = await bfcl.run_bfcl_task(task, runtime.llm)
        except ModelError as exc:
            return str(exc)
        prediction = json.dumps([{name: arguments} for name, arguments in calls], ensure_ascii=False)
        return result_row(task, run_index, prediction, bfcl.grade(task, calls), None)
    return attempt


def _bfcl_load(categories: tuple[str, ...]) -> Callable[[Path | None], list[Task]]:
    def load(data_dir: Path | None) -> list[Task]:
        from nanbeige.evals import bfcl

        return [task for category in categories for task in bfcl.load(category, data_dir)]
    return load


def tool_call_only(settings: RunSettings) -> RunSettings:
    """BFCL's settings: the tool-call dialect, the offered functions as the only tools."""
    agent = dataclasses.replace(settings.agent, dialect="tool-call")
    tools = dataclasses.replace(settings.tools, default_servers=False, mcp=[])
    return dataclasses.replace(settings, agent=agent, tools=tools)


for _category in ("", *BFCL_CATEGORIES):
    _name = f"bfcl-{_category.replace('_', '-')}" if _category else "bfcl"
    BENCHMARKS[_name] = Benchmark(
        _name, _bfcl_load((_category,) if _category else BFCL_CATEGORIES), GRADER,
        f"BFCL-V4 {_category or 'single-turn AST categories, all eight'} (--data: a copy of bfcl-eval's data folder, "
        "default the installed package's)", attempt=_bfcl_attempt, adjust=tool_call_only, needs_data=False)


def describe() -> list[dict[str, Any]]:
    return [{"name": b.name, "grader": b.grader, "about": b.about} for b in BENCHMARKS.values()]
