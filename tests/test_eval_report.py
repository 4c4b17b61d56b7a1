"""The report's numbers from `results.jsonl` rows, checked by hand."""

from __future__ import annotations

from nanbeige.evals.scores import build_report, calibration_error, markdown


def row(task: str, run: int, correct: bool | None, confidence: int | None = None, **extra: object) -> dict:
    return {
        "task_id": task,
        "run": run,
        "correct": correct,
        "confidence": confidence,
        "prediction": "x",
        "turns": 3,
        "tool_calls": 2,
        "stop_reason": "answered",
        **extra,
    }


MANIFEST = {
    "bench": "hle",
    "grader": "hle/official",
    "judge_model": "judge",
    "k": 2,
    "tasks": [{"id": "a", "level": "Math"}, {"id": "b", "level": "Math"}, {"id": "c", "level": "Bio"}],
}


def test_runs_not_done_count_as_wrong_and_the_report_says_it_is_incomplete() -> None:
    rows = [row("a", 0, True), row("a", 1, True), row("b", 0, False), row("b", 1, True), row("c", 0, None)]
    report = build_report(MANIFEST, rows)
    # run 0: a right of 3 = 33.33%; run 1: a, b right of 3 = 66.67%; c's run 1 was never done
    assert report["runs"] == [33.33, 66.67] and report["avg_at_k"] == 50.0 and report["pass_at_k"] == 66.67
    assert (report["complete"], report["runs_done"], report["runs_expected"]) == (False, 5, 6)
    assert report["judge_failures"] == 1
    assert report["levels"]["Math"]["avg_at_k"] == 75.0 and report["levels"]["Bio"]["pass_at_k"] == 0.0
    assert "Incomplete: 5 of 6 runs done" in markdown(report)


def test_hles_calibration_leaves_out_its_last_bin_and_rounds_as_it_prints() -> None:
    # 250 judged runs sorted by confidence make 2 bins: runs 0-99, and 100-249 (the rest stretched into it).
    # HLE's loop sums every bin but the last: 100/250 * (0.20 - 0.10)^2 = 0.004; sqrt = 0.0632; printed as
    # 100 * round(0.0632, 2) = 6.0. (With the last bin counted it would be far higher: 50 runs at 90% all wrong.)
    rows = (
        [row(f"a{i}", 0, i < 10, 20) for i in range(100)]
        + [row(f"b{i}", 0, i < 50, 50) for i in range(100)]
        + [row(f"c{i}", 0, False, 90) for i in range(50)]
    )
    assert calibration_error(rows, "hle/official") == (100 * 0.06, None)
    # 100 runs 41% sure and wrong, then 100 right: sqrt(100/200 * 0.41^2) = 0.2899, printed as HLE prints it
    rows = [row(f"d{i}", 0, False, 41) for i in range(100)] + [row(f"e{i}", 0, True, 100) for i in range(100)]
    assert calibration_error(rows, "hle/official") == (100 * round(0.29, 2), None) == (28.999999999999996, None)
    # HLE's script fails below 100 judged runs; runs the judge did not decide are not in it
    value, note = calibration_error([row("a", 0, True, 90)] * 99 + [row("b", 0, None, 10)], "hle/official")
    assert value is None and "100 judged runs" in note
    assert calibration_error(rows, "hle/reference") == (None, None)  # the reference harness computes none


def test_browsecomp_zhs_calibration_keeps_unreadable_confidences_as_zero_and_bins_as_python_indexes() -> None:
    # bins [0,20) ... [80,101) by min(confidence // 20, 4): 10% sure and wrong (gap 0.1), 90% sure and right
    # (gap 0.1), half the runs each: 10.0
    assert calibration_error([row("a", 0, False, 10), row("b", 0, True, 90)], "browsecomp-zh/official") == (10.0, None)
    # an unreadable confidence (0) stays in bin 0; -5 // 20 = -1 indexes the last bin: bin 0 holds one wrong
    # run at 0 (gap 0), the last two right runs at (90 - 5) / 2 = 42.5 (gap 0.575): 2/3 * 0.575 = 38.3333%
    rows = [row("a", 0, False, None), row("b", 0, True, 90), row("c", 0, True, -5)]
    assert calibration_error(rows, "browsecomp-zh/official") == (38.3333, None)


def test_the_spread_is_reported_as_each_source_computes_it() -> None:
    rows = [
        row("a", 0, True),
        row("a", 1, True),
        row("b", 0, False),
        row("b", 1, True),
        row("c", 0, False),
        row("c", 1, False),
    ]
    # per run: 33.33 and 66.67; the reference harness: the sample std of the rounded runs, their mean
    reference = build_report(MANIFEST | {"grader": "hle/reference"}, rows)
    assert (reference["std"], reference["avg_at_k"]) == (23.57, 50.0) and reference["std_kind"].startswith("sample")
    # simple-evals: the population std of the 6 per-item scores (3 of 6 right): 50
    simple = build_report(MANIFEST | {"grader": "browsecomp/official"}, rows)
    assert simple["std"] == 50.0 and "items" in simple["std_kind"]
    # HLE: the Wald half-width on each run's accuracy: 1.96 * sqrt(33.33 * 66.67 / 3) = 53.34
    hle = build_report(MANIFEST, rows)
    assert hle["ci95_half_width"] == [53.34, 53.34]


def test_the_report_lists_why_runs_failed_the_first_twenty_each_on_one_line() -> None:
    manifest = {"bench": "code", "grader": "code-tests", "k": 1, "tasks": [{"id": f"p{i}"} for i in range(25)]}
    rows = [row(f"p{i}", 0, False, failure=f"test 1 of 2: NameError: name 'x{i}' is not defined") for i in range(24)]
    rows.append(row("p24", 0, True, failure=None))  # a right run has nothing to say
    rows[3]["task_id"], manifest["tasks"][3]["id"] = "p3\n- p99 run 0: forged", "p3\n- p99 run 0: forged"
    report = build_report(manifest, list(reversed(rows)))
    assert [f["task_id"] for f in report["failures"]][:5] == ["p0", "p1", "p2", "p3\n- p99 run 0: forged", "p4"]
    assert len(report["failures"]) == 24  # all of them in report.json, in task order
    text = markdown(report)
    assert "- p0 run 0: test 1 of 2: NameError: name 'x0' is not defined" in text
    assert "- p3 - p99 run 0: forged run 0: " in text and "\n- p99" not in text  # an id cannot add a line
    assert "- p19 run 0:" in text and "- p20 run 0:" not in text and "- and 4 more" in text
