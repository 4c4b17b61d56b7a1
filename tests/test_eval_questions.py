"""`nanbeige eval questions --data FILE`: a questions file of collect's and the loop's own format evaluated as a
benchmark, graded by the grader the loop's reward uses (`gaia-exact`), with the same ids collect gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI, Reply

from nanbeige.evals.out_folder import read_results
from nanbeige.evals.questions import question_id

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")

QUESTIONS = [
    {"id": "capital", "question": "Which city is the capital of France?", "answer": "Paris"},
    {"question": "What is six times seven?", "answer": "42"},  # no id: collect's id for its text
    {"id": 7, "question": "How many days are in a week?", "answer": "7"},
]
REPLIES = {"Which city": "paris.", "What is six": "41", "How many days": "7.0"}


def model(request: dict[str, Any]) -> Reply:
    asked = request["messages"][1]["content"]
    said = next((answer for start, answer in REPLIES.items() if asked.startswith(start)), None)
    if said is None:  # the summary turn: the answer given before, again
        said = request["messages"][-2]["content"].split("boxed{")[-1].split("}")[0]
    return Reply(content=f"<think>\nI know this.\n</think>\n\\boxed{{{said}}}")


def test_a_questions_file_is_evaluated_with_the_loops_grader_and_collects_ids(tmp_path: Path) -> None:
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS))
    out = tmp_path / "out"
    with FakeOpenAI(model) as server:
        done = subprocess.run(
            [NANBEIGE, "eval", "questions", "--data", str(data), "--out", str(out), "-k", "2", "--base-url"]
            + [server.base_url, "--model", "fake", "--no-default-servers"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    rows = read_results(out)
    assert {row["grader"] for row in rows} == {"gaia-exact"}
    right = {(row["task_id"], row["run"]) for row in rows if row["correct"]}
    # "paris." is Paris and "7.0" is 7 to GAIA's scorer; 41 is not 42
    assert right == {("capital", 0), ("capital", 1), ("7", 0), ("7", 1)}
    assert {row["task_id"] for row in rows} == {"capital", question_id("What is six times seven?"), "7"}
    assert "graded by gaia-exact" in done.stdout and "95% interval (bootstrap over tasks)" in done.stdout


def test_a_questions_file_with_ids_given_twice_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join(json.dumps({"id": "a", "question": q, "answer": "x"}) + "\n" for q in ("one", "two")))
    done = subprocess.run(
        [NANBEIGE, "eval", "questions", "--data", str(data), "--out", str(tmp_path / "out"), "--no-default-servers"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "the id 'a' is given to more than one question (rows 1 and 2)" in done.stderr
    assert not (tmp_path / "out").exists()
