"""What the curves say about each batch of rollouts (`rollouts/...` in every step's record, drawn by `nanbeige
train report`): over the judged trajectories, the reward, the pass rate, and the share that called a tool, which
is what a search task's learning curve must show rising."""

from __future__ import annotations

import json
from pathlib import Path

from nanbeige.agent.trajectory.trajectory import ToolCall, Trajectory, Turn
from nanbeige.trainer.rollouts import rollout_summary
from nanbeige.trainer.train_report import draw

SEARCH = ToolCall(server="search", name="google_search", arguments={"q": "x"})


def rollout(reward: float | None, *calls_per_turn: int) -> Trajectory:
    turns = [
        Turn(index=i, assistant={"content": ""}, tool_calls=[SEARCH] * calls) for i, calls in enumerate(calls_per_turn)
    ]
    return Trajectory(question="q", turns=turns, reward=reward)


def test_the_share_of_rollouts_that_call_a_tool_and_their_calls_count_only_judged_rollouts() -> None:
    summary = rollout_summary(
        [rollout(1.0, 1, 0), rollout(0.0, 0), rollout(0.0, 2, 1, 0), rollout(1.0, 0, 0), rollout(None, 5)]
    )
    assert summary["tool_use"] == 0.5  # 2 of the 4 judged ones; the unjudged one is not counted
    assert summary["tool_calls_mean"] == (1 + 3) / 4
    assert summary["pass_rate"] == 0.5


def test_train_report_draws_the_tool_use_curve(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 0.1, "rollouts": {"tool_use": s / 4, "tool_calls_mean": s}} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    written = {path.name for path in draw(tmp_path)}
    assert "tool_use.png" in written
