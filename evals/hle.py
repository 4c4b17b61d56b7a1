"""Humanity's Last Exam: the official test parquet (text-only questions kept) and the 500-question text subset
(WebThinker's `test.json`, a JSON array).

    tasks = load("hle/data/test-00000-of-00001.parquet")
    tasks = load("WebThinker/data/HLE/test.json")
"""

from __future__ import annotations

from pathlib import Path

from nanbeige.evals.files import read_json_array, read_parquet, text_cell
from nanbeige.evals.tasks import LoadError, Task

# `image` is read only to tell text-only questions apart; the other image columns are never loaded
PARQUET_COLUMNS = ["id", "question", "image", "answer", "answer_type", "category"]


def load(path: str | Path) -> list[Task]:
    """HLE questions from the official parquet (questions with an image are dropped) or the 500-question JSON."""
    path = Path(path)
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    if path.suffix == ".parquet":
        rows = read_parquet(path, PARQUET_COLUMNS, optional=["raw_subject"])
        tasks = [_task(path, number, row, "question") for number, row in enumerate(rows, 1) if not row["image"]]
        if not tasks:
            raise LoadError(f"{path}: no text-only questions (every row has an image)")
        return tasks
    if path.suffix == ".json":
        return [_task(path, number, row, "Question") for number, row in enumerate(read_json_array(path), 1)]
    raise LoadError(f"{path}: not an HLE file (expected the official .parquet or the 500-question .json)")


def _task(path: Path, number: int, row: dict, question_field: str) -> Task:
    return Task(
        id=text_cell(path, number, row, "id"),
        question=text_cell(path, number, row, question_field),
        answer=text_cell(path, number, row, "answer"),
        level=text_cell(path, number, row, "category"),
        # graders pick the exact-answer or multiple-choice treatment from answer_type
        metadata={"answer_type": text_cell(path, number, row, "answer_type"), "raw_subject": row.get("raw_subject")},
    )
