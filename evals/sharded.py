"""An eval's runs in shards on a Ray cluster (`nanbeige eval --ray`): each node's actor opens its own tool
servers, model clients and judge client, runs and grades the runs it is handed, and sends back each result
row with its trajectory's records. This process writes both, as `runner.evaluate` does in one process, so
the out folder and its resume rules are the same (`agent/cluster.py` says how lost nodes are handled)."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from nanbeige.agent import cluster
from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.trajectory.shard_results import records_problem
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter
from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.grading import open_code_runner
from nanbeige.evals.out_folder import TRAJECTORIES, append_result, result_problem
from nanbeige.evals.runner import Attempt, Progress, agent_attempt, run_all
from nanbeige.evals.tasks import Task


async def run_on_ray(
    config: EvalConfig,
    settings: RunSettings,
    pending: list[tuple[Task, int]],
    progress: Progress,
    notice: Callable[[str], None],
    progress_view: Callable[[Progress], Any] | None,
) -> None:
    """Every pending run on the cluster at `config.ray`; `settings` write into the out folder."""
    from nanbeige.agent.setup.setup import open_writer, secrets_of

    assert config.ray is not None and settings.trajectory is not None
    opener = functools.partial(open_shard, config, settings)
    try:
        async with cluster.shards(config.ray, opener, config.concurrency, notice) as shards:
            writer = open_writer(settings.trajectory, secrets_of(settings))
            # the model's answer or the judge's reason may quote a key: the results file never does
            secrets = [*writer.secrets, *([config.judge.api_key] if config.judge.api_key else [])]

            view = progress_view(progress) if progress_view else None
            try:
                await run_all(
                    pending,
                    written(shards, writer),
                    config.concurrency * len(shards.placed),
                    progress,
                    lambda row: append_result(config.out, row, secrets),
                )
            finally:
                if view is not None:
                    view.stop()
                writer.close()
    except cluster.ClusterError as exc:
        raise EvalError(str(exc)) from None


def written(shards: cluster.Shards, writer: TrajectoryWriter, row_problem: RowCheck = result_problem) -> Attempt:
    """The work of one run on the cluster as `run_all` takes it: the run's records written here through `writer`
    (as its own writer would have), its row returned, once both are found to be those of the run asked for
    (`row_problem`: what is wrong with its row read back from JSON); every node lost is an EvalError, which
    stops `run_all`."""

    async def attempt(task: Task, index: int) -> dict[str, Any] | str:
        try:
            row, calls = await shards.run((task, index), functools.partial(run_problem, row_problem=row_problem))
        except cluster.ClusterError as exc:
            raise EvalError(str(exc)) from None
        cluster.replay(calls, writer)
        return row

    return attempt


RowCheck = Callable[[Any], "str | None"]


def run_problem(item: tuple[Task, int], result: Any, row_problem: RowCheck) -> str | None:
    """Why a shard's result cannot be written as the run `item` asked for: its records those of one trajectory
    of the task's question (`agent/trajectory/shard_results.py`), its row (or why the run failed) of that task and run,
    naming no trajectory file but the out folder's own. None when it can."""
    task, index = item
    if type(result) is not tuple or len(result) != 2:
        return f"{type(result).__name__} where a (row, records) pair belongs"
    row, calls = result
    problem = records_problem(calls, task.id, task.question)
    if problem is not None or type(row) is str:  # a failed run's reason is said, never written
        return problem
    try:
        problem = row_problem(json.loads(json.dumps(row)))  # as the results file would hold it, read back
    except (TypeError, ValueError, RecursionError) as exc:
        problem = f"it cannot be written as JSON ({exc})"
    if problem is not None:
        return f"its row: {problem}"
    trajectory_ids = {None, *(value.id for kind, value in calls if kind == "start")}
    if (
        row.get("task_id") != task.id
        or row.get("run", index) != index
        or row.get("trajectory_id") not in trajectory_ids
    ):
        return f"a row of another run than task {task.id!r}, run {index}"
    if row.get("trajectory_file") not in (None, TRAJECTORIES):
        return f"a row naming a trajectory file outside the out folder ({str(row['trajectory_file'])[:100]!r})"
    return None


@asynccontextmanager
async def open_shard(
    config: EvalConfig, settings: RunSettings, notice: Callable[[str], None]
) -> AsyncIterator[Callable[..., Any]]:
    """On a Ray actor: what the node's runs need (the sandbox of code graders too), and the work of one run."""
    code_runner = open_code_runner(config)
    try:
        async with cluster.shard_runtime(settings, notice) as runtime, httpx.AsyncClient() as client:
            yield cluster.recorded(runtime, lambda each: agent_attempt(each, config, client, code_runner))
    finally:
        if code_runner is not None:
            code_runner.close()
