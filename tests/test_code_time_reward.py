"""Code RL's time reward: `nanbeige judge --grader code-tests --time-reward` asks a complexity judge (scripted,
on loopback) about solved programs only (R_time), and how its verdict is read from the reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from fake_openai import FakeOpenAI
from test_cli import nanbeige
from test_code_judge import (
    ADD_HALF,
    ADD_RIGHT,
    ADD_SLOW,
    DOUBLE_RIGHT,
    SUM_TWO,
    SUM_TWO_RIGHT,
    fenced,
    judge,
    judged,
    problems_file,
    rollout,
    whole_trajectories,
)
from test_judge import assert_one_error_line, write

from nanbeige.agent.trajectory.trajectory import Turn
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.complexity import parse_verdict

# ---------------------------------------------------------------- R_time: the complexity judge


def complexity_judge(request: dict[str, Any]) -> str:
    """A scripted judge: a program with a loop is SLOWER, any other OPTIMAL; it reasons first, drafting a
    verdict line it then revises (the reasoning before `</think>` is not the reply)."""
    prompt = request["messages"][-1]["content"]
    if "for _ in range(b)" in prompt:
        return "It counts up b times.\nComplexity: O(b)\nVerdict: SLOWER"
    return (
        "<think>\nA first guess:\nVerdict: SLOWER\nNo: it does constant work.\n</think>\nIt adds once.\n"
        "Complexity: O(1)\nVerdict: OPTIMAL"
    )


def test_the_time_reward_asks_the_judge_about_solved_programs_only(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    src = write(
        tmp_path / "in.jsonl",
        [
            rollout("optimal", "sum-two", fenced(SUM_TWO_RIGHT)),
            rollout("slower", "add", fenced(ADD_SLOW)),
            rollout("unsolved", "add", fenced(ADD_HALF)),
            rollout("no-code", "add", "a + b"),
        ],
    )
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        result = judge(
            src,
            out,
            "--grader",
            "code-tests",
            "--problems",
            str(problems),
            "--time-reward",
            "--judge-base-url",
            server.base_url,
            "--judge-model",
            "complexity-judge",
        )
    assert result.returncode == 0, result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {
        "optimal": 2.0,
        "slower": 1.0,
        "unsolved": 0.5,
        "no-code": -1.0,
    }
    optimal, slower = found["optimal"].judge, found["slower"].judge
    assert optimal["terms"] == {"format": 0.0, "correctness": 1.0, "time": 1.0} and optimal["complexity_ok"] is True
    assert optimal["time_judge"] == {
        "optimal": True,
        "complexity": "O(1)",
        "bound": "O(1)",
        "model": "complexity-judge",
    }
    assert optimal["judge_model"] == "complexity-judge" and optimal["error"] is None
    assert slower["terms"]["time"] == 0.0 and slower["complexity_ok"] is False
    assert slower["time_judge"]["complexity"] == "O(b)" and slower["solved"] is True
    for id in ("unsolved", "no-code"):
        record = found[id].judge
        assert record["terms"]["time"] is None and record["time_judge"] is None and record["complexity_ok"] is None

    assert len(server.requests) == 2  # one question per solved program; none for the others
    prompts = {request["messages"][-1]["content"] for request in server.requests}
    assert all(request["model"] == "complexity-judge" for request in server.requests)
    [about_sum] = [p for p in prompts if "print(a + b)" in p]
    assert "Time-optimal reference bound: O(1)" in about_sum and SUM_TWO["statement"] in about_sum
    assert f"A reference solution with that bound:\n```python\n{SUM_TWO['reference_solution']}" in about_sum
    [about_add] = [p for p in prompts if "for _ in range(b)" in p]
    assert f"```python\n{ADD_SLOW.strip()}\n```" in about_add and "Time-optimal reference bound: O(1)" in about_add
    assert "return 3" not in "".join(prompts)  # the unsolved program was never shown


def test_the_time_weight_scales_the_time_term(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("optimal", "sum-two", fenced(SUM_TWO_RIGHT))])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        result = judge(
            src,
            out,
            "--grader",
            "code-tests",
            "--problems",
            str(problems_file(tmp_path)),
            "--time-reward",
            "--time-weight",
            "0.5",
            "--judge-base-url",
            server.base_url,
        )
    assert result.returncode == 0, result.stderr
    [trajectory] = load_trajectories(out)
    assert trajectory.reward == 1.5 and trajectory.judge["terms"]["time"] == 0.5


def test_the_time_reward_with_the_default_judge_and_no_key_is_one_error_line(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    result = nanbeige(
        "judge",
        str(src),
        "--out",
        str(out),
        "--no-critic",
        "--grader",
        "code-tests",
        "--problems",
        str(problems_file(tmp_path)),
        "--time-reward",
        env={"NANBEIGE_JUDGE_API_KEY": "", "NANBEIGE_JUDGE_BASE_URL": ""},
    )
    assert_one_error_line(result, "--time-reward asks", "set NANBEIGE_JUDGE_API_KEY", "--judge-base-url")
    assert not out.exists() or not out.read_bytes()


def test_a_problem_without_a_complexity_label_gets_no_time_term_and_the_judge_is_not_asked(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("unlabelled", "double", fenced(DOUBLE_RIGHT))])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        result = judge(
            src,
            out,
            "--grader",
            "code-tests",
            "--problems",
            str(problems_file(tmp_path)),
            "--time-reward",
            "--judge-base-url",
            server.base_url,
        )
    assert result.returncode == 0, result.stderr
    assert server.requests == []
    [trajectory] = load_trajectories(out)
    record = trajectory.judge
    assert record["solved"] is True and record["complexity_ok"] is None and trajectory.reward == 1.0
    assert record["time_judge"]["optimal"] is None and "no complexity label" in record["time_judge"]["error"]
    assert record["error"] == record["time_judge"]["error"]
    assert record["terms"]["time"] is None  # undecided: no term at all, rather than a 0


def test_a_judge_reply_without_a_verdict_is_asked_twice_then_recorded_undecided(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("optimal", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(lambda request: "It is probably fine.\nVerdict: OPTIMAL or SLOWER") as server:
        result = judge(
            src,
            out,
            "--grader",
            "code-tests",
            "--problems",
            str(problems_file(tmp_path)),
            "--time-reward",
            "--judge-base-url",
            server.base_url,
        )
    assert result.returncode == 0, result.stderr
    assert len(server.requests) == 2
    [trajectory] = load_trajectories(out)
    time = trajectory.judge["time_judge"]
    assert time["optimal"] is None and time["error"].startswith("no verdict line in the judge's reply")
    assert trajectory.judge["complexity_ok"] is None and trajectory.judge["solved"] is True


def test_a_program_in_an_earlier_turn_than_the_boxed_summary_is_still_judged(tmp_path: Path) -> None:
    trajectory = rollout("summarised", "add", fenced(ADD_RIGHT))
    trajectory.turns.append(
        Turn(
            index=1,
            assistant={"role": "assistant", "content": "\\boxed{add}"},
            instruction="Give the final answer now.",
            finish_reason="stop",
        )
    )
    trajectory.answer = "add"  # the boxed answer, as the agent loop extracts it
    src, out = write(tmp_path / "in.jsonl", [trajectory]), tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems_file(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert judged(out)["summarised"].reward == 1.0


def test_a_complexity_judge_that_is_down_stops_the_run_and_a_later_run_resumes(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    # one at a time, in order: the unsolved rollout is judged (no judge needed) before the solved one fails
    src = write(
        tmp_path / "in.jsonl",
        [rollout("unsolved", "add", fenced(ADD_HALF)), rollout("solved", "add", fenced(ADD_RIGHT))],
    )
    out, boxes = tmp_path / "out.jsonl", tmp_path / "boxes"
    down = f"http://127.0.0.1:{free_port()}/v1"
    result = nanbeige(
        "judge",
        str(src),
        "--out",
        str(out),
        "--no-critic",
        "--grader",
        "code-tests",
        "--problems",
        str(problems),
        "--time-reward",
        "--judge-base-url",
        down,
        "--retries",
        "0",
        "--concurrency",
        "1",
        env={"NANBEIGE_SANDBOX_DIR": str(boxes)},
        timeout=120,
    )
    assert_one_error_line(result, "the complexity judge cannot be used", down, "run again to resume")
    assert whole_trajectories(out) == ["unsolved"]  # what was judged is kept, whole; nothing half-written
    assert boxes.is_dir() and not any(boxes.iterdir())  # the programs ran there; no sandbox is left behind
    with FakeOpenAI(complexity_judge) as server:
        again = judge(
            src,
            out,
            "--grader",
            "code-tests",
            "--problems",
            str(problems),
            "--time-reward",
            "--judge-base-url",
            server.base_url,
        )
    assert again.returncode == 0, again.stderr
    assert "1 trajectory judged" in again.stderr and "(1 was already there" in again.stderr
    assert whole_trajectories(out) == ["solved", "unsolved"] and len(server.requests) == 1
    assert judged(out)["solved"].reward == 2.0


# ---------------------------------------------------------------- reading the judge's verdict


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("The loop runs once per element.\nComplexity: O(n)\nVerdict: OPTIMAL", (True, "O(n)")),
        ("Complexity: O(n^2)\nVerdict: SLOWER", (False, "O(n^2)")),
        ("complexity: o(n)\nverdict: optimal", (True, "o(n)")),
        ("VERDICT: SLOWER", (False, None)),
        ("**Verdict:** OPTIMAL", (True, None)),
        ("- Verdict: OPTIMAL.", (True, None)),
        ("Verdict: SLOWER\n\nTo repeat:\nVerdict: SLOWER", (False, None)),  # lines that agree
        ("It is linear.\nComplexity: O(n)", (None, "O(n)")),  # no verdict line
        ("Complexity: O(n)\nVerdict: OPTIMAL\nVerdict: SLOWER", (None, "O(n)")),  # lines that disagree
        ("Complexity: O(n)\nthe verdict: optimal, though it could be slower", (None, "O(n)")),  # inside a sentence
        ("Verdict: OPTIMAL or SLOWER", (None, None)),  # the prompt's template echoed
        ("Verdict: NOT OPTIMAL", (None, None)),
        ("Verdict: optimal (probably)", (None, None)),
        ("Complexity: O(n)\nVerdict:", (None, "O(n)")),
        ("", (None, None)),
        ("I cannot tell.", (None, None)),
        ("<think>\nThe sort dominates.\n</think>\nComplexity: O(n log n)\nVerdict: OPTIMAL", (True, "O(n log n)")),
        ("Time complexity: O(n)\nVerdict: OPTIMAL", (True, None)),  # the complexity line must start the line
        ("Verdict: SLOWER\nComplexity: O(2^n)", (False, "O(2^n)")),  # in either order
    ],
    ids=[
        "plain",
        "slower",
        "lower-case",
        "upper-case",
        "markdown-bold",
        "list-item-and-full-stop",
        "two-agreeing",
        "no-verdict",
        "two-conflicting",
        "in-a-sentence",
        "template-echo",
        "negated",
        "hedged-in-parentheses",
        "empty-verdict",
        "empty-reply",
        "prose-only",
        "reasoning-before",
        "complexity-not-at-line-start",
        "reversed-order",
    ],
)
def test_the_verdict_is_read_from_a_line_of_its_own_and_hedging_is_undecided(
    reply: str, expected: tuple[bool | None, str | None]
) -> None:
    assert parse_verdict(reply) == expected


def test_reasoning_that_drafts_another_verdict_is_a_conflict_unless_the_endpoint_cut_it_off() -> None:
    reply = "<think>\nA first guess:\nVerdict: SLOWER\nNo.\n</think>\nComplexity: O(1)\nVerdict: OPTIMAL"
    assert parse_verdict(reply) == (None, "O(1)")  # read whole: two verdicts disagree
    assert parse_verdict(reply.rsplit("</think>", 1)[-1]) == (True, "O(1)")  # as `evals.endpoint.chat` hands it


def test_the_complexity_is_capped_and_a_none_reply_is_undecided() -> None:
    optimal, complexity = parse_verdict(f"Complexity: O({'n * ' * 60}n)\nVerdict: OPTIMAL")
    assert optimal is True and complexity is not None and len(complexity) == 100
    assert parse_verdict(None) == (None, None)  # type: ignore[arg-type]


def test_a_markdown_complexity_line_is_recorded_without_its_markup() -> None:
    assert parse_verdict("**Complexity:** O(n log n)\n**Verdict:** SLOWER") == (False, "O(n log n)")
