"""The eval report's 95% interval on avg@k: a bootstrap over tasks (the tasks are the sample; a task's k runs
stay together), checked against scipy's own bootstrap on the same per-task scores; and the interval on the change
between two policies on the same tasks, against scipy's paired bootstrap."""

from __future__ import annotations

import random

import pytest

from nanbeige.evals.intervals import bootstrap_ci95, paired_change_ci95
from nanbeige.evals.scores import build_report, markdown, scores


def cells_of(correct_runs: list[int], k: int) -> dict[tuple[str, int], bool]:
    """Task i right in its first correct_runs[i] of k runs."""
    return {(f"t{i}", r): r < right for i, right in enumerate(correct_runs) for r in range(k)}


def test_the_interval_is_scipys_percentile_bootstrap_over_tasks() -> None:
    import numpy as np
    from scipy import stats  # the oracle (tests/oracles.txt)

    k, rng = 4, random.Random(7)
    correct_runs = [rng.choice([0, 0, 0, 1, 2, 4]) for _ in range(60)]
    found = scores(cells_of(correct_runs, k), [f"t{i}" for i in range(60)], k)
    per_task = np.array([100 * right / k for right in correct_runs])
    oracle = stats.bootstrap((per_task,), np.mean, n_resamples=20000, method="percentile", rng=0).confidence_interval
    low, high = found["avg_at_k_ci95"]
    # two Monte Carlo estimates of the same percentiles: they agree to well within a point
    assert abs(low - oracle.low) < 1.0 and abs(high - oracle.high) < 1.0
    assert low < found["avg_at_k"] < high


def test_the_interval_is_a_point_when_every_task_scores_the_same_and_is_reproducible() -> None:
    ids = [f"t{i}" for i in range(10)]
    assert scores(cells_of([3] * 10, 3), ids, 3)["avg_at_k_ci95"] == [100.0, 100.0]
    assert scores(cells_of([0] * 10, 3), ids, 3)["avg_at_k_ci95"] == [0.0, 0.0]
    mixed, twenty = cells_of([0, 1, 2, 3] * 5, 3), [f"t{i}" for i in range(20)]
    assert scores(mixed, twenty, 3)["avg_at_k_ci95"] == scores(mixed, twenty, 3)["avg_at_k_ci95"]


def test_the_report_and_its_table_give_the_interval() -> None:
    manifest = {"k": 2, "bench": "questions", "grader": "gaia-exact", "tasks": [{"id": "a"}, {"id": "b"}]}
    rows = [
        {"task_id": "a", "run": 0, "correct": True},
        {"task_id": "a", "run": 1, "correct": True},
        {"task_id": "b", "run": 0, "correct": False},
        {"task_id": "b", "run": 1, "correct": False},
    ]
    report = build_report(manifest, rows)
    assert report["avg_at_k_ci95"] == [0.0, 100.0]
    assert "| avg@2, 95% interval (bootstrap over tasks) | 0.00%–100.00% |" in markdown(report)


def test_the_change_between_two_policies_is_scipys_paired_bootstrap_over_the_same_tasks() -> None:
    import numpy as np
    from scipy import stats  # the oracle (tests/oracles.txt)

    rng = random.Random(3)
    before = {f"t{i}": 25.0 * rng.choice([0, 0, 1, 2]) for i in range(48)}
    after = {task: min(100.0, score + 25.0 * rng.choice([0, 1])) for task, score in before.items()}
    low, high = paired_change_ci95(before, after)
    ids = sorted(before)
    oracle = stats.bootstrap(
        (np.array([before[t] for t in ids]), np.array([after[t] for t in ids])),
        lambda b, a, axis=-1: np.mean(a - b, axis=axis),
        paired=True,
        n_resamples=20000,
        method="percentile",
        rng=0,
    ).confidence_interval
    assert abs(low - oracle.low) < 1.0 and abs(high - oracle.high) < 1.0
    # a change the two scores' own intervals, overlapping, would not show: pairing removes what the tasks share
    apart = bootstrap_ci95(list(after.values()))[0] - bootstrap_ci95(list(before.values()))[1]
    assert apart < 0 < low


def test_a_change_is_only_measured_on_the_same_tasks() -> None:
    with pytest.raises(ValueError, match="1 not in both"):
        paired_change_ci95({"a": 0.0, "b": 50.0}, {"a": 25.0})
