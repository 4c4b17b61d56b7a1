"""Questions files: the format `nanbeige collect`, `nanbeige loop` and `nanbeige eval questions` read, JSONL
(one object a line) or CSV (a header row) with `question`, `answer` and an optional `id`. The same file gives the
same ids to each of them, so that a held-out set can be checked against the training questions and its eval
rows be matched to them."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from nanbeige.evals.files import read_csv, read_jsonl
from nanbeige.evals.tasks import LoadError, Task


def question_id(text: str) -> str:
    """A stable id for a question given without one: the same text gives the same id on every run."""
    return "q" + hashlib.sha256(text.encode()).hexdigest()[:12]


def read_questions(path: Path) -> list[Task]:
    """Questions from JSONL (one object a line) or CSV (a header row): `question`, optional `answer`
    and `id`. Errors name the file and the row."""
    rows = read_csv(path, ["question"], encoding="utf-8-sig") if path.suffix.lower() == ".csv" else read_jsonl(path)
    tasks = []
    for number, row in enumerate(rows, 1):
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise LoadError(f"{path} row {number}: no `question` (each row needs one; `answer` and `id` are optional)")
        for field in ("id", "answer"):  # text, or a number as CSV and hand-written JSON give them
            if isinstance(row.get(field), bool) or not isinstance(row.get(field), str | int | float | None):
                raise LoadError(f"{path} row {number}: `{field}` is a {type(row[field]).__name__}, expected text")
        answer = row.get("answer")
        tasks.append(
            Task(
                id=str(row.get("id") or question_id(question)),
                question=question,
                answer="" if answer is None else str(answer),
            )
        )
    ids = Counter(task.id for task in tasks)
    if len(ids) != len(tasks):
        twice = ids.most_common(1)[0][0]
        *before, last = [str(row) for row, task in enumerate(tasks, 1) if task.id == twice]
        raise LoadError(
            f"{path}: the id {twice!r} is given to more than one question (rows {', '.join(before)} and {last})"
        )
    return tasks


def load(path: Path) -> list[Task]:
    """`nanbeige eval questions --data FILE`: the file's questions as tasks, in its order."""
    return read_questions(path)
