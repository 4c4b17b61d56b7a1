"""Training rows from token-recorded turns: one row per segment, the sampled tokens marked for the loss,
checked against the prompts a loopback vLLM-style server received over real token-mode runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_token_mode import run_token_mode

from nanbeige.agent.run.tokens import TokenTracker, TrainingRow, rebuild_segments, training_rows
from nanbeige.agent.trajectory.trajectory import Turn
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

FAKE_LOGPROB = -0.25  # what the loopback server reports for every sampled token


async def run_and_load(tokenizer: Any, turns: int, keep: int, path: Path) -> tuple[list[Turn], list[dict]]:
    """A token-mode run of `turns` tool calls and an answer; the turns as read back from its file."""
    _, requests = await run_token_mode(tokenizer, turns, keep, path)
    [saved] = load_trajectories(path)
    return saved.turns, requests


def recorded(*turns: tuple[list[int], list[int], list[float] | None]) -> list[Turn]:
    """Turns with token records, from (prompt ids, completion ids, logprobs) as a backend would report them."""
    tracker = TokenTracker()
    result = []
    for index, (prompt, completion, logprobs) in enumerate(turns):
        turn = Turn(index=index, assistant={"content": ""}, logprobs=logprobs)
        tracker.record(turn, prompt, completion)
        result.append(turn)
    return result


def trained_ids(row: TrainingRow) -> list[int]:
    return [token for token, trained in zip(row.ids, row.loss_mask) if trained]


@pytest.mark.anyio
async def test_each_row_trains_exactly_its_segments_sampled_tokens(tokenizer: Any, tmp_path: Path) -> None:
    turns, requests = await run_and_load(tokenizer, 50, 5, tmp_path / "run.jsonl")
    rows = training_rows(turns)
    assert len(turns) == len(requests) == 52  # 50 calls, the answer, the summary turn
    assert len(rows) > 40  # keep-5 rewrites the history: a segment per rewrite
    assert {row.segment: row.ids for row in rows} == rebuild_segments(turns)
    for turn, request in zip(turns, requests):
        sent = request["prompt"] + turn.completion_ids
        [row] = [row for row in rows if turn.index in row.turns]
        assert row.segment == turn.segment and row.ids[: len(sent)] == sent
        completion = slice(len(request["prompt"]), len(sent))  # the completion sits right after its own prompt
        assert set(row.loss_mask[completion]) == {1}
        starting_with_it = [r for r in rows if r.ids[: len(sent)] == sent]
        # keep-5 never rewrites what precedes the first tool result: turn 0 starts every row
        assert starting_with_it == (rows if turn.index == 0 else [row])
    for row in rows:
        assert row.turns == [turn.index for turn in turns if turn.segment == row.segment]
        assert trained_ids(row) == [t for i in row.turns for t in turns[i].completion_ids]
        assert row.logprobs == [FAKE_LOGPROB if trained else 0.0 for trained in row.loss_mask]
    assert sum(sum(row.loss_mask) for row in rows) == sum(len(turn.completion_ids) for turn in turns)


@pytest.mark.anyio
async def test_a_run_that_keeps_every_result_is_one_row(tokenizer: Any, tmp_path: Path) -> None:
    turns, requests = await run_and_load(tokenizer, 6, -1, tmp_path / "run.jsonl")
    [row] = training_rows(turns)
    assert row.segment == 0 and row.turns == [0, 1, 2, 3, 4, 5, 6, 7]  # the summary turn extends it too
    assert row.ids == requests[-1]["prompt"] + turns[-1].completion_ids
    for turn, request in zip(turns, requests):
        start = len(request["prompt"])
        assert row.ids[:start] == request["prompt"]
        assert row.loss_mask[start : start + len(turn.completion_ids)] == [1] * len(turn.completion_ids)
        assert row.loss_mask[start - 1] == 0  # the template glue before a completion is not trained on
    assert trained_ids(row) == [t for turn in turns for t in turn.completion_ids]


def test_a_masked_turn_keeps_its_tokens_but_is_not_trained_on() -> None:
    turns = recorded(
        ([1, 2], [3, 4], [-0.1, -0.2]), ([1, 2, 3, 4, 5], [6, 7], [-0.3, -0.4]), ([1, 2, 3, 4, 5, 6, 7, 8], [9], [-0.5])
    )
    turns[1].mask = 0  # e.g. a critic judged this turn unsound
    [row] = training_rows(turns)
    assert row.ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert row.loss_mask == [0, 0, 1, 1, 0, 0, 0, 0, 1]
    assert row.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.3, -0.4, 0.0, -0.5]  # sampled, so still recorded
    assert row.turns == [0, 1, 2]


def test_rows_split_where_the_history_was_rewritten() -> None:
    turns = recorded(
        ([1, 2], [3], [-0.1]),
        ([1, 2, 3, 4], [5], None),  # a backend that gave no logprobs for this turn
        ([1, 2, 9, 4, 5, 6], [7, 8], [-0.2, -0.3]),
    )  # a tool result replaced: a new segment
    first, second = training_rows(turns)
    assert (first.segment, first.ids, first.loss_mask, first.turns) == (0, [1, 2, 3, 4, 5], [0, 0, 1, 0, 1], [0, 1])
    assert first.logprobs is None
    assert (second.segment, second.ids, second.turns) == (1, [1, 2, 9, 4, 5, 6, 7, 8], [2])
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1, 1]  # the earlier completions here are prompt now
    assert second.logprobs == [0.0] * 6 + [-0.2, -0.3]


def test_records_that_do_not_check_are_refused() -> None:
    with pytest.raises(ValueError, match="turn 1: 1 logprobs for 2 completion ids"):
        training_rows(recorded(([1], [2], [-0.1]), ([1, 2, 3], [4, 5], [-0.2])))
    tampered = recorded(([1], [2], [-0.1]), ([1, 2, 3], [4], [-0.2]))
    tampered[0].completion_ids = [7]
    with pytest.raises(ValueError, match="turn 1: prefix hash does not match"):
        training_rows(tampered)
    relabelled = recorded(([1], [2], None), ([1, 9], [3], None))  # the completion [2] was rewritten: segment 1
    relabelled[1].segment = 0
    with pytest.raises(ValueError, match="turn 1: its prompt does not extend segment 0"):
        training_rows(relabelled)
    assert training_rows([Turn(index=0, assistant={"content": "no token record"})]) == []
