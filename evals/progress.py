"""What a progress display reads while many runs go (an eval, a collection): counts, the time since the start,
and when the runs should be done."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """Counts a progress display reads while the eval runs."""

    total: int
    done: int = 0
    running: int = 0
    correct: int = 0
    turns: int = 0
    """Model turns of the runs done in this session."""
    graded: int = 0
    """Runs done whose answer could be graded (a reference answer, a judge that decided)."""
    groups_done: int = 0
    """Tasks all of whose runs are done (`collect`: questions with their G rollouts)."""
    failed: int = 0
    """Runs that failed (model server errors, crashes): not recorded, run again on resume."""
    last_error: str | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    """The failed runs of this session, each `task_id`, `run` and `error` (one line): the report lists them."""
    timed: int = 0
    """Runs done in this session, whose time is in `run_s` (runs done before a resume are not)."""
    run_s: float = 0.0
    """The wall-clock seconds of those runs together, each from its start to its end."""
    started: float = field(default_factory=time.monotonic)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def finished_one(self, seconds: float) -> None:
        """A run of this session is done, after `seconds`."""
        self.timed += 1
        self.run_s += seconds

    def eta_s(self) -> float | None:
        """Seconds until every run is done: the runs left, each taking as long as the runs of this session took
        on average, as many at once as are running now. None until a run of this session has ended (nothing to
        go by yet); 0 when none is left."""
        left = self.total - self.done
        if left <= 0:
            return 0.0
        if not self.timed:
            return None
        return self.run_s / self.timed * left / max(self.running, 1)
