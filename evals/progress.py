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
    in_flight: list[float] = field(default_factory=list)
    """When each run now running began (`time.monotonic`)."""
    started: float = field(default_factory=time.monotonic)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def began_one(self) -> float:
        """A run starts now; returns when, for `ended_one`."""
        began = time.monotonic()
        self.running += 1
        self.in_flight.append(began)
        return began

    def ended_one(self, began: float, done: bool) -> None:
        """The run begun at `began` ended; `done`: it is recorded (a failed one is not, and is not timed)."""
        self.running -= 1
        self.in_flight.remove(began)
        if done:
            self.timed += 1
            self.run_s += time.monotonic() - began

    def eta_s(self) -> float | None:
        """Seconds until every run is done: the runs left, each taking as long as the runs of this session took
        on average, less what the runs in flight have done of theirs, as many at once as are running now. None
        until a run of this session has ended (nothing to go by yet), and None when only runs in flight are
        left and one has run longer than the average (no telling when it ends: "0s" for minutes would be a
        lie); 0 when none is left."""
        left = self.total - self.done
        if left <= 0:
            return 0.0
        if not self.timed:
            return None
        per_run, now = self.run_s / self.timed, time.monotonic()
        if left <= self.running and self.longest_running_s() >= per_run:
            return None
        under_way = sum(min(now - began, per_run) for began in tuple(self.in_flight))  # read from another thread
        return max(left * per_run - under_way, 0.0) / max(self.running, 1)

    def longest_running_s(self) -> float:
        """How long the run in flight the longest has run; 0 when none is."""
        began = min(tuple(self.in_flight), default=None)  # a copy: read from another thread
        return 0.0 if began is None else time.monotonic() - began
