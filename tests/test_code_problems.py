"""Code problems from the command line: `nanbeige problems` converts and checks problem files, and
`nanbeige eval code|humaneval` scores the agent by the problems' tests (the judge's side is
tests/test_code_judge.py, whose problems and programs these share)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import JAIL
from fake_openai import FakeOpenAI, Reply
from test_cli import nanbeige
from test_code_judge import (
    ADD,
    ADD_HALF,
    ADD_RIGHT,
    DOUBLE,
    SUM_TWO,
    SUM_TWO_RIGHT,
    fenced,
    problems_file,
)
from test_judge import assert_one_error_line

# ---------------------------------------------------------------- `nanbeige problems`


def test_humaneval_converts_to_164_problems_that_read_back(tmp_path: Path) -> None:
    out = tmp_path / "humaneval.jsonl"
    converted = nanbeige("problems", "humaneval", "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    count = re.search(
        r"164 problems \(164 function style, 0 stdin/stdout\), (\d+) tests; (\d+) problems checked "
        r"by asserts",
        converted.stderr,
    )
    assert count and f"written to {out}" in converted.stderr, converted.stderr
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 164 and len({row["id"] for row in rows}) == 164
    assert sum(len(row["tests"]) for row in rows) == int(count.group(1))
    assert sum(any("assert" in test for test in row["tests"]) for row in rows) == int(count.group(2))
    assert all(row["entry_point"] and row["reference_solution"] and "complexity" not in row for row in rows)
    back = nanbeige("problems", str(out))
    assert back.returncode == 0, back.stderr
    assert f"164 problems (164 function style, 0 stdin/stdout), {count.group(1)} tests" in back.stderr
    assert "written to" not in back.stderr


def test_problems_refuses_to_write_over_the_file_it_checks(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    before = problems.read_bytes()
    result = nanbeige("problems", str(problems), "--out", str(problems))
    assert_one_error_line(result, "--out must be another file")
    assert problems.read_bytes() == before


def test_problems_out_in_a_missing_folder_is_one_error_line(tmp_path: Path) -> None:
    result = nanbeige("problems", "humaneval", "--out", str(tmp_path / "missing" / "humaneval.jsonl"))
    assert_one_error_line(result, str(tmp_path / "missing"))


# ---------------------------------------------------------------- `nanbeige eval code|humaneval`


def eval_command(bench: str, out: Path, server: FakeOpenAI, *extra: str) -> list[str]:
    return ["eval", bench, "--out", str(out), "-k", "1", "--base-url", server.base_url, "--no-default-servers", *extra]


def code_model(replies: dict[str, str]) -> Any:
    """A model that answers a question holding a key of `replies` with that reply (again on the summary turn,
    which asks for the final answer)."""

    def reply(request: dict[str, Any]) -> Reply:
        question = request["messages"][1]["content"]
        [content] = [content for key, content in replies.items() if key in question]
        return Reply(content=content)

    return reply


def test_eval_code_scores_the_fraction_of_problems_solved(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    out = tmp_path / "out"
    model = code_model(
        {
            SUM_TWO["statement"]: fenced(SUM_TWO_RIGHT),
            ADD["statement"]: fenced(ADD_HALF),
            DOUBLE["statement"]: "Return 2 * x.",
        }
    )
    with FakeOpenAI(model) as server:
        result = nanbeige(*eval_command("code", out, server, "--data", str(problems)), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {row["task_id"]: row for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert {id: (row["correct"], row["grader"]) for id, row in rows.items()} == {
        "sum-two": (True, "code-tests"),
        "add": (False, "code-tests"),
        "double": (False, "code-tests"),
    }
    assert rows["sum-two"]["reason"] == "pass rate 1.000 (2 pass)"
    assert rows["add"]["reason"] == "pass rate 0.500 (1 pass, 1 fail)"
    assert rows["double"]["reason"] == "the answer has no program in a ```python block"
    report = json.loads((out / "report.json").read_text())
    assert (report["grader"], report["tasks"], report["avg_at_k"]) == ("code-tests", 3, round(100 / 3, 2))
    assert report["no_answer"] == 1  # the run without a program; the prediction of the others is their program
    assert rows["sum-two"]["prediction"] == SUM_TWO_RIGHT
    assert f"{100 / 3:.2f}%" in result.stdout
    question = server.requests[0]["messages"][1]["content"]
    assert "Give your final program in one ```python code block." in question


def test_eval_humaneval_runs_the_first_problems_canonical_solutions_to_full_marks(tmp_path: Path) -> None:
    from nanbeige.evals.humaneval import humaneval_problems

    first = humaneval_problems()[:3]
    out = tmp_path / "out"
    model = code_model({problem.statement: fenced(problem.reference_solution or "") for problem in first})
    with FakeOpenAI(model) as server:
        result = nanbeige(*eval_command("humaneval", out, server, "--limit", "3"), timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(row["task_id"] for row in rows) == sorted(problem.id for problem in first)
    assert all(row["correct"] is True and row["grader"] == "code-tests" for row in rows), rows
    report = json.loads((out / "report.json").read_text())
    assert (report["grader"], report["tasks"], report["avg_at_k"]) == ("code-tests", 3, 100.0)


def test_a_program_given_before_the_summary_turn_is_still_graded(tmp_path: Path) -> None:
    problems = problems_file(tmp_path, ADD)
    out = tmp_path / "out"

    def model(request: dict[str, Any]) -> str:
        # the summary turn asks for the final answer in \boxed{} without punctuation: the model obeys
        return fenced(ADD_RIGHT) if len(request["messages"]) == 2 else "\\boxed{add}"

    with FakeOpenAI(model) as server:
        result = nanbeige(*eval_command("code", out, server, "--data", str(problems)), timeout=120)
    assert result.returncode == 0, result.stderr
    [row] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["correct"] is True, row


@pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")
def test_eval_counts_a_program_that_kills_its_sandbox_as_wrong_not_as_a_failed_run(tmp_path: Path) -> None:
    problems = problems_file(tmp_path, SUM_TWO)
    out = tmp_path / "out"
    model = code_model({SUM_TWO["statement"]: fenced("import os, signal\nos.kill(-1, signal.SIGKILL)\n")})
    with FakeOpenAI(model) as server:
        result = nanbeige(*eval_command("code", out, server, "--data", str(problems)), timeout=120)
    assert result.returncode == 0, result.stderr
    [row] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (row["correct"], row["reason"]) == (False, "pass rate 0.000 (2 error)"), row
    report = json.loads((out / "report.json").read_text())
    assert (report["tasks"], report["avg_at_k"]) == (1, 0.0), report
