"""The report's numbers from `results.jsonl` rows, checked by hand."""

from __future__ import annotations

from nanbeige.evals.report import build_report, calibration_error, markdown


def row(task: str, run: int, correct: bool | None, confidence: int | None = None, **extra: object) -> dict:
    return {"task_id": task, "run": run, "correct": correct, "confidence": confidence, "prediction": "x",
            "turns": 3, "tool_calls": 2, "stop_reason": "answered", **extra}


MANIFEST = {"bench": "hle", "grader": "hle", "judge_model": "judge", "k": 2,
            "tasks": [{"id": "a", "level": "Math"}, {"id": "b", "level": "Math"}, {"id": "c", "level": "Bio"}]}


def test_runs_not_done_count_as_wrong_and_the_report_says_it_is_incomplete() -> None:
    rows = [row("a", 0, True), row("a", 1, True), row("b", 0, False), row("b", 1, True), row("c", 0, None)]
    report = build_report(MANIFEST, rows)
    # run 0: a right of 3 = 33.33%; run 1: a, b right of 3 = 66.67%; c's run 1 was never done
    assert report["runs"] == [33.33, 66.67] and report["avg_at_k"] == 50.0 and report["pass_at_k"] == 66.67
    assert (report["complete"], report["runs_done"], report["runs_expected"]) == (False, 5, 6)
    assert report["judge_failures"] == 1
    assert report["levels"]["Math"]["avg_at_k"] == 75.0 and report["levels"]["Bio"]["pass_at_k"] == 0.0
    assert "Incomplete: 5 of 6 runs done" in markdown(report)


def test_calibration_error_by_each_benchmarks_rule() -> None:
    # confident and right, confident and wrong: in one bin, accuracy 0.5 against confidence 0.9
    rows = [row("a", 0, True, 90), row("b", 0, False, 90)]
    assert calibration_error(rows, "hle") == 40.0
    assert calibration_error(rows, "browsecomp-zh") == 40.0
    # BrowseComp-ZH's fixed bins: 10% sure and wrong (gap 0.1), 90% sure and right (gap 0.1)
    assert calibration_error([row("a", 0, False, 10), row("b", 0, True, 90)], "browsecomp-zh") == 10.0
    # HLE's bins of 100 sorted runs: both in one bin, accuracy 0.5 against mean confidence 0.5
    assert calibration_error([row("a", 0, False, 10), row("b", 0, True, 90)], "hle") == 0.0
    assert calibration_error([row("a", 0, True)], "hle") is None  # no confidence given
