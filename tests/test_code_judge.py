"""Code RL's rewards: `nanbeige judge --grader code-tests` runs each trajectory's program against its problem's
tests in a real sandbox (R_format + R_correctness), `--time-reward` adds the complexity judge's verdict on
solved programs (R_time, behind a scripted loopback judge). `nanbeige problems` and `nanbeige eval code|humaneval`
are tests/test_code_problems.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import JAIL, free_port
from fake_openai import FakeOpenAI
from test_cli import nanbeige
from test_judge import assert_one_error_line, write

from nanbeige.agent.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory_file import load_trajectories, read_records
from nanbeige.evals.complexity import parse_verdict

# ---------------------------------------------------------------- problems and programs

SUM_TWO = {"id": "sum-two", "statement": "Read two integers a and b on one line and print a + b.",
           "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
           "reference_solution": "a, b = map(int, input().split())\nprint(a + b)\n", "complexity": "O(1)"}
ADD = {"id": "add", "statement": "Write add(a, b), which returns the sum of two integers.", "entry_point": "add",
       "tests": [{"args": "[1, 2]", "expected": "3"}, {"args": "[2, 2]", "expected": "4"}], "complexity": "O(1)"}
DOUBLE = {"id": "double", "statement": "Write double(x), which returns 2 * x.", "entry_point": "double",
          "tests": [{"args": "[4]", "expected": "8"}]}  # no complexity label
SUM_TWO_RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_TWO_HALF = "print(3)\n"  # right for "1 2", wrong for "10 -4"
ADD_RIGHT = "def add(a, b):\n    return a + b\n"
ADD_HALF = "def add(a, b):\n    return 3\n"  # right for (1, 2), wrong for (2, 2)
ADD_SLOW = "def add(a, b):\n    total = a\n    for _ in range(b):\n        total += 1\n    return total\n"
DOUBLE_RIGHT = "def double(x):\n    return 2 * x\n"


def problems_file(folder: Path, *rows: dict[str, Any]) -> Path:
    path = folder / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows or (SUM_TWO, ADD, DOUBLE)), encoding="utf-8")
    return path


def fenced(program: str) -> str:
    """A final reply as a model writes it: reasoning, a sentence, the program in a ```python block."""
    return f"<think>\nLet me write it.\n</think>\n\nHere is my solution:\n\n```python\n{program}```\n"


def rollout(id: str, problem: str, content: str) -> Trajectory:
    """A finished rollout of `problem` (its id is the question id) whose one turn replies `content`."""
    return Trajectory(question=f"Solve {problem}.", id=id, group_id=problem, rollout_index=0, grader="code-tests",
                      model="policy", turns=[Turn(index=0, assistant={"role": "assistant", "content": content},
                                                  finish_reason="stop")], stop_reason="answered")


def judge(src: Path, out: Path, *extra: str) -> Any:
    return nanbeige("judge", str(src), "--out", str(out), "--no-critic", *extra, timeout=120)


def judged(out: Path) -> dict[str, Trajectory]:
    return {t.id: t for t in load_trajectories(out)}


def whole_trajectories(out: Path) -> list[str]:
    """The ids of the trajectories in OUT, checking that each is there whole, once (start, turns, end)."""
    records = read_records(out)
    starts = [r["id"] for r in records if r["type"] == "start"]
    ends = [r["trajectory_id"] for r in records if r["type"] == "end"]
    turns = {r["trajectory_id"] for r in records if r["type"] == "turn"}
    assert sorted(starts) == sorted(ends) and len(set(ends)) == len(ends) and turns == set(ends), records
    return sorted(ends)


# ---------------------------------------------------------------- R_format + R_correctness


def test_programs_are_run_against_their_problems_tests_and_rewarded_by_pass_rate_and_form(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    src = write(tmp_path / "in.jsonl", [
        rollout("stdio-right", "sum-two", fenced(SUM_TWO_RIGHT)),
        rollout("stdio-half", "sum-two", fenced(SUM_TWO_HALF)),
        rollout("function-right", "add", fenced(ADD_RIGHT)),
        rollout("function-half", "add", fenced(ADD_HALF)),
        rollout("no-code", "add", "<think>\nEasy.\n</think>\n\nJust return a + b."),
        rollout("wrong-name", "add", fenced("def plus(a, b):\n    return a + b\n")),
        rollout("no-parse", "add", fenced("def add(a, b) return a + b\n")),
        rollout("unknown-problem", "not-in-the-file", fenced(ADD_RIGHT)),
    ])
    out = tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert result.returncode == 0, result.stderr
    assert "8 trajectories judged" in result.stderr and "1 without an outcome reward" in result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {
        "stdio-right": 1.0, "stdio-half": 0.5, "function-right": 1.0, "function-half": 0.5,
        "no-code": -1.0, "wrong-name": -1.0, "no-parse": -1.0, "unknown-problem": None}

    right = found["stdio-right"].judge
    assert {k: right[k] for k in ("grader", "correct", "solved", "pass_rate", "terms", "reward", "complexity_ok",
                                  "time_judge", "error", "counts", "reason")} == {
        "grader": "code-tests", "correct": True, "solved": True, "pass_rate": 1.0,
        "terms": {"format": 0.0, "correctness": 1.0, "time": None}, "reward": 1.0, "complexity_ok": None,
        "time_judge": None, "error": None, "counts": {"pass": 2, "fail": 0, "time-out": 0, "error": 0},
        "reason": "2 of 2 tests passed"}
    assert [t["result"] for t in right["tests"]] == ["pass", "pass"]
    assert all(t["seconds"] > 0 for t in right["tests"])  # each test's run is timed
    assert found["function-right"].judge["tests"][0]["result"] == "pass" and found["function-right"].judge["solved"]

    half = found["stdio-half"].judge
    assert (half["solved"], half["correct"], half["pass_rate"]) == (False, False, 0.5)
    assert half["terms"] == {"format": 0.0, "correctness": 0.5, "time": None}
    assert half["tests"][0] == {"result": "pass", "seconds": half["tests"][0]["seconds"]}
    assert half["tests"][1]["result"] == "fail" and half["tests"][1]["detail"] == "printed '3\\n'"
    function_half = found["function-half"].judge
    assert function_half["tests"][1] == {"result": "fail", "seconds": function_half["tests"][1]["seconds"],
                                         "detail": "returned 3"}
    # the first failing test, for people reading the judged file (the reward is the pass rate alone)
    assert half["failure"] == "test 2 of 2: printed '3\\n'" and right["failure"] is None
    assert function_half["failure"] == "test 2 of 2: returned 3"

    for id, why in (("no-code", "no program in a ```python block"), ("wrong-name", "does not define `add`"),
                    ("no-parse", "does not parse: SyntaxError")):
        record = found[id].judge
        assert why in record["reason"] and record["failure"] == record["reason"], record
        assert record["terms"] == {"format": -1.0, "correctness": 0.0, "time": None}
        assert record["tests"] == [] and record["solved"] is False  # nothing was run

    unknown = found["unknown-problem"].judge
    assert unknown["correct"] is None and unknown["error"] == f"no problem 'not-in-the-file' in {problems}"


