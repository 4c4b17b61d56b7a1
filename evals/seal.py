"""SEAL-0 (`seal-0.parquet` from `vtllms/sealqa`).

SEAL-0's answers are re-issued from time to time, so every task records the SHA-256 of the file it came from:
scores from different versions of the file are not comparable.

    tasks = load("sealqa/seal-0.parquet")
"""

from __future__ import annotations

from pathlib import Path

from nanbeige.evals.files import file_sha256, read_parquet, text_cell
from nanbeige.evals.tasks import Task


def load(path: str | Path) -> list[Task]:
    """SEAL-0 questions; the id is the file's `id` column where it has one, else the 1-based row number."""
    path = Path(path)
    rows = read_parquet(path, ["question", "answer"], optional=["id"])
    sha256 = file_sha256(path)
    return [
        Task(
            id=text_cell(path, number, row, "id") if "id" in row else str(number),
            question=text_cell(path, number, row, "question"),
            answer=text_cell(path, number, row, "answer"),
            metadata={"file_sha256": sha256},
        )
        for number, row in enumerate(rows, 1)
    ]
