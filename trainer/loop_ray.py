"""`nanbeige loop --iterations N --ray auto|HOST:PORT`: each iteration's collect and judge run in shards on a Ray
cluster, as `collect --ray` and `judge --ray` run them (a shard per node, this process the only writer of the
iteration's files, so they and the loop's resume rules are those of a loop in one process). Training stays
where it is without Ray: this process, or torchrun. Ray is imported only when an address is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanbeige.trainer.judge_config import JudgeRunConfig


async def judge_rollouts(
    judge: JudgeRunConfig, ray: str | None, folder: Path, notice: Callable[[str], None]
) -> dict[str, Any]:
    """Judge the iteration's rollouts into its judged file: here, or on the cluster at `ray`."""
    from nanbeige.trainer.rewards import judge_file

    judge_all = None
    if ray is not None:  # the only place the loop loads Ray
        from nanbeige.trainer.rewards_sharded import judge_on_ray as judge_all
    return await judge_file(
        folder / "rollouts.jsonl",
        folder / "judged.jsonl",
        dataclasses.replace(judge, ray=ray),
        notice,
        judge_all=judge_all,
    )
