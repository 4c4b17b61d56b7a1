"""Code RL's rewards: `nanbeige judge --grader code-tests` runs each trajectory's program against its problem's
tests in a real sandbox (R_format + R_correctness). The time reward (`--time-reward`, R_time) is
tests/test_code_time_reward.py; `nanbeige problems` and `nanbeige eval code|humaneval` are
tests/test_code_problems.py. The problems and programs here are theirs too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import JAIL
from test_cli import nanbeige
from test_judge import assert_one_error_line, write

from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import load_trajectories, read_records

# ---------------------------------------------------------------- problems and programs

SUM_TWO = {
    "id": "sum-two",
    "statement": "Read two integers a and b on one line and print a + b.",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    "reference_solution": "a, b = map(int, input().split())\nprint(a + b)\n",
    "complexity": "O(1)",
}
ADD = {
    "id": "add",
    "statement": "Write add(a, b), which returns the sum of two integers.",
    "entry_point": "add",
    "tests": [{"args": "[1, 2]", "expected": "3"}, {"args": "[2, 2]", "expected": "4"}],
    "complexity": "O(1)",
}
DOUBLE = {
    "id": "double",
    "statement": "Write double(x), which returns 2 * x.",
    "entry_point": "double",
    "tests": [{"args": "[4]", "expected": "8"}],
}  # no complexity label
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
    return Trajectory(
        question=f"Solve {problem}.",
        id=id,
        group_id=problem,
        rollout_index=0,
        grader="code-tests",
        model="policy",
        turns=[Turn(index=0, assistant={"role": "assistant", "content": content}, finish_reason="stop")],
        stop_reason="answered",
    )


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


def assert_a_solved_program_is_recorded_whole(found: dict[str, Trajectory]) -> None:
    """A program that passes all its tests: every field of its judge record, each test's result and time."""
    right = found["stdio-right"].judge
    assert {
        k: right[k]
        for k in (
            "grader",
            "correct",
            "solved",
            "pass_rate",
            "terms",
            "reward",
            "complexity_ok",
            "time_judge",
            "error",
            "counts",
            "reason",
        )
    } == {
        "grader": "code-tests",
        "correct": True,
        "solved": True,
        "pass_rate": 1.0,
        "terms": {"format": 0.0, "correctness": 1.0, "time": None},
        "reward": 1.0,
        "complexity_ok": None,
        "time_judge": None,
        "error": None,
        "counts": {"pass": 2, "fail": 0, "time-out": 0, "error": 0},
        "reason": "2 of 2 tests passed",
    }
    assert [t["result"] for t in right["tests"]] == ["pass", "pass"]
    assert all(t["seconds"] > 0 for t in right["tests"])  # each test's run is timed
    assert found["function-right"].judge["tests"][0]["result"] == "pass" and found["function-right"].judge["solved"]


def assert_a_half_right_program_names_its_first_failure(found: dict[str, Trajectory]) -> None:
    """Programs that pass one test of two, on standard input and as a function: the pass rate, each test's
    result and what the failing one did."""
    half = found["stdio-half"].judge
    assert (half["solved"], half["correct"], half["pass_rate"]) == (False, False, 0.5)
    assert half["terms"] == {"format": 0.0, "correctness": 0.5, "time": None}
    assert half["tests"][0] == {"result": "pass", "seconds": half["tests"][0]["seconds"]}
    assert half["tests"][1]["result"] == "fail" and half["tests"][1]["detail"] == "printed '3\\n'"
    function_half = found["function-half"].judge
    assert function_half["tests"][1] == {
        "result": "fail",
        "seconds": function_half["tests"][1]["seconds"],
        "detail": "returned 3",
    }
    # the first failing test, for people reading the judged file (the reward is the pass rate alone)
    assert half["failure"] == "test 2 of 2: printed '3\\n'" and found["stdio-right"].judge["failure"] is None
    assert function_half["failure"] == "test 2 of 2: returned 3"


