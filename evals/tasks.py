"""What every benchmark loader gives and every grader returns.

A loader reads a benchmark's official file from disk and gives `Task`s: the question exactly as the
agent is to see it, the gold answer, and what the report breaks scores down by. A grader reads the
agent's reply to one task and gives a `Verdict`, recording which grader (and judge model) decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LoadError(Exception):
    """A benchmark file that cannot be used; the message names the file (and the row, when one is bad)."""


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
