"""The trajectory file: appended per turn, readable after a crash, format pinned by a golden file."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from nanbeige.agent.run.tokens import TokenTracker, common_prefix, full_prompt, rebuild_segments
from nanbeige.agent.run.usage import run_usage
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories, read_records

GOLDEN = Path(__file__).parent / "golden" / "trajectory.jsonl"


def sample_trajectory() -> Trajectory:
    trajectory = Trajectory(
        question="What is 2+3?",
        id="t0",
        group_id="q0",
        rollout_index=0,
        policy_version="v0",
        reference_answer="5",
        grader="gaia-exact",
        system_prompt="sys",
        user_message="What is 2+3?",
        model="m",
        started_at=1700000000.0,
        sampling={"temperature": 0.6},
        limits={"max_turns": 5},
    )
    trajectory.turns.append(
        Turn(
            index=0,
            assistant={"role": "assistant", "content": "<think>\nadd\n</think>\n\ncall"},
            tool_calls=[ToolCall(server="calc", name="add", arguments={"a": 2, "b": 3})],
            tool_results=[ToolResult(text="5", latency_s=0.25, usage={"serper_queries": 1})],
            finish_reason="stop",
            usage={"prompt_tokens": 10, "completion_tokens": 4},
            latency_s=0.5,
            segment=0,
            prompt_keep=0,
            prompt_delta_ids=[1, 2, 3],
            prefix_hash="h",
            completion_ids=[7, 8],
            logprobs=[-0.1, -0.2],
        )
    )
    trajectory.answer, trajectory.stop_reason = "5", "answered"
    trajectory.timings = {"wall_s": 1.0, "model_s": 0.5, "tool_s": 0.25}
    trajectory.usage = run_usage(trajectory.turns)
    return trajectory


def write(trajectory: Trajectory, path: Path, secrets: list[str] | None = None) -> None:
    writer = TrajectoryWriter(path, secrets=secrets)
    writer.start(trajectory)
    for turn in trajectory.turns:
        writer.turn(trajectory, turn)
    writer.end(trajectory)
    writer.close()


def test_file_format_matches_the_golden_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(sample_trajectory(), path)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        json.loads(line) for line in GOLDEN.read_text().splitlines()
    ]


def test_golden_file_has_the_documented_fields() -> None:
    start, turn, end = read_records(GOLDEN)
    assert [start["type"], turn["type"], end["type"]] == ["start", "turn", "end"]
    assert turn["trajectory_id"] == end["trajectory_id"] == start["id"]
    for key in (
        "index",
        "assistant",
        "tool_calls",
        "tool_results",
        "usage",
        "completion_ids",
        "logprobs",
        "prompt_keep",
        "prompt_delta_ids",
        "segment",
        "prefix_hash",
    ):
        assert key in turn
    assert turn["assistant"]["content"].startswith("<think>")
    assert set(turn["tool_calls"][0]) >= {"server", "name", "arguments"}
    assert set(turn["tool_results"][0]) >= {"text", "is_error", "latency_s"}
    assert end["answer"] == "5" and end["stop_reason"] == "answered"
    assert end["usage"] == {
        "model_calls": 1,
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "tokens": 14,
        "tool_calls": 1,
        "serper_queries": 1,
    }


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    original = sample_trajectory()
    write(original, tmp_path / "t.jsonl")
    [loaded] = load_trajectories(tmp_path / "t.jsonl")
    assert loaded == original


def test_several_trajectories_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    first, second = sample_trajectory(), sample_trajectory()
    second.id, second.answer = "t1", "6"
    write(first, path)
    write(second, path)
    assert [(t.id, t.answer) for t in load_trajectories(path)] == [("t0", "5"), ("t1", "6")]


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trajectory = sample_trajectory()
    writer = TrajectoryWriter(path)
    writer.start(trajectory)
    writer.turn(trajectory, trajectory.turns[0])
    [unfinished] = load_trajectories(path)  # read while the writer is still open
    assert len(unfinished.turns) == 1 and not unfinished.finished
    writer.close()


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(sample_trajectory(), path)
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:25])  # crash in the middle of the end line
    [trajectory] = load_trajectories(path)
    assert len(trajectory.turns) == 1 and trajectory.stop_reason is None


def test_appending_after_a_torn_line_keeps_both_runs_readable(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(sample_trajectory(), path)
    path.write_bytes(path.read_bytes()[:-20])  # the first run died writing its end line
    second = sample_trajectory()
    second.id = "t1"
    write(second, path)
    first, again = load_trajectories(path)
    assert (first.id, first.finished, again.id, again.finished) == ("t0", False, "t1", True)


def test_short_secrets_are_not_redacted_so_the_file_stays_valid(tmp_path: Path) -> None:
    write(sample_trajectory(), tmp_path / "t.jsonl", secrets=["null", "type", "abcdefgh"])
    [loaded] = load_trajectories(tmp_path / "t.jsonl")
    assert loaded.turns[0].format_error is None


def test_a_broken_line_in_the_middle_is_skipped_with_a_warning_when_records_follow(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(sample_trajectory(), path)
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], b"{oops", lines[2]]) + b"\n")
    warnings: list[str] = []
    [trajectory] = load_trajectories(path, warn=warnings.append)
    assert trajectory.finished and trajectory.turns == []
    assert warnings == [f"{path}:2: skipped a line that is not a JSON object (a write cut short?)"]


def test_two_broken_lines_at_the_end_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(sample_trajectory(), path)
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], b"{oops", b"more"]) + b"\n")
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        load_trajectories(path)


def test_secrets_never_reach_the_file(tmp_path: Path) -> None:
    trajectory = sample_trajectory()
    trajectory.turns[0].tool_results[0].text = 'key is sk-live-123456 and "quoted"'
    write(trajectory, tmp_path / "t.jsonl", secrets=["sk-live-123456"])
    text = (tmp_path / "t.jsonl").read_text()
    assert "sk-live-123456" not in text and "[REDACTED]" in text


def test_token_deltas_rebuild_every_prompt_exactly() -> None:
    tracker, turns = TokenTracker(), []
    prompts_and_completions = [
        ([1, 2, 3], [4, 5]),
        ([1, 2, 3, 4, 5, 6], [7]),  # extends the previous turn: same segment
        ([1, 2, 3, 4, 0, 6, 7, 8], [9]),  # history rewritten at position 4: new segment, only the rest stored
        ([1, 2, 3, 4, 0, 6, 7, 8, 9, 10], [11]),
    ]
    for index, (prompt, completion) in enumerate(prompts_and_completions):
        turn = Turn(index=index, assistant={})
        tracker.record(turn, prompt, completion)
        turns.append(turn)
    assert [t.segment for t in turns] == [0, 0, 1, 1]
    assert [t.prompt_keep for t in turns] == [0, 5, 4, 9]
    assert [t.prompt_delta_ids for t in turns] == [[1, 2, 3], [6], [0, 6, 7, 8], [10]]
    assert [full_prompt(turns, i) for i in range(4)] == [p for p, _ in prompts_and_completions]
    assert rebuild_segments(turns) == {0: [1, 2, 3, 4, 5, 6, 7], 1: [1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 11]}
    turns[0].prompt_delta_ids = [1, 2, 99]
    with pytest.raises(ValueError, match="prefix hash"):
        rebuild_segments(turns)


def test_common_prefix_finds_the_first_difference_anywhere() -> None:
    a = array("i", range(10_000))
    for position in (0, 1, 4095, 4096, 9999):
        b = array("i", a)
        b[position] = -1
        assert common_prefix(a, b) == position
    assert common_prefix(a, a[:5000]) == 5000 and common_prefix(array("i"), a) == 0


def test_token_records_stay_exact_over_many_extensions_and_rewrites() -> None:
    import random

    rng = random.Random(7)
    tracker, turns, sent, ids = TokenTracker(), [], [], []
    for index in range(300):
        if ids and rng.random() < 0.3:  # context management rewrote the history at a random point
            cut = rng.randrange(len(ids))
            ids = ids[:cut] + [-index]
        prompt = ids + [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
        completion = [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
        turn = Turn(index=index, assistant={})
        tracker.record(turn, prompt, completion)
        turns.append(turn)
        sent.append(prompt)
        ids = prompt + completion
    assert [full_prompt(turns, i) for i in range(300)] == sent  # raises on any wrong prefix hash
    assert len({t.segment for t in turns}) > 50
