"""An eval's runs in shards on a Ray cluster (`nanbeige eval --ray`): each node's actor opens its own tool
servers, model clients and judge client, runs and grades the runs it is handed, and sends back each result
row with its trajectory's records. This process writes both, as `runner.evaluate` does in one process, so
the out folder and its resume rules are the same (`agent/cluster.py` says how lost nodes are handled)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from nanbeige.agent import cluster
from nanbeige.agent.run_config import RunSettings
from nanbeige.agent.trajectory_file import TrajectoryWriter
from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.grading import open_code_runner
from nanbeige.evals.out_folder import append_result
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
    from nanbeige.agent.setup import open_writer, secrets_of

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


def written(shards: cluster.Shards, writer: TrajectoryWriter) -> Attempt:
    """The work of one run on the cluster as `run_all` takes it: the run's records written here through `writer`
    (as its own writer would have), its row returned; every node lost is an EvalError, which stops `run_all`."""

    async def attempt(task: Task, index: int) -> dict[str, Any] | str:
        try:
            row, calls = await shards.run((task, index))
        except cluster.ClusterError as exc:
            raise EvalError(str(exc)) from None
        cluster.replay(calls, writer)
        return row

    return attempt


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
