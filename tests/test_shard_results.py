"""What a Ray node sends back is checked before the driver writes any of it, as a file from elsewhere would be
(`agent/trajectory/shard_results.py`): a run's records must be one trajectory of the question the node was given, each
record of the reader's types, its row of that task and run and naming no file outside the out folder; a judged
trajectory must be the one sent. A result that does not fit fails the shard: one line naming its node, and
nothing of it written. Driven through `Shards.run` and `evals.sharded.written` with a fake actor in place of
Ray's (a node is trusted with the driver's account: these are checks of data, docs/scaling.md)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fake_openai import mcp_answer

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.cluster import Placed, Recorder, Shards
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.toolbox import Toolbox
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories
from nanbeige.evals.eval_config import EvalError
from nanbeige.evals.runner import result_row
from nanbeige.evals.sharded import written
from nanbeige.evals.tasks import Task, Verdict
from nanbeige.trainer.rewards_sharded import judged_problem

TASK = Task(id="t1", question="What is 2+2?", answer="4")
NODE = "node 10.0.0.7 (5eedf00d)"


class FakeActor:
    """An actor whose `run.remote(item)` answers `result`, as Ray hands the driver a node's answer."""

    def __init__(self, result: Any):
        self.run = self
        self.result = result

    async def remote(self, item: Any) -> Any:
        return self.result


async def genuine_run() -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A real run of TASK and its records, as a node's `cluster.recorded` sends them back."""
    recorder = Recorder([])
    async with Toolbox([]) as tools:
        trajectory = await run(
            TASK.question, ScriptedLLM([mcp_answer("4")]), tools, AgentConfig(), recorder, group_id=TASK.id
        )
    row = result_row(TASK, 0, trajectory.answer, Verdict(correct=True, grader="gaia-exact"), trajectory)
    return row, recorder.calls


def with_value(calls: list[tuple[str, Any]], kind: str, change: dict[str, Any]) -> list[tuple[str, Any]]:
    """The calls with the first `kind` record's value changed (a copy: the others stay the genuine ones)."""
    forged = list(calls)
    index = next(i for i, (k, _) in enumerate(forged) if k == kind)
    forged[index] = (kind, dataclasses.replace(copy.deepcopy(forged[index][1]), **change))
    return forged


FORGED = {  # each: a change to the genuine (row, calls), and what the refusal says
    "a row of another task": (lambda row, calls: ({**row, "task_id": "t2"}, calls), "a row of another run"),
    "a row of another run": (lambda row, calls: ({**row, "run": 3}, calls), "a row of another run"),
    "a row naming a file outside the out folder": (
        lambda row, calls: ({**row, "trajectory_file": "../../.ssh/id_ed25519"}, calls),
        "outside the out folder",
    ),
    "a row whose verdict is text": (lambda row, calls: ({**row, "correct": "yes"}, calls), "'correct' is str"),
    "a trajectory of another question": (
        lambda row, calls: (row, with_value(calls, "start", {"group_id": "t2"})),
        "another question",
    ),
    "a turn's token ids of another type": (
        lambda row, calls: (row, with_value(calls, "turn", {"completion_ids": "1 2 3"})),
        "'completion_ids' is str",
    ),
    "an answer that is a list": (lambda row, calls: (row, with_value(calls, "end", {"answer": ["4"]})), "'answer'"),
    "a turn that is a dict": (
        lambda row, calls: (row, [calls[0], ("turn", {"index": 0}), *calls[1:]]),
        "not of trajectory",
    ),
    "a second trajectory": (
        lambda row, calls: (row, [*calls, ("start", Trajectory(question=TASK.question, group_id="t1"))]),
        "record",
    ),
    "records that are not a list": (lambda row, calls: (row, "x" * 10), "not a list"),
}


@pytest.mark.parametrize("case", FORGED)
def test_a_forged_shard_result_fails_the_shard_in_one_line_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    forge, why = FORGED[case]
    row, calls = asyncio.run(genuine_run())
    out = tmp_path / "trajectories.jsonl"
    writer = TrajectoryWriter(out)
    shards = Shards([Placed(FakeActor(("done", forge(row, calls))), NODE)], notice=lambda text: None)
    with pytest.raises(EvalError) as refused:
        asyncio.run(written(shards, writer)(TASK, 0))
    writer.close()
    said = str(refused.value)
    assert said.startswith(f"the shard on {NODE} failed") and why in said and "\n" not in said, said
    assert out.read_bytes() == b""


def test_a_genuine_result_is_written_as_the_run_would_write_it(tmp_path: Path) -> None:
    row, calls = asyncio.run(genuine_run())
    out = tmp_path / "trajectories.jsonl"
    writer = TrajectoryWriter(out)
    shards = Shards([Placed(FakeActor(("done", (row, calls))), NODE)], notice=lambda text: None)
    assert asyncio.run(written(shards, writer)(TASK, 0)) == row
    writer.close()
    [trajectory] = load_trajectories(out)
    assert (trajectory.id, trajectory.answer, trajectory.group_id) == (row["trajectory_id"], "4", "t1")


@pytest.mark.parametrize("answer", [("done", "not a pair"), ("raised", "not an exception"), "neither"])
def test_an_answer_that_is_no_result_fails_the_shard(tmp_path: Path, answer: Any) -> None:
    writer = TrajectoryWriter(tmp_path / "trajectories.jsonl")
    shards = Shards([Placed(FakeActor(answer), NODE)], notice=lambda text: None)
    with pytest.raises(EvalError, match=f"the shard on {NODE.replace('(', '.').replace(')', '.')} failed"):
        asyncio.run(written(shards, writer)(TASK, 0))


def test_a_judged_trajectory_must_be_the_one_sent_with_finite_rewards() -> None:
    _, calls = asyncio.run(genuine_run())
    sent = calls[-1][1]
    judged = dataclasses.replace(copy.deepcopy(sent), reward=1.0)
    assert judged_problem(sent, judged) is None
    assert "where the judged" in judged_problem(sent, dataclasses.replace(judged, id="other"))
    assert "where the judged" in judged_problem(sent, dataclasses.replace(judged, turns=[]))
    assert "finite" in judged_problem(sent, dataclasses.replace(judged, reward=float("nan")))
    bad_turn = dataclasses.replace(judged.turns[0], reward=float("inf"))
    assert "finite" in judged_problem(sent, dataclasses.replace(judged, turns=[bad_turn]))
    assert "not a trajectory" in judged_problem(sent, {"id": sent.id})
    assert "'mask'" in judged_problem(
        sent, dataclasses.replace(judged, turns=[dataclasses.replace(bad_turn, reward=0.5, mask="1")])
    )
