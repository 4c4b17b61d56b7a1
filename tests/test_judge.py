"""`trainer.judge`: outcome rewards from the evals' graders, and the out file (whole trajectories, token fields
untouched, resumable), with the hand-made trajectories and scripted critic the judge's other tests share
(tests/test_critic.py, tests/test_judge_down.py)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply

from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories, read_records
from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.trainer.critic import CRITIC_ENDPOINT, TurnRule
from nanbeige.trainer.judge_config import JudgeError, JudgeRunConfig
from nanbeige.trainer.rewards import judge_file

QUESTION = "What is the capital of France?"
TOKEN_FIELDS = ("segment", "prompt_keep", "prompt_delta_ids", "prefix_hash", "completion_ids", "logprobs")
# Critic scores (logical soundness, tool-call accuracy, information gain) by the marker in a turn's reasoning.
SCORES = {"THINK-0": (5, 4, 3), "THINK-1": (2, 5, 5), "THINK-3": (3, None, None)}


# ---------------------------------------------------------------- hand-made trajectories


def token_fields(index: int) -> dict[str, Any]:
    """Token records with floats that only survive an exact round trip."""
    return {
        "segment": 0,
        "prompt_keep": 10 * index,
        "prompt_delta_ids": [151644 + index, 8948, 198, 0],
        "prefix_hash": f"{index:064x}",
        "completion_ids": [1, 22, 333, 4444 + index],
        "logprobs": [-0.1234567890123457, -1e-07, 0.0, -3.3333333333333335 - index],
    }


def tool_turn(index: int, server: str, tool: str, arguments: dict[str, Any], result: str) -> Turn:
    content = f"<think>\nTHINK-{index}: the next thing to look up.\n</think>\n\n<use_mcp_tool>...</use_mcp_tool>"
    return Turn(
        index=index,
        assistant={"role": "assistant", "content": content},
        tool_calls=[ToolCall(server, tool, arguments)],
        tool_results=[ToolResult(result, latency_s=0.5)],
        finish_reason="stop",
        usage={"prompt_tokens": 100, "completion_tokens": 20},
        **token_fields(index),
    )


def standard_turns() -> list[Turn]:
    """A search, a scrape, a rolled-back refusal and the summary turn with the boxed answer."""
    return [
        tool_turn(
            0,
            "search_and_scrape_webpage",
            "google_search",
            {"q": "capital of France"},
            "Paris is the capital and largest city of France.",
        ),
        tool_turn(
            1,
            "jina_scrape_llm_summary",
            "scrape_and_extract_info",
            {"url": "https://example.org/paris", "info_to_extract": "capital"},
            "The page confirms: Paris.",
        ),
        Turn(
            index=2,
            assistant={"role": "assistant", "content": "<think>THINK-2</think> I'm sorry, I cannot solve"},
            format_error="rolled back: the reply refused the task",
            rolled_back=True,
            **token_fields(2),
        ),
        Turn(
            index=3,
            assistant={
                "role": "assistant",
                "content": "<think>\nTHINK-3: both sources agree.\n</think>\n\n\\boxed{Paris}",
            },
            instruction="Give the final answer now.",
            **token_fields(3),
        ),
    ]


def make(
    id: str,
    answer: str | None = "Paris",
    reference: str | None = "Paris",
    grader: str | None = "gaia-exact",
    stop_reason: str | None = "answered",
    question: str = QUESTION,
) -> Trajectory:
    return Trajectory(
        question=question,
        id=id,
        group_id="q1",
        rollout_index=0,
        reference_answer=reference,
        grader=grader,
        model="policy",
        turns=standard_turns(),
        answer=answer,
        stop_reason=stop_reason,
    )  # type: ignore[arg-type]


def write(path: Path, trajectories: list[Trajectory], finished: bool = True) -> Path:
    writer = TrajectoryWriter(path)
    for trajectory in trajectories:
        writer.start(trajectory)
        for turn in trajectory.turns:
            writer.turn(trajectory, turn)
        if finished and trajectory.stop_reason is not None:
            writer.end(trajectory)
    writer.close()
    return path


# ---------------------------------------------------------------- a scripted critic


def rating(scores: tuple[int | None, int | None, int | None]) -> dict[str, Any]:
    names = ("logical_soundness", "tool_call_accuracy", "information_gain")
    return {
        name: None if score is None else {"score": score, "reason": f"{name} is {score}"}
        for name, score in zip(names, scores)
    }


def prompt_of(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"]


def marker(request: dict[str, Any]) -> str:
    found = re.search(r"THINK-\d", prompt_of(request))
    assert found, "every critic prompt shows the turn's reasoning"
    return found.group(0)


def critic_replies(request: dict[str, Any]) -> str:
    return json.dumps(rating(SCORES[marker(request)]))


def config(server: FakeOpenAI | None, rule: TurnRule | None = None, **critic: Any) -> JudgeRunConfig:
    settings = (
        replace(CRITIC_ENDPOINT, base_url=server.base_url, model="critic-model", retries=2, retry_wait_s=0.0, **critic)
        if server
        else None
    )
    return JudgeRunConfig(critic=settings, rule=rule or TurnRule(), concurrency=4, no_critic=server is None)


# ---------------------------------------------------------------- outcome rewards


@pytest.mark.anyio
async def test_outcome_reward_with_gaia_exact_and_without_a_reference(tmp_path: Path) -> None:
    src = write(
        tmp_path / "in.jsonl",
        [
            make("right", answer="paris"),
            make("wrong", answer="Lyon"),
            make("none", answer=None),
            make("unknown", reference=None),
        ],
    )
    result = await judge_file(src, tmp_path / "out.jsonl", config(None))
    judged = {t.id: t for t in load_trajectories(tmp_path / "out.jsonl")}
    assert {k: t.reward for k, t in judged.items()} == {"right": 1.0, "wrong": 0.0, "none": 0.0, "unknown": None}
    assert judged["right"].judge == {
        "grader": "gaia-exact",
        "judge_model": None,
        "correct": True,
        "extracted": "paris",
        "reason": "",
        "error": None,
    }
    assert judged["wrong"].judge["correct"] is False and "'Lyon'" in judged["wrong"].judge["reason"]
    assert judged["unknown"].judge == {"error": "no reference answer"}
    assert result["judged"] == 4 and result["rewarded"] == 3 and result["mean_reward"] == round(1 / 3, 4)
    assert result["outcome_errors"] == 1 and result["turns_judged"] == 0


@pytest.mark.anyio
async def test_a_judge_profile_grades_and_an_undecided_judge_gives_no_reward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from nanbeige.evals import judges

    # the reference harness waits 5 s between its 10 tries for a verdict; not here
    monkeypatch.setitem(
        judges.PROFILES, "equivalent/reference", replace(judges.PROFILES["equivalent/reference"], wait_s=0.0)
    )

    def judge(request: dict[str, Any]) -> str:
        return "Correct" if "Predicted answer: The city of Paris" in prompt_of(request) else "Perhaps."

    src = write(tmp_path / "in.jsonl", [make("yes", answer="The city of Paris"), make("undecided", answer="Lutetia")])
    with FakeOpenAI(judge) as server:
        run = config(None)
        run.grader = "equivalent/reference"
        run.judge = replace(JUDGE_ENDPOINT, base_url=server.base_url, model="judge-model", retries=1, retry_wait_s=0.0)
        await judge_file(src, tmp_path / "out.jsonl", run)
    judged = {t.id: t for t in load_trajectories(tmp_path / "out.jsonl")}
    assert judged["yes"].reward == 1.0 and judged["yes"].judge["judge_model"] == "judge-model"
    assert judged["undecided"].reward is None  # never silently 0
    assert judged["undecided"].judge["correct"] is None and "no verdict" in judged["undecided"].judge["error"]
    assert len(server.requests) == 1 + 10  # one verdict, then a reply without one asked for 10 times


# ---------------------------------------------------------------- the out file


@pytest.mark.anyio
async def test_trajectories_are_written_whole_with_token_fields_byte_identical(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1"), make("t2", answer="Lyon")])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(critic_replies) as server:
        await judge_file(src, out, config(server))
    before, after = read_records(src), read_records(out)
    key = lambda r: (r.get("id") or r["trajectory_id"], r["type"], r.get("index", -1))  # noqa: E731
    assert sorted(map(key, before)) == sorted(map(key, after))
    by_key = {key(r): r for r in after}
    for record in before:
        judged = by_key[key(record)]
        added = {"turn": {"reward", "mask", "critic"}, "end": {"reward", "judge"}, "start": set()}[record["type"]]
        unchanged = {k: v for k, v in record.items() if k not in added}
        assert {k: v for k, v in judged.items() if k not in added} == unchanged
        for name in TOKEN_FIELDS if record["type"] == "turn" else ():
            assert orjson.dumps(judged[name]) == orjson.dumps(record[name])
    # The very bytes, too: each turn line's token arrays appear in the out file exactly as in the input.
    arrays = re.compile(rb'"(?:prompt_delta_ids|completion_ids|logprobs)":\[[^\]]*\]')
    spans_in = [m.group(0) for line in src.read_bytes().splitlines() for m in arrays.finditer(line)]
    spans_out = [m.group(0) for line in out.read_bytes().splitlines() for m in arrays.finditer(line)]
    assert len(spans_in) == 24 and sorted(spans_in) == sorted(spans_out)


@pytest.mark.anyio
async def test_unfinished_and_cut_short_trajectories_are_skipped(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write(src, [make("running", stop_reason=None)], finished=False)
    write(
        src,
        [
            make("ok"),
            make("interrupted", stop_reason="interrupted"),
            make("crashed", stop_reason="crashed"),
            make("model_error", stop_reason="model_error"),
            make("max_turns", stop_reason="max_turns"),
        ],
    )
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, tmp_path / "out.jsonl", config(server))
    assert sorted(t.id for t in load_trajectories(tmp_path / "out.jsonl")) == ["max_turns", "ok"]  # as finished
    assert result["skipped"] == 4 and result["judged"] == 2 and len(server.requests) == 6


@pytest.mark.anyio
async def test_judging_resumes_past_a_torn_line_without_judging_anything_twice(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("a"), make("b"), make("c")])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(critic_replies) as server:
        await judge_file(write(tmp_path / "only_a.jsonl", [make("a")]), out, config(server))
    assert len(server.requests) == 3
    write(out, [make("b")], finished=False)  # a judge run killed while writing b ...
    with open(out, "ab") as file:
        file.write(b'{"type": "turn", "trajectory_id": "b", "ind')  # ... mid-line
    notices: list[str] = []
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, out, config(server), notices.append)
    assert len(server.requests) == 6 and result["judged"] == 2 and result["already_judged"] == 1
    assert notices == [f"resuming: 1 trajectories already judged in {out}"]
    judged = load_trajectories(out)
    assert sorted(t.id for t in judged) == ["a", "b", "c"]
    assert all(t.reward == 1.0 and len(t.turns) == 4 and t.turns[0].critic for t in judged)
    ends = [r["trajectory_id"] for r in read_records(out) if r["type"] == "end"]
    assert sorted(ends) == ["a", "b", "c"]
    size = out.stat().st_size
    with FakeOpenAI(critic_replies) as server:
        result = await judge_file(src, out, config(server))
    assert server.requests == [] and result["judged"] == 0 and out.stat().st_size == size


# ---------------------------------------------------------------- what the user must fix


@pytest.mark.anyio
async def test_what_the_user_must_fix_is_one_error(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [make("t1")])
    out = tmp_path / "out.jsonl"
    with pytest.raises(JudgeError, match="--no-critic"):
        await judge_file(src, out, JudgeRunConfig())
    with pytest.raises(JudgeError, match="--grader must be"):
        await judge_file(src, out, JudgeRunConfig(grader="nope", no_critic=True))
    with pytest.raises(JudgeError, match="another file"):
        await judge_file(src, src, JudgeRunConfig(no_critic=True))
    with pytest.raises(JudgeError, match="NANBEIGE_JUDGE_API_KEY"):
        await judge_file(src, out, JudgeRunConfig(grader="browsecomp/reference", no_critic=True))
    unreachable = replace(
        CRITIC_ENDPOINT,
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        api_key="sk-critic-secret-key",
        retries=1,
        retry_wait_s=0.0,
    )
    with pytest.raises(JudgeError, match="critic unreachable") as raised:
        await judge_file(src, out, JudgeRunConfig(critic=unreachable))
    assert "sk-critic" not in str(raised.value) and "sk-critic" not in repr(unreachable)
    assert not out.exists() or not out.read_bytes()  # nothing half-judged was written
    with FakeOpenAI([Reply(status=401)] * 3) as server:
        refused = replace(CRITIC_ENDPOINT, base_url=server.base_url, api_key="sk-critic-secret-key", retry_wait_s=0.0)
        with pytest.raises(JudgeError, match="HTTP 401"):
            await judge_file(src, out, JudgeRunConfig(critic=refused))
    assert len(server.requests) == 1  # a refused key is not retried


# ---------------------------------------------------------------- one error line, for the command line's tests


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_error_line(result: Any, *words: str) -> str:
    """Exit 1 and one `error:` line holding every word: no traceback, no exception group."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr, result.stderr
    [line] = error_lines(result.stderr)
    assert "crashed" not in line
    for word in words:
        assert word in line, line
    return line
