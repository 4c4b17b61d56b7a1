"""`trainer.critic` through `trainer.judge`: the turn rule and the reading of critiques checked by hand, and a
scripted critic behind a loopback OpenAI-compatible server whose scores become turn rewards and masks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply
from test_judge import QUESTION, config, critic_replies, make, marker, prompt_of, rating, write

from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.critic import MalformedCritique, TurnRule, parse_scores, turn_outcome
from nanbeige.trainer.rewards import JudgeProgress, judge_file

# ---------------------------------------------------------------- the rule, by hand


def test_turn_outcome_by_hand() -> None:
    mask, penalise = TurnRule(), TurnRule(failed="penalise", penalty=0.5)
    scores = dict(logical_soundness=5, tool_call_accuracy=4, information_gain=3)
    assert turn_outcome(scores, mask) == (0.75, 1, True)  # ((5-1) + (4-1) + (3-1)) / 4 / 3
    assert turn_outcome(scores, penalise) == (0.75, 1, True)
    assert turn_outcome(dict(logical_soundness=3, tool_call_accuracy=3, information_gain=3), mask) == (0.5, 1, True)
    failing = dict(logical_soundness=5, tool_call_accuracy=2, information_gain=5)
    assert turn_outcome(failing, mask) == (None, 0, False)
    assert turn_outcome(failing, penalise) == (-0.5, 1, False)
    assert turn_outcome(failing, TurnRule(failed="penalise")) == (-1.0, 1, False)
    answer_turn = dict(logical_soundness=4, tool_call_accuracy=None, information_gain=None)
    assert turn_outcome(answer_turn, mask) == (0.75, 1, True)  # the unscored two count as passing
    assert turn_outcome(dict(answer_turn, logical_soundness=1), mask) == (None, 0, False)
    lenient = TurnRule(min_information_gain=1)
    assert turn_outcome(dict(logical_soundness=5, tool_call_accuracy=5, information_gain=1), lenient) == (
        2 / 3,
        1,
        True,
    )


def test_critic_replies_are_read_robustly() -> None:
    body = json.dumps(rating((4, 3, 2)))
    for text in (
        body,
        f"Here is my rating:\n```json\n{body}\n```\nHope this helps.",
        f'<think>maybe {{"x": 1}}</think>{body}',
        body[:-2],
    ):  # the last one is cut off: repaired
        assert parse_scores(text, tool_turn=True)["information_gain"] == {"score": 2, "reason": "information_gain is 2"}
    assert parse_scores('{"logical_soundness": 4}', tool_turn=False) == {
        "logical_soundness": {"score": 4, "reason": ""},
        "tool_call_accuracy": None,
        "information_gain": None,
    }
    for bad in (
        "no json here",
        json.dumps(rating((7, 3, 3))),
        json.dumps(rating((4, 0, 3))),
        '{"logical_soundness": {"score": 4}, "tool_call_accuracy": {"score": 4}}',
        '{"logical_soundness": {"score": true}}',
        '{"logical_soundness": {"score": 3.5}}',
    ):
        with pytest.raises(MalformedCritique):
            parse_scores(bad, tool_turn=True)


# ---------------------------------------------------------------- the critic


@pytest.mark.anyio
@pytest.mark.parametrize(
    "rule, expected",
    [
        (TurnRule(), [(0.75, 1), (None, 0), (None, 0), (0.5, 1)]),
        (TurnRule(failed="penalise", penalty=0.5), [(0.75, 1), (-0.5, 1), (-0.5, 1), (0.5, 1)]),
    ],
)
async def test_critic_scores_become_turn_rewards_and_masks(
    tmp_path: Path, rule: TurnRule, expected: list[tuple[float | None, int]]
) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    progress = JudgeProgress()
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server, rule), progress=progress)
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert [(turn.reward, turn.mask) for turn in judged.turns] == expected
    assert sorted(marker(r) for r in server.requests) == ["THINK-0", "THINK-1", "THINK-3"]  # not the rolled back
    first, second, rolled_back, answer = (turn.critic for turn in judged.turns)
    assert first == {"model": "critic-model", **rating((5, 4, 3)), "passed": True}
    assert second["passed"] is False and second["logical_soundness"]["score"] == 2
    assert rolled_back == {"rolled_back": True}
    assert answer["tool_call_accuracy"] is None and answer["information_gain"] is None  # logical soundness only
    assert answer["logical_soundness"] == {"score": 3, "reason": "logical_soundness is 3"} and answer["passed"]
    assert judged.reward == 1.0 and result["turns_judged"] == 4 and result["critic_failures"] == 0
    assert progress.done == 1 and progress.running == 0 and progress.mean_reward == 1.0
    assert result["masked_turns"] == (2 if rule.failed == "mask" else 0)


@pytest.mark.anyio
async def test_the_critic_reads_the_question_earlier_turns_reasoning_call_and_result(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, tmp_path / "out.jsonl", config(server))
    prompts = {marker(r): prompt_of(r) for r in server.requests}
    second = prompts["THINK-1"]
    assert QUESTION in second
    assert (
        'step 1: search_and_scrape_webpage/google_search {"q": "capital of France"} -> Paris is the capital'
    ) in second
    assert "THINK-1: the next thing to look up." in second and "THINK-0" not in second
    assert (
        "server jina_scrape_llm_summary, tool scrape_and_extract_info, arguments "
        '{"url": "https://example.org/paris", "info_to_extract": "capital"}'
    ) in second
    assert "The page confirms: Paris." in second
    answer = prompts["THINK-3"]
    assert "step 2: jina_scrape_llm_summary/scrape_and_extract_info" in answer and "step 3" not in answer
    assert "No tool call (the runtime had asked for the final answer)" in answer and "\\boxed{Paris}" in answer
    assert not any("cannot solve" in p for p in prompts.values())  # the rolled-back reply is shown nowhere
    assert all(r["model"] == "critic-model" and r["temperature"] == 0.0 for r in server.requests)


@pytest.mark.anyio
async def test_malformed_critiques_are_retried_then_the_turn_is_left_unjudged(tmp_path: Path) -> None:
    bad = [
        "I would rate this turn highly.",
        json.dumps(rating((7, 3, 3))),
        json.dumps({k: v for k, v in rating((4, 4, 4)).items() if k != "information_gain"}),
    ]

    def replies(request: dict[str, Any]) -> str:
        return bad.pop(0) if marker(request) == "THINK-0" else critic_replies(request)

    trajectory = make("t1")
    trajectory.turns[0].mask = 0  # an unjudged turn keeps the mask it came with
    src = write(tmp_path / "in.jsonl", [trajectory])
    with FakeOpenAI(replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    first = judged.turns[0]
    assert sum(marker(r) == "THINK-0" for r in server.requests) == 3  # asked, then retried twice
    assert first.reward is None and first.mask == 0 and first.critic is not None
    assert first.critic["model"] == "critic-model" and "information_gain" in first.critic["error"]
    assert "malformed critique" in first.critic["error"] and "logical_soundness" not in first.critic
    assert judged.turns[1].critic["passed"] is False  # the other turns are judged as usual
    assert result["critic_failures"] == 1


@pytest.mark.anyio
async def test_a_critic_that_times_out_is_retried_then_the_turn_is_left_unjudged(tmp_path: Path) -> None:
    def replies(request: dict[str, Any]) -> Reply | str:
        return Reply(content="{}", delay_s=1.0) if marker(request) == "THINK-0" else critic_replies(request)

    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server, timeout_s=0.2))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.turns[0].reward is None and "did not answer within 0.2 s" in judged.turns[0].critic["error"]
    assert judged.turns[1].critic["passed"] is False and result["critic_failures"] == 1  # the rest is judged


@pytest.mark.anyio
async def test_a_fenced_reply_with_text_around_it_is_read(tmp_path: Path) -> None:
    def fenced(request: dict[str, Any]) -> str:
        return f"Sure, here is my review.\n```json\n{critic_replies(request)}\n```\nLet me know if you need more."

    src = write(tmp_path / "in.jsonl", [make("t1")])
    with FakeOpenAI(fenced) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.turns[0].reward == 0.75 and result["critic_failures"] == 0 and len(server.requests) == 3


@pytest.mark.anyio
async def test_a_template_file_is_used_verbatim_and_filled_in_one_pass(tmp_path: Path) -> None:
    template = tmp_path / "critic.txt"
    template.write_text(
        "Q={question}\nE={earlier_turns}\nR={reasoning}\nC={tool_calls}\nT={tool_results}\n"
        'Keep {braces}, {{doubled}}, {"score": 3} and {question_x}.\n',
        encoding="utf-8",
    )
    question = "Which {reasoning} city?"  # a placeholder inside a value is not filled again
    src = write(tmp_path / "in.jsonl", [make("t1", question=question)])
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, tmp_path / "out.jsonl", config(server, template=template))
    first = next(prompt_of(r) for r in server.requests if marker(r) == "THINK-0")
    assert first == (
        "Q=Which {reasoning} city?\nE=(none: this is the first step)\nR=THINK-0: the next thing to look up.\n"
        'C=1. server search_and_scrape_webpage, tool google_search, arguments {"q": "capital of France"}\n'
        "T=1.\nParis is the capital and largest city of France.\n"
        'Keep {braces}, {{doubled}}, {"score": 3} and {question_x}.\n'
    )


@pytest.mark.anyio
async def test_no_critic_leaves_turns_as_they_are(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    await judge_file(src, tmp_path / "out.jsonl", config(None))
    [judged] = load_trajectories(tmp_path / "out.jsonl")
    assert judged.reward == 1.0
    assert [(t.reward, t.mask, t.critic) for t in judged.turns] == [(None, 1, None)] * 4
