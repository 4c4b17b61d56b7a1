"""The loop's questions are checked before anything runs: ids given twice, questions without an answer to
grade against, and questions also in the held-out set (`--held-out`) are each one line naming the rows, and
no loop folder is made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def rows(*questions: dict[str, str]) -> str:
    return "".join(json.dumps(question) + "\n" for question in questions)


def loop(tmp_path: Path, questions: str, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "questions.jsonl"
    path.write_text(questions)
    # nothing may run: the model named does not exist, and the refusal must come before it is looked for
    command = [NANBEIGE, "loop", "--questions", str(path), "--model", str(tmp_path / "no-model"), "--backend"]
    command += ["transformers", "--no-default-servers", "--no-critic", "--sync", "none", "--out", str(tmp_path / "out")]
    return subprocess.run([*command, *extra], capture_output=True, text=True, timeout=60)


def refused(done: subprocess.CompletedProcess, tmp_path: Path) -> str:
    """The one line of the refusal; checks that it is one line, without a traceback, and that nothing ran."""
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert not (tmp_path / "out").exists()
    return lines[0]


def test_ids_given_twice_are_refused_naming_their_rows(tmp_path: Path) -> None:
    questions = rows(
        {"id": "a", "question": "one", "answer": "1"},
        {"id": "b", "question": "two", "answer": "2"},
        {"id": "a", "question": "three", "answer": "3"},
    )
    line = refused(loop(tmp_path, questions), tmp_path)
    assert "'a'" in line and "rows 1 and 3" in line


def test_questions_without_an_answer_are_refused_naming_their_rows(tmp_path: Path) -> None:
    questions = rows(
        {"id": "a", "question": "one", "answer": "1"},
        {"id": "b", "question": "two"},
        {"id": "c", "question": "three", "answer": " "},
    )
    line = refused(loop(tmp_path, questions), tmp_path)
    assert "rows 2 and 3" in line and "answer" in line


@pytest.mark.parametrize(
    "held_out",
    [
        {"id": "b", "question": "a different text", "answer": "x"},  # the same id
        {"id": "z", "question": "  What is   TWO? ", "answer": "2"},  # the same text, spaced and cased otherwise
    ],
)
def test_a_held_out_question_in_the_training_questions_is_refused_naming_both_rows(
    tmp_path: Path, held_out: dict[str, str]
) -> None:
    questions = rows(
        {"id": "a", "question": "What is one?", "answer": "1"}, {"id": "b", "question": "What is two?", "answer": "2"}
    )
    path = tmp_path / "held-out.jsonl"
    path.write_text(rows({"id": "y", "question": "Other?", "answer": "o"}, held_out))
    line = refused(loop(tmp_path, questions, "--held-out", str(path)), tmp_path)
    assert "questions.jsonl row 2" in line and "held-out.jsonl row 2" in line