def test_the_format_penalty_is_what_a_malformed_answer_loses(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("no-code", "add", "The answer is a + b."),
                                        rollout("wrong-name", "add", fenced("def plus(a, b):\n    return a + b\n"))])
    out = tmp_path / "out.jsonl"
    # no --grader: each trajectory's own grader, code-tests as `collect --bench code` records it
    result = judge(src, out, "--problems", str(problems_file(tmp_path)), "--format-penalty", "0.5")
    assert result.returncode == 0, result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {"no-code": -0.5, "wrong-name": -0.5}
    assert found["wrong-name"].judge["terms"] == {"format": -0.5, "correctness": 0.0, "time": None}


def test_a_second_judge_run_judges_nothing_new(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT)), rollout("b", "add", "no code")])
    out = tmp_path / "out.jsonl"
    first = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert first.returncode == 0, first.stderr
    written = out.read_bytes()
    again = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert again.returncode == 0, again.stderr
    assert "0 trajectories judged" in again.stderr and "(2 were already there" in again.stderr
    assert out.read_bytes() == written and whole_trajectories(out) == ["a", "b"]


@pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")
def test_a_program_that_kills_its_sandbox_is_its_own_failure_and_judge_goes_on(tmp_path: Path) -> None:
    """A program that kills everything it can signal at import (its jail included) used to stop judge at its
    trajectory, on every rerun: read as a broken machine. A known-good program in a fresh jail says the
    machine works: the trajectory gets reward 0 with the reason, the others are judged, a rerun has nothing
    left to do."""
    killer = "import os, signal\nos.kill(-1, signal.SIGKILL)\n"
    src = write(tmp_path / "in.jsonl", [
        rollout("stdio-killer", "sum-two", fenced(killer)),
        rollout("function-killer", "add", fenced(killer + ADD_RIGHT)),
        rollout("after", "sum-two", fenced(SUM_TWO_RIGHT))])
    out = tmp_path / "out.jsonl"
    problems = problems_file(tmp_path)
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert result.returncode == 0, result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {"stdio-killer": 0.0, "function-killer": 0.0, "after": 1.0}
    for id in ("stdio-killer", "function-killer"):
        record = found[id].judge
        assert record["error"] is None and record["solved"] is False and record["counts"]["error"] == 2, record
        assert all("the program killed its sandbox" in test["detail"] for test in record["tests"]), record
    again = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert again.returncode == 0 and "0 trajectories judged" in again.stderr, again.stderr