def test_programs_are_run_against_their_problems_tests_and_rewarded_by_pass_rate_and_form(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    src = write(
        tmp_path / "in.jsonl",
        [
            rollout("stdio-right", "sum-two", fenced(SUM_TWO_RIGHT)),
            rollout("stdio-half", "sum-two", fenced(SUM_TWO_HALF)),
            rollout("function-right", "add", fenced(ADD_RIGHT)),
            rollout("function-half", "add", fenced(ADD_HALF)),
            rollout("no-code", "add", "<think>\nEasy.\n</think>\n\nJust return a + b."),
            rollout("wrong-name", "add", fenced("def plus(a, b):\n    return a + b\n")),
            rollout("no-parse", "add", fenced("def add(a, b) return a + b\n")),
            rollout("unknown-problem", "not-in-the-file", fenced(ADD_RIGHT)),
        ],
    )
    out = tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert result.returncode == 0, result.stderr
    assert "8 trajectories judged" in result.stderr and "1 without an outcome reward" in result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {
        "stdio-right": 1.0,
        "stdio-half": 0.5,
        "function-right": 1.0,
        "function-half": 0.5,
        "no-code": -1.0,
        "wrong-name": -1.0,
        "no-parse": -1.0,
        "unknown-problem": None,
    }

    assert_a_solved_program_is_recorded_whole(found)
    assert_a_half_right_program_names_its_first_failure(found)

    for id, why in (
        ("no-code", "no program in a ```python block"),
        ("wrong-name", "does not define `add`"),
        ("no-parse", "does not parse: SyntaxError"),
    ):
        record = found[id].judge
        assert why in record["reason"] and record["failure"] == record["reason"], record
        assert record["terms"] == {"format": -1.0, "correctness": 0.0, "time": None}
        assert record["tests"] == [] and record["solved"] is False  # nothing was run

    unknown = found["unknown-problem"].judge
    assert unknown["correct"] is None and unknown["error"] == f"no problem 'not-in-the-file' in {problems}"


def test_the_format_penalty_is_what_a_malformed_answer_loses(tmp_path: Path) -> None:
    src = write(
        tmp_path / "in.jsonl",
        [
            rollout("no-code", "add", "The answer is a + b."),
            rollout("wrong-name", "add", fenced("def plus(a, b):\n    return a + b\n")),
        ],
    )
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
    src = write(
        tmp_path / "in.jsonl",
        [
            rollout("stdio-killer", "sum-two", fenced(killer)),
            rollout("function-killer", "add", fenced(killer + ADD_RIGHT)),
            rollout("after", "sum-two", fenced(SUM_TWO_RIGHT)),
        ],
    )
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


@pytest.mark.parametrize(
    "lines, where, words",
    [
        ([SUM_TWO, ADD, "{not json"], 3, "not a JSON object"),
        ([{k: v for k, v in ADD.items() if k != "tests"}], 1, "`tests` must be a list of 1 to"),
        ([{**ADD, "tests": []}], 1, "`tests` must be a list of 1 to"),
        (
            [SUM_TWO, {**SUM_TWO, "id": "s2", "tests": [{"args": "[1]", "expected": "2"}]}],
            "2 test 1",
            "a stdin/stdout test is",
        ),
        ([{**ADD, "tests": [*ADD["tests"], {"input": "1 2\n", "output": "3\n"}]}], "1 test 3", "a function test is"),
        ([{**ADD, "time_limit_s": 0}], 1, "`time_limit_s` must be a number of seconds above 0"),
        ([{**ADD, "time_limit_s": "fast"}], 1, "`time_limit_s` must be a number of seconds above 0"),
        ([{**ADD, "tests": [{"args": "[x]", "expected": "3"}]}], "1 test 1", "`args` is not a Python literal: '[x]'"),
        ([{**ADD, "tests": [{"args": "5", "expected": "5"}]}], "1 test 1", "`args` must be a list literal"),
        ([ADD, ADD], 2, "the id 'add' is given to more than one problem"),
    ],
    ids=[
        "bad-json-line-3",
        "no-tests",
        "empty-tests",
        "function-test-in-stdio-problem",
        "stdio-test-in-function-problem",
        "time-limit-0",
        "time-limit-text",
        "args-not-literal",
        "args-not-list",
        "duplicate-id",
    ],
)
def test_a_malformed_problems_file_is_one_error_line_naming_file_and_line(
    tmp_path: Path, lines: list[Any], where: int | str, words: str
) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    src = write(tmp_path / "in.jsonl", [rollout("a", "add", fenced(ADD_RIGHT))])
    out = tmp_path / "out.jsonl"
    result = judge(src, out, "--grader", "code-tests", "--problems", str(problems))
    assert_one_error_line(result, f"{problems}:{where}: {words}")
    assert not out.exists() or not out.read_bytes()
