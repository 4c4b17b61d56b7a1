"""`nanbeige judge --ray`: trajectories judged in shards on a Ray cluster. Each node's actor opens its own
judge and critic clients (and, for code, its own sandbox), judges the trajectories it is handed and sends
each back; this process writes them to OUT whole, as `judge._judge_all` does in one process, so OUT and its
resume rule are the same (`agent/cluster.py` says how lost nodes are handled)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from nanbeige.agent import cluster
from nanbeige.agent.trajectory.shard_results import trajectory_problem
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter
from nanbeige.trainer.code_rewards import open_code_judging
from nanbeige.trainer.judge_config import JudgeError, JudgeRunConfig, chosen_grader
from nanbeige.trainer.rewards import (
    CODE_TESTS,
    CriticWatch,
    JudgeProgress,
    judge_trajectory,
    judging_secrets,
    write_whole,
)


async def judge_on_ray(
    todo: list[Trajectory],
    out: Path,
    config: JudgeRunConfig,
    template: str,
    progress: JudgeProgress,
    notice: Callable[[str], None],
) -> None:
    """Judge `todo` on the cluster at `config.ray`, each judged trajectory appended to `out` as it comes back."""
    assert config.ray is not None
    code = config.problems is not None and any(chosen_grader(t, config) == CODE_TESTS for t in todo)
    opener = functools.partial(open_shard, config, template, code)
    async with cluster.shards(config.ray, opener, config.concurrency, notice) as shards:
        writer = TrajectoryWriter(out, secrets=judging_secrets(config))
        slots = asyncio.Semaphore(config.concurrency * len(shards.placed))

        async def one(trajectory: Trajectory) -> None:
            async with slots:
                progress.running += 1
                try:
                    judged = await shards.run(trajectory, judged_problem)
                finally:
                    progress.running -= 1
                write_whole(writer, judged)
                progress.count(judged)

        try:
            async with asyncio.TaskGroup() as group:
                for trajectory in todo:
                    group.create_task(one(trajectory))
        except* (JudgeError, cluster.ClusterError) as errors:
            raise errors.exceptions[0] from None  # an endpoint down fails every trajectory alike
        finally:
            writer.close()


def judged_problem(sent: Trajectory, judged: Any) -> str | None:
    """Why a trajectory a Ray node sends back cannot be written as the judged `sent`: another trajectory (its
    id, question or number of turns), or records a trajectory file could not hold
    (`agent/trajectory/shard_results.py`)."""
    problem = trajectory_problem(judged)
    if problem is None and (judged.id, judged.group_id, judged.question, len(judged.turns)) != (
        sent.id,
        sent.group_id,
        sent.question,
        len(sent.turns),
    ):
        problem = f"trajectory {judged.id!r} where the judged {sent.id!r} belongs"
    return problem


@asynccontextmanager
async def open_shard(
    config: JudgeRunConfig, template: str, code: bool, notice: Callable[[str], None]
) -> AsyncIterator[Callable[..., Any]]:
    """On a Ray actor: the node's clients, its sandbox for code, and the work of judging one trajectory."""
    judging = None
    if code:
        assert config.problems is not None
        judging = open_code_judging(config.problems, config.rewards, config.complexity if config.time_reward else None)
        notice(f"code-tests runs programs in {judging.runner.where}")
    watch = CriticWatch(config.critic) if config.critic is not None else None
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=max(config.concurrency, 10))) as client:

            async def work(trajectory: Trajectory) -> Trajectory:
                await judge_trajectory(trajectory, config, template, client, watch, judging)
                return trajectory

            yield work
    finally:
        if judging is not None:
            judging.close()