def test_code_trajectories_without_a_problems_file_are_one_error_line(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    named = judge(src, out, "--grader", "code-tests")
    assert_one_error_line(named, "--grader code-tests", "pass --problems FILE")
    own = judge(src, out)  # no --grader: the trajectory's own grader is code-tests
    assert_one_error_line(own, "1 trajectories are graded by code-tests", "pass --problems FILE")
    assert not out.exists() or not out.read_bytes()


@pytest.mark.parametrize("lines, where, words", [
    ([SUM_TWO, ADD, "{not json"], 3, "not a JSON object"),
    ([{k: v for k, v in ADD.items() if k != "tests"}], 1, "`tests` must be a list of 1 to"),
    ([{**ADD, "tests": []}], 1, "`tests` must be a list of 1 to"),
    ([SUM_TWO, {**SUM_TWO, "id": "s2", "tests": [{"args": "[1]", "expected": "2"}]}], "2 test 1",
     "a stdin/stdout test is"),
    ([{**ADD, "tests": [*ADD["tests"], {"input": "1 2\n", "output": "3\n"}]}], "1 test 3", "a function test is"),
    ([{**ADD, "time_limit_s": 0}], 1, "`time_limit_s` must be a number of seconds above 0"),
    ([{**ADD, "time_limit_s": "fast"}], 1, "`time_limit_s` must be a number of seconds above 0"),
    ([{**ADD, "tests": [{"args": "[x]", "expected": "3"}]}], "1 test 1", "`args` is not a Python literal: '[x]'"),
    ([{**ADD, "tests": [{"args": "5", "expected": "5"}]}], "1 test 1", "`args` must be a list literal"),
    ([ADD, ADD], 2, "the id 'add' is given to more than one problem"),
], ids=["bad-json-line-3", "no-tests", "empty-tests", "function-test-in-stdio-problem",
        "stdio-test-in-function-problem", "time-limit-0", "time-limit-text", "args-not-literal", "args-not-list",
        "duplicate-id"])
def test_a_malformed_problems_file_is_one_error_line_naming_file_and_line(tmp_path: Path, lines: list[Any],
                                                                         where: int | str, words: str) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert_one_error_line(result, f"{problems}:{where}: {words}")
    assert not out.exists() or not out.read_bytes()


# ---------------------------------------------------------------- R_time: the complexity judge


def complexity_judge(request: dict[str, Any]) -> str:
    """A scripted judge: a program with a loop is SLOWER, any other OPTIMAL; it reasons first, drafting a
    verdict line it then revises (the reasoning before `</think>` is not the reply)."""
    prompt = request["messages"][-1]["content"]
    if "for _ in range(b)" in prompt:
        return "It counts up b times.\nComplexity: O(b)\nVerdict: SLOWER"
    return "<think>\nA first guess:\nVerdict: SLOWER\nNo: it does constant work.\n</think>\nIt adds once.\n" \
           "Complexity: O(1)\nVerdict: OPTIMAL"


def test_the_time_reward_asks_the_judge_about_solved_programs_only(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    src = write(tmp_path / "in.jsonl", [
        rollout("optimal", "sum-two", fenced(SUM_TWO_RIGHT)),
        rollout("slower", "add", fenced(ADD_SLOW)),
        rollout("unsolved", "add", fenced(ADD_HALF)),
        rollout("no-code", "add", "a + b"),
    ])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        result = judge(src, out, "--grader", "code-tests", "--problems", str(problems), "--time-reward",
                       "--judge-base-url", server.base_url, "--judge-model", "complexity-judge")
    assert result.returncode == 0, result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {"optimal": 2.0, "slower": 1.0, "unsolved": 0.5,
                                                          "no-code": -1.0}
    optimal, slower = found["optimal"].judge, found["slower"].judge
    assert optimal["terms"] == {"format": 0.0, "correctness": 1.0, "time": 1.0} and optimal["complexity_ok"] is True
    assert optimal["time_judge"] == {"optimal": True, "complexity": "O(1)", "bound": "O(1)",
                                     "model": "complexity-judge"}
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
        result = judge(src, out, "--grader", "code-tests", "--problems", str(problems_file(tmp_path)),
                       "--time-reward", "--time-weight", "0.5", "--judge-base-url", server.base_url)
    assert result.returncode == 0, result.stderr
    [trajectory] = load_trajectories(out)
    assert trajectory.reward == 1.5 and trajectory.judge["terms"]["time"] == 0.5


def test_the_time_reward_with_the_default_judge_and_no_key_is_one_error_line(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--grader", "code-tests", "--problems",
                      str(problems_file(tmp_path)), "--time-reward",
                      env={"NANBEIGE_JUDGE_API_KEY": "", "NANBEIGE_JUDGE_BASE_URL": ""})
    assert_one_error_line(result, "--time-reward asks", "set NANBEIGE_JUDGE_API_KEY", "--judge-base-url")
    assert not out.exists() or not out.read_bytes()


def test_a_problem_without_a_complexity_label_gets_no_time_term_and_the_judge_is_not_asked(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [rollout("unlabelled", "double", fenced(DOUBLE_RIGHT))])
    out = tmp_path / "out.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        result = judge(src, out, "--grader", "code-tests", "--problems", str(problems_file(tmp_path)),
                       "--time-reward", "--judge-base-url", server.base_url)
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
        result = judge(src, out, "--grader", "code-tests", "--problems", str(problems_file(tmp_path)),
                       "--time-reward", "--judge-base-url", server.base_url)
    assert result.returncode == 0, result.stderr
    assert len(server.requests) == 2
    [trajectory] = load_trajectories(out)
    time = trajectory.judge["time_judge"]
    assert time["optimal"] is None and time["error"].startswith("no verdict line in the judge's reply")
    assert trajectory.judge["complexity_ok"] is None and trajectory.judge["solved"] is True


def test_a_program_in_an_earlier_turn_than_the_boxed_summary_is_still_judged(tmp_path: Path) -> None:
    trajectory = rollout("summarised", "add", fenced(ADD_RIGHT))
    trajectory.turns.append(Turn(index=1, assistant={"role": "assistant", "content": "\\boxed{add}"},
                                 instruction="Give the final answer now.", finish_reason="stop"))
    trajectory.answer = "add"  # the boxed answer, as the agent loop extracts it
    src, out = write(tmp_path / "in.jsonl", [trajectory]), tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems_file(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert judged(out)["summarised"].reward == 1.0


def test_a_complexity_judge_that_is_down_stops_the_run_and_a_later_run_resumes(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    # one at a time, in order: the unsolved rollout is judged (no judge needed) before the solved one fails
    src = write(tmp_path / "in.jsonl", [rollout("unsolved", "add", fenced(ADD_HALF)),
                                        rollout("solved", "add", fenced(ADD_RIGHT))])
    out, boxes = tmp_path / "out.jsonl", tmp_path / "boxes"
    down = f"http://127.0.0.1:{free_port()}/v1"
    result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--grader", "code-tests", "--problems",
                      str(problems), "--time-reward", "--judge-base-url", down, "--retries", "0",
                      "--concurrency", "1", env={"NANBEIGE_SANDBOX_DIR": str(boxes)}, timeout=120)
    assert_one_error_line(result, "the complexity judge cannot be used", down, "run again to resume")
    assert whole_trajectories(out) == ["unsolved"]  # what was judged is kept, whole; nothing half-written
    assert boxes.is_dir() and not any(boxes.iterdir())  # the programs ran there; no sandbox is left behind
    with FakeOpenAI(complexity_judge) as server:
        again = judge(src, out, "--grader", "code-tests", "--problems", str(problems), "--time-reward",
                      "--judge-base-url", server.base_url)
    assert again.returncode == 0, again.stderr
    assert "1 trajectory judged" in again.stderr and "(1 was already there" in again.stderr
    assert whole_trajectories(out) == ["solved", "unsolved"] and len(server.requests) == 1
    assert judged(out)["solved"].reward == 2.0


# ---------------------------------------------------------------- reading the judge's verdict


@pytest.mark.parametrize("reply, expected", [
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
], ids=["plain", "slower", "lower-case", "upper-case", "markdown-bold", "list-item-and-full-stop", "two-agreeing",
        "no-verdict", "two-conflicting", "in-a-sentence", "template-echo", "negated", "hedged-in-parentheses",
        "empty-verdict", "empty-reply", "prose-only", "reasoning-before", "complexity-not-at-line-start",
        "reversed-order"])
def test_the_verdict_is_read_from_a_line_of_its_own_and_hedging_is_undecided(
        reply: str, expected: tuple[bool | None, str | None]) -> None:
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
