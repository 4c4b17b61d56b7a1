"""BrowseComp (`browse_comp_test_set.csv`) and BrowseComp-ZH (`browsecomp-zh-encrypted.xlsx`).

Both files are encrypted row by row with the row's own `canary` cell as the password (`decrypt_browsecomp`).
Neither has an id column, so a question's id is its 1-based row number.

    tasks = load("browse_comp_test_set.csv")
    tasks = load_zh("browsecomp-zh-encrypted.xlsx")
"""

from __future__ import annotations

from pathlib import Path

from nanbeige.evals.files import decrypt_browsecomp, decrypt_cell, read_csv, read_xlsx, text_cell
from nanbeige.evals.tasks import Task

COLUMNS = ["problem", "answer", "canary"]
ZH_COLUMNS = ["Topic", "Question", "Answer", "canary"]


def load(path: str | Path) -> list[Task]:
    """BrowseComp: `problem` and `answer` encrypted; `problem_topic`, where the file has it, is plain text."""
    path = Path(path)
    tasks = []
    for number, row in enumerate(read_csv(path, COLUMNS), 1):
        canary = text_cell(path, number, row, "canary")
        tasks.append(
            Task(
                id=str(number),
                question=decrypt_cell(path, number, row, "problem", canary, decrypt_browsecomp),
                answer=decrypt_cell(path, number, row, "answer", canary, decrypt_browsecomp),
                level=(row.get("problem_topic") or "").strip() or None,
            )
        )
    return tasks


def load_zh(path: str | Path) -> list[Task]:
    """BrowseComp-ZH: `Topic`, `Question` and `Answer` all encrypted."""
    path = Path(path)
    tasks = []
    for number, row in enumerate(read_xlsx(path, ZH_COLUMNS), 1):
        canary = text_cell(path, number, row, "canary")
        tasks.append(
            Task(
                id=str(number),
                question=decrypt_cell(path, number, row, "Question", canary, decrypt_browsecomp),
                answer=decrypt_cell(path, number, row, "Answer", canary, decrypt_browsecomp),
                level=decrypt_cell(path, number, row, "Topic", canary, decrypt_browsecomp).strip() or None,
            )
        )
    return tasks
