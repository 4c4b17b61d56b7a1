"""xBench-DeepSearch, editions 2505 and 2510 (`DeepSearch-2505.csv`, `DeepSearch-2510.csv`).

Each row is encrypted with its own `canary` cell (`decrypt_xbench`). The prompt goes to the agent exactly as
written; the reference steps are kept in metadata so they never leak into it.

    tasks = load("xbench-evals/data/DeepSearch-2510.csv")
"""

from __future__ import annotations

from pathlib import Path

from nanbeige.evals.files import decrypt_cell, decrypt_xbench, optional_text_cell, read_csv, text_cell
from nanbeige.evals.tasks import Task

COLUMNS = ["id", "prompt", "answer", "reference_steps", "canary"]


def load(path: str | Path) -> list[Task]:
    path = Path(path)
    tasks = []
    # the official files start with a byte-order mark, which would otherwise stick to the first column's name
    for number, row in enumerate(read_csv(path, COLUMNS, encoding="utf-8-sig"), 1):
        canary = text_cell(path, number, row, "canary")
        steps = ""
        if optional_text_cell(path, number, row, "reference_steps").strip():
            steps = decrypt_cell(path, number, row, "reference_steps", canary, decrypt_xbench)
        tasks.append(
            Task(
                id=text_cell(path, number, row, "id").strip(),
                question=decrypt_cell(path, number, row, "prompt", canary, decrypt_xbench),
                answer=decrypt_cell(path, number, row, "answer", canary, decrypt_xbench),
                metadata={"reference_steps": steps},
            )
        )
    return tasks
