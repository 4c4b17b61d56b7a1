"""What an eval runs: the benchmark (`Benchmark`, listed in `benchmarks.py`) and the eval's settings
(`EvalConfig`, which `nanbeige eval`'s flags map onto), apart from the code that runs them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.evals.tasks import Task
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.tools.errors import NanbeigeError


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The name on the command line."""
    load: Callable[[Path | None], list[Task]]
    """Reads the official file (or folder) into tasks."""
    grader: str
    """The default grader: `gaia-exact`, a judge profile, or `bfcl-eval` (its own runner)."""
    about: str
    """One line for `--help`: the file it reads."""
    needs_data: bool = True
    """Whether `--data` is required (BFCL's data ships in its package)."""
    pipeline: Callable[..., Awaitable[dict[str, Any]]] | None = None
    """The benchmark's own pipeline, run instead of the agent loop (BFCL: its handler and runner); it
    takes what `runner.evaluate` takes and returns the report."""


class EvalError(NanbeigeError):
    """Something the user must fix before the eval can run; one line naming the fix."""


@dataclass
class EvalConfig:
    """What to evaluate and how; the model and tools come from `RunSettings`."""

    bench: Benchmark
    """The benchmark: how to load it and its default grader."""
    data: Path | None
    """The benchmark's official file (or folder); None for BFCL, whose data ships in its package."""
    out: Path
    """The out folder (created; an existing one of the same eval is resumed)."""
    k: int = 3
    """Runs per task (avg@k, pass@k); the reference harness scores avg@3."""
    concurrency: int = 4
    """Runs at once."""
    limit: int | None = None
    """Only the first N tasks of the file."""
    grader: str | None = None
    """A grader family (`reference`, `official`, `official-fixed`), `gaia-exact` or a judge profile's full
    name; None: the benchmark's default (the reference harness's)."""
    judge: ChatEndpoint = JUDGE_ENDPOINT
    """The LLM judge's endpoint, for judge graders."""
    ray: str | None = None
    """Run the eval in shards on a Ray cluster (`auto`, or the head's HOST:PORT): a shard per node, each with
    its own tool servers and model clients and `concurrency` runs at once (`evals.sharded.run_on_ray`, which
    `nanbeige eval --ray` passes to `runner.evaluate`); None: in this process."""
