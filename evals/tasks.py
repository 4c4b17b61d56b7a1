"""What every benchmark loader gives and every grader returns.

A loader reads a benchmark's official file from disk and gives `Task`s: the question exactly as the
agent is to see it, the gold answer, and what the report breaks scores down by. A grader reads the
agent's reply to one task and gives a `Verdict`, recording which grader (and judge model) decided.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanbeige.tools import handed_over
from nanbeige.tools.errors import NanbeigeError

FAILURE_CHARS = 200
"""The longest failure reason kept: one line of a report, not the program's whole output."""


class LoadError(NanbeigeError):
    """A benchmark file that cannot be used; the message names the file (and the row, when one is bad)."""


MAX_DATA_BYTES = 4096 * handed_over.MIB
"""The largest benchmark file read whole: LiveCodeBench's releases, the largest, are about 1.5 GB a file."""


def read_data(path: Path) -> bytes:
    """A benchmark file's bytes: a regular file of at most `MAX_DATA_BYTES` (a FIFO would block, a sparse file
    of terabytes would be read whole); `handed_over.HandedOverError` (a `ValueError`) says which rule it broke."""
    return handed_over.read_bytes(path, MAX_DATA_BYTES)


@dataclass
class Task:
    id: str
    """The benchmark's own id for the question (as a string), stable across runs: results are keyed by it."""
    question: str
    """The question as the agent is to receive it (decrypted; attachments named in it)."""
    answer: str
    """The gold answer (decrypted)."""
    level: str | None = None
    """What the report breaks scores down by, where the benchmark has it (GAIA's level, HLE's category)."""
    files: list[Path] = field(default_factory=list)
    """Attached files, resolved to paths on this machine."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Other fields a grader needs (HLE's answer_type, BFCL's functions and ground truth, ...)."""


@dataclass
class Verdict:
    correct: bool | None
    """Whether the answer is right; None when the grader could not decide (a judge that failed):
    counted as wrong, and reported apart as a judge failure."""
    grader: str
    """The grader's name: `gaia-exact`, or a judge profile such as `browsecomp`."""
    judge_model: str | None = None
    """The judge model that decided, for LLM judges."""
    extracted: str | None = None
    """The short answer the grader compared (the judge's extracted answer, or the boxed answer)."""
    reason: str = ""
    """The judge's reasoning, or why the answer was wrong, in a line or two."""
    error: str | None = None
    """Why the grader could not decide, when `correct` is None."""
    confidence: int | None = None
    """The judge's stated confidence in %, where its profile asks for one (for calibration)."""
    failure: str | None = None
    """Why a graded program failed, in one line (`code-tests`: its first test that did not pass, with that
    test's first error line). For people only: it never decides `correct`."""
    score: float | None = None
    """Partial credit in [0, 1], the reward where the grader gives one (`token-f1`'s F1); None: the reward is
    `correct` as 1.0 or 0.0."""


def one_line(text: str, limit: int = FAILURE_CHARS) -> str:
    """The text as one line a terminal can show as it is: whitespace runs as one space, control and format
    characters (escapes, bidirectional overrides) left out, cut to `limit` characters. Failure reasons quote
    what a program raised or printed, so they get no say over the terminal they are shown in."""
    kept = "".join(
        " " if char.isspace() else char
        for char in text
        if char.isspace() or unicodedata.category(char) not in ("Cc", "Cf", "Cs", "Co", "Cn")
    )
    line = " ".join(kept.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
