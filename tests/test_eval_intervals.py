"""The eval report's 95% interval on avg@k: a bootstrap over tasks (the tasks are the sample; a task's k runs
stay together), checked against scipy's own bootstrap on the same per-task scores."""

from __future__ import annotations

import random

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
