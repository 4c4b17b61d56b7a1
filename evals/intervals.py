"""A 95% interval on a benchmark score: the percentile bootstrap over tasks. The tasks are the sample (a
task's k runs stay together, as they are not independent draws), so the interval says how much the score
would move on another set of questions like these. The resampling is seeded: a report read twice gives the
same interval."""

from __future__ import annotations

import random
import statistics

RESAMPLES = 2000
"""Bootstrap resamples: the interval's ends move by about 0.2 points between seeds at 50 tasks."""


def bootstrap_ci95(per_task: list[float], resamples: int = RESAMPLES, seed: int = 0) -> list[float]:
    """[low, high]: the 2.5th and 97.5th percentiles (linear between order statistics, as numpy's default) of
    the mean of `per_task` resampled with replacement."""
    if not per_task:
        return []
    rng, n = random.Random(seed), len(per_task)
    means = sorted(statistics.fmean(rng.choices(per_task, k=n)) for _ in range(resamples))
    return [round(percentile(means, 2.5), 2), round(percentile(means, 97.5), 2)]


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile of sorted values, interpolated linearly between the two nearest ranks."""
    position = (len(ordered) - 1) * q / 100
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def paired_change_ci95(
    before: dict[str, float], after: dict[str, float], resamples: int = RESAMPLES, seed: int = 0
) -> list[float]:
    """[low, high]: a 95% interval on the mean per-task change from `before` to `after`, the same tasks' scores
    under two policies, by the percentile bootstrap over tasks with each task's two scores resampled together.
    Two intervals apart is a stricter test than this one: a task both policies find easy (or hard) moves both
    scores alike, which two separate intervals count as noise twice and the change does not count at all."""
    if before.keys() != after.keys():
        raise ValueError(f"the two scores are of different tasks ({len(before.keys() ^ after.keys())} not in both)")
    changes = [after[task] - before[task] for task in sorted(before)]
    return bootstrap_ci95(changes, resamples, seed)
