"""The loop's questions: each iteration's drawn from the questions file (`iter-<i>/questions.jsonl`), and the
file checked before anything runs: every question has an answer to grade against, and none
is in the held-out set the trained policy will be measured on (by its id, or by its text however spaced or
cased). A loop that trains on what it is evaluated on measures nothing, and one without answers rewards
nothing; both would only show after hours."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from nanbeige.evals.questions import read_questions
from nanbeige.evals.tasks import LoadError, Task
from nanbeige.tools import handed_over
from nanbeige.trainer.loop_config import LoopConfig, LoopError

MAX_QUESTIONS_BYTES = 1024 * handed_over.MIB  # an iteration's drawn questions, with their answers
SHOWN = 5
"""Rows a refusal names; the rest are counted."""


def drawn(folder: Path) -> int:
    """How many questions the iteration has drawn (the lines of its questions file)."""
    return len(_drawn_lines(folder).splitlines())


def _drawn_lines(folder: Path) -> str:
    """The iteration's questions file as text, read as handed over (the loop folder may be someone else's)."""
    path = folder / "questions.jsonl"
    if not path.exists():
        return ""
    try:
        return handed_over.read_bytes(path, MAX_QUESTIONS_BYTES, inside=folder).decode("utf-8")
    except (OSError, ValueError) as exc:
        raise LoopError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def question_pool(config: LoopConfig) -> list[Any]:
    """The questions file read (code problems each as `collect --bench code` asks it) and checked: its ids
    once each, an answer to each question, none of the held-out set's."""
    from nanbeige.evals.code_problems import CODE_TESTS, read_problems, task_of

    code = config.judge.grader == CODE_TESTS
    pool = (
        [task_of(problem) for problem in read_problems(config.questions)] if code else read_questions(config.questions)
    )
    check_questions(pool, config.questions, config.held_out, needs_answers=not code)
    return pool


def draw_questions(config: LoopConfig, iteration: int, folder: Path) -> bool:
    """Append the iteration's next questions to its questions file (written whole, atomically); False when
    none is left to draw (every question of the file is in this iteration already)."""
    pool = question_pool(config)
    have = drawn(folder)
    count = min(config.questions_per_iteration or len(pool), len(pool) - have)
    if count <= 0:
        return False
    # where the file's order stands: after every question the earlier iterations drew
    start = sum(drawn(config.out / f"iter-{i}") for i in range(1, iteration)) + have
    rows = [pool[(start + n) % len(pool)] for n in range(count)]
    path = folder / "questions.jsonl"
    lines = _drawn_lines(folder)
    lines += "".join(json.dumps({"id": t.id, "question": t.question, "answer": t.answer}) + "\n" for t in rows)
    temporary = folder / "questions.jsonl.tmp"
    temporary.write_text(lines)
    os.replace(temporary, path)
    return True


def check_questions(pool: list[Task], path: Path, held_out: Path | None, needs_answers: bool) -> None:
    """Refuse (LoadError, one line naming the rows) questions without an answer when the reward is graded
    against one, and any that the held-out file also holds. `pool` is `path` read, in its row order."""
    if needs_answers:
        lacking = [row for row, task in enumerate(pool, 1) if not task.answer.strip()]
        if lacking:
            raise LoadError(
                f"{path} {rows_named(lacking)} no `answer`: the loop's reward grades each rollout's answer "
                "against it; add one to each"
            )
    if held_out is None:
        return
    if held_out.resolve() == path.resolve():
        raise LoadError(f"--held-out {held_out} is the questions file itself: hold out questions of another file")
    rows_by_id: dict[str, list[int]] = defaultdict(list)
    rows_by_text: dict[str, list[int]] = defaultdict(list)
    for row, task in enumerate(read_questions(held_out), 1):
        rows_by_id[task.id].append(row)
        rows_by_text[plain(task.question)].append(row)
    shared = [
        (row, held)
        for row, task in enumerate(pool, 1)
        for held in sorted({*rows_by_id.get(task.id, []), *rows_by_text.get(plain(task.question), [])})
    ]
    if shared:
        pairs = ", ".join(
            f"{path.name} row {row} and {held_out.name} row {held_row}" for row, held_row in shared[:SHOWN]
        )
        more = f" (and {len(shared) - SHOWN} more)" if len(shared) > SHOWN else ""
        raise LoadError(
            f"{pairs}{more} are the same question (the same id or text): the loop must never train on a held-out "
            "question; take it out of one of the files"
        )


def plain(question: str) -> str:
    """A question's text as compared: whitespace runs as one space, case folded."""
    return " ".join(question.split()).casefold()


def rows_named(rows: list[int]) -> str:
    """ "row 2 has" / "rows 2 and 3 have" / "rows 2, 3, 4, 5, 6 and 7 more have"."""
    if len(rows) == 1:
        return f"row {rows[0]} has"
    shown = [str(row) for row in rows[:SHOWN]]
    last = f"{len(rows) - SHOWN} more" if len(rows) > SHOWN else shown.pop()
    return f"rows {', '.join(shown)} and {last} have"
