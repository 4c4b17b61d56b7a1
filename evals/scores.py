"""Scores from `results.jsonl`: avg@k, pass@k, per-run accuracy, a per-level breakdown, and what the
runs did (turns, tool calls, stop reasons, judge failures, tokens and paid tool units used), and why the runs
that were not right failed where something says so (`failures`); as JSON and as a markdown table.

With n tasks and k runs, C[q][r] = 1 when run r of task q was graded correct (a run not done yet,
or one the judge could not decide, counts 0):
- avg@k = mean over runs and tasks of C (the reference harness's "avg@3", pass@1 averaged over runs);
- pass@k = mean over tasks of max over runs of C;
- best@1 = the best run's accuracy, and the standard deviation of the runs' accuracies;
- avg@k's 95% interval: the percentile bootstrap over tasks (`intervals.py`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from nanbeige.agent.run.usage import total, usage_text
from nanbeige.evals.intervals import bootstrap_ci95
from nanbeige.evals.tasks import one_line


def scores(cells: dict[tuple[str, int], bool], task_ids: list[str], k: int, grader: str = "") -> dict[str, Any]:
    """avg@k, pass@k and per-run accuracies (in %) of `task_ids` from the correct cells, and the spread
    across runs as the grader's source reports it (`spread`)."""
    n = len(task_ids)
    if n == 0:
        return {"tasks": 0, "avg_at_k": None, "pass_at_k": None, "runs": []}
    per_run = [100 * sum(cells.get((t, r), False) for t in task_ids) / n for r in range(k)]
    per_task = [100 * sum(cells.get((t, r), False) for r in range(k)) / k for t in task_ids]
    passed = sum(any(cells.get((t, r), False) for r in range(k)) for t in task_ids)
    return {
        "tasks": n,
        "avg_at_k": round(statistics.fmean(per_run), 2),
        "avg_at_k_ci95": bootstrap_ci95(per_task),
        "pass_at_k": round(100 * passed / n, 2),
        "best_at_1": round(max(per_run), 2),
        "runs": [round(a, 2) for a in per_run],
        **spread(cells, task_ids, per_run, grader),
    }


def spread(
    cells: dict[tuple[str, int], bool], task_ids: list[str], per_run: list[float], grader: str
) -> dict[str, Any]:
    """The spread the grader's source reports, named by how it is computed:
    - the reference harness: each run's accuracy rounded to 2 decimals, their mean and their sample
      standard deviation (`statistics.stdev`; 0 for one run);
    - simple-evals (BrowseComp): the population standard deviation of the per-item scores (`np.std`);
    - HLE: the Wald 95% half-width on each run's accuracy, rounded first: 1.96 * sqrt(acc * (100 - acc) / n);
    - others: the population standard deviation across runs."""
    rounded = [round(a, 2) for a in per_run]
    if grader.endswith("/reference"):
        std = statistics.stdev(rounded) if len(rounded) > 1 else 0
        return {
            "std": round(std, 2),
            "std_kind": "sample, across runs (the reference harness)",
            "avg_at_k": round(statistics.fmean(rounded), 2),
        }
    if grader.startswith("browsecomp/official"):
        items = [float(cells.get((t, r), False)) for r in range(len(per_run)) for t in task_ids]
        return {"std": round(100 * statistics.pstdev(items), 2), "std_kind": "population, across items (simple-evals)"}
    if grader == "hle/official":
        n = len(task_ids)
        half = [round(1.96 * math.sqrt(a * (100 - a) / n), 2) for a in rounded]
        return {
            "std": round(statistics.pstdev(per_run), 2),
            "std_kind": "population, across runs",
            "ci95_half_width": half,
        }
    return {"std": round(statistics.pstdev(per_run), 2), "std_kind": "population, across runs"}


def build_report(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of an eval from its manifest (`eval.json`) and its graded rows."""
    k, tasks = manifest["k"], manifest.get("tasks") or []
    task_ids = [t["id"] for t in tasks]
    known = set(task_ids)
    rows = [row for row in rows if row["task_id"] in known and 0 <= row["run"] < k]
    cells = {(row["task_id"], row["run"]): row["correct"] is True for row in rows}
    grader = manifest["grader"]
    report: dict[str, Any] = {
        "bench": manifest["bench"],
        "grader": grader,
        "judge_model": manifest.get("judge_model"),
        "grader_source": source_of(grader),
        "judge_prompt": manifest.get("judge_prompt"),
        "reference": manifest.get("reference"),
        "k": k,
        "runs_done": len(cells),
        "runs_expected": len(task_ids) * k,
        "complete": len(cells) == len(task_ids) * k,
        **scores(cells, task_ids, k, grader),
    }
    levels: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        if task.get("level") is not None:
            levels[str(task["level"])].append(task["id"])
    report["levels"] = {level: scores(cells, ids, k, grader) for level, ids in sorted(levels.items())}
    report["mean_turns"] = _mean(row.get("turns") for row in rows)
    report["mean_tool_calls"] = _mean(row.get("tool_calls") for row in rows)
    report["stop_reasons"] = dict(Counter(row.get("stop_reason") or "none" for row in rows).most_common())
    report["judge_failures"] = sum(row["correct"] is None for row in rows)
    report["calibration_error"], report["calibration_note"] = calibration_error(rows, grader)
    if grader == "xbench/official":
        report["majority_vote"] = majority_vote(rows, task_ids)
    report["no_answer"] = sum(row.get("prediction") is None for row in rows)
    report["usage"] = total(row.get("usage") for row in rows)
    report["failures"] = failures(rows, task_ids)
    return report


def failures(rows: list[dict[str, Any]], task_ids: list[str]) -> list[dict[str, Any]]:
    """The runs not graded right whose row says why (a program's failing test, the run's own error, the judge's
    failure), in task order: `task_id`, `run` and `why`."""
    order = {task_id: index for index, task_id in enumerate(task_ids)}
    found = [
        {"task_id": row["task_id"], "run": row["run"], "why": why}
        for row in rows
        if row["correct"] is not True
        and isinstance(why := row.get("failure") or row.get("error") or row.get("judge_error"), str)
    ]
    return sorted(found, key=lambda failure: (order.get(failure["task_id"], len(order)), failure["run"]))


def calibration_error(rows: list[dict[str, Any]], grader: str) -> tuple[float | None, str | None]:
    """The calibration error as the grader's source computes it, with a note where it cannot; None for
    sources that compute none (simple-evals, xbench-evals, the reference harness)."""
    if grader == "hle/official":
        return hle_calibration(rows)
    if grader == "browsecomp-zh/official":
        return browsecomp_zh_calibration(rows), None
    return None, None


def hle_calibration(rows: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """HLE's `calib_err` (p=2, beta=100) over the judged runs: sorted by confidence (a stable sort where
    HLE's numpy sort is not), bins of 100, the last bin stretched over the remainder and then left out of
    the sum (as HLE's loop does), the root of the bin-share-weighted squared gaps; printed as
    `100 * round(x, 2)`. HLE's script fails below 100 judged runs; here that is a note."""
    pairs = sorted(
        (
            (row["confidence"] / 100, row["correct"] is True)
            for row in rows
            if isinstance(row.get("confidence"), (int, float)) and row["correct"] is not None
        ),
        key=lambda pair: pair[0],
    )
    if len(pairs) < 100:
        return None, f"HLE's calibration needs 100 judged runs or more ({len(pairs)} here)"
    edges = [[i * 100, (i + 1) * 100] for i in range(len(pairs) // 100)]
    edges[-1][1] = len(pairs)
    squared = 0.0
    for low, high in edges[:-1]:
        chunk = pairs[low:high]
        gap = statistics.fmean(c for c, _ in chunk) - statistics.fmean(float(ok) for _, ok in chunk)
        squared += len(chunk) / len(pairs) * gap**2
    return 100 * round(math.sqrt(squared), 2), None


def browsecomp_zh_calibration(rows: list[dict[str, Any]]) -> float | None:
    """BrowseComp-ZH's: every graded run (an unreadable confidence read as 0 and kept) in the bins [0,20),
    [20,40), [40,60), [60,80), [80,101) by `min(confidence // 20, 4)` (a negative one indexes the last bin,
    as a Python list does), summing the bin share times |accuracy - mean confidence|; in %, rounded to 4."""
    graded = [row for row in rows if row["correct"] is not None]
    if not graded:
        return None
    bins: list[list[tuple[int, bool]]] = [[] for _ in range(5)]
    for row in graded:
        confidence = int(row.get("confidence") or 0)
        bins[min(confidence // 20, 4)].append((confidence, row["correct"] is True))
    error = sum(
        len(b) / len(graded) * abs(sum(ok for _, ok in b) / len(b) - sum(c for c, _ in b) / len(b) / 100)
        for b in bins
        if b
    )
    return round(error * 100, 4)


def majority_vote(rows: list[dict[str, Any]], task_ids: list[str]) -> float | None:
    """xbench-evals' majority vote: per task, the most common extracted answer across its runs, right when
    it equals the gold answer exactly; in %. (xbench breaks ties at random; here the first answer seen wins.)"""
    answers: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if row.get("extracted") is not None:
            answers[row["task_id"]].append(row["extracted"])
    if not task_ids:
        return None
    right = 0
    for task_id in task_ids:
        votes = Counter(answers.get(task_id, []))
        gold = next((r["gold"] for r in rows if r["task_id"] == task_id), None)
        right += bool(votes) and votes.most_common(1)[0][0] == gold
    return round(100 * right / len(task_ids), 2)


def source_of(grader: str) -> str | None:
    from nanbeige.evals import judges

    return (
        judges.PROFILES[grader].source
        if grader in judges.PROFILES
        else "GAIA's leaderboard scorer (question_scorer)"
        if grader == "gaia-exact"
        else None
    )


def _mean(values: Any) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.fmean(numbers), 2) if numbers else None


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: one table of the scores, one per level when the benchmark has levels."""
    if report.get("kind") == "bfcl":
        return bfcl_markdown(report)
    k = report["k"]
    judge = f" ({report['judge_model']})" if report.get("judge_model") else ""
    lines = [f"## {report['bench']}: {report['tasks']} tasks × {k} runs, graded by {report['grader']}{judge}", ""]
    if report.get("grader_source"):
        prompt = f" Judge prompt: {report['judge_prompt']}." if report.get("judge_prompt") else ""
        lines += [f"Grading rules: {report['grader_source']}.{prompt}", ""]
    if not report["complete"]:
        lines += [
            f"Incomplete: {report['runs_done']} of {report['runs_expected']} runs done; runs not done count "
            "as wrong. Run the same command again, with the same --out, to finish.",
            "",
        ]
    lines += [
        "| metric | value |",
        "|---|---|",
        f"| avg@{k} | {_pct(report['avg_at_k'])} |",
        f"| avg@{k}, 95% interval (bootstrap over tasks) | {interval(report.get('avg_at_k_ci95'))} |",
        f"| pass@{k} | {_pct(report['pass_at_k'])} |",
        f"| best@1 | {_pct(report.get('best_at_1'))} |",
        f"| std ({report.get('std_kind', 'population, across runs')}) | {_num(report.get('std'))} |",
        f"| per run | {', '.join(_pct(a) for a in report['runs']) or '-'} |",
        f"| mean turns | {_num(report['mean_turns'])} |",
        f"| mean tool calls | {_num(report['mean_tool_calls'])} |",
        f"| stop reasons | {', '.join(f'{r} {n}' for r, n in report['stop_reasons'].items()) or '-'} |",
        f"| no answer | {report['no_answer']} |",
        f"| judge failures | {report['judge_failures']} |",
        f"| used in all | {usage_text(report.get('usage')) or '-'} |",
    ]
    if report.get("ci95_half_width"):
        lines.append(f"| 95% half-width per run (HLE's) | {', '.join(_num(h) for h in report['ci95_half_width'])} |")
    if report.get("majority_vote") is not None:
        lines.append(f"| majority vote (xbench-evals') | {_pct(report['majority_vote'])} |")
    if report.get("calibration_error") is not None:
        lines.append(f"| calibration error | {_num(report['calibration_error'])} |")
    elif report.get("calibration_note"):
        lines.append(f"| calibration error | - ({report['calibration_note']}) |")
    if report["levels"]:
        lines += ["", f"| level | tasks | avg@{k} | pass@{k} |", "|---|---|---|---|"]
        lines += [
            f"| {level} | {s['tasks']} | {_pct(s['avg_at_k'])} | {_pct(s['pass_at_k'])} |"
            for level, s in report["levels"].items()
        ]
    lines += failure_lines(
        "Why runs failed", report.get("failures") or [], "why", "`failure` and `error` in results.jsonl"
    )
    lines += failure_lines(
        "Runs that failed and are not counted (run the same command again, with the same --out, to retry them)",
        report.get("failed_run_errors") or [],
        "error",
        "report.json",
    )
    return "\n".join(lines)


SHOWN_FAILURES = 20


def failure_lines(title: str, failures: list[dict[str, Any]], key: str, where: str) -> list[str]:
    """A list of runs with why each failed, the first `SHOWN_FAILURES` of them."""
    if not failures:
        return []
    lines = ["", f"{title}:", ""]
    lines += [
        f"- {one_line(str(f['task_id']), 100)} run {f['run']}: {one_line(str(f[key]))}"
        for f in failures[:SHOWN_FAILURES]
    ]
    if len(failures) > SHOWN_FAILURES:
        lines.append(f"- and {len(failures) - SHOWN_FAILURES} more (all in {where})")
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def interval(ends: list[float] | None) -> str:
    return f"{_pct(ends[0])}–{_pct(ends[1])}" if ends else "-"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


SUMMARY_COLUMNS = (
    "Overall Acc",
    "Non-Live AST Acc",
    "Live Acc",
    "Multi Turn Acc",
    "Web Search Acc",
    "Memory Acc",
    "Relevance Detection",
    "Irrelevance Detection",
)


def bfcl_markdown(report: dict[str, Any]) -> str:
    """BFCL's report: the official runner's per-category accuracies and its summary numbers."""
    lines = [
        f"## {report['bench']}: {report['items_done']} of {report['items']} items, graded by {report['grader']}",
        "",
        f"Prompts and decoding: {report['handler']}.",
        "",
    ]
    if report.get("search_engine"):
        lines += [f"Web search ran on {report['search_engine']}.", ""]
    if report["partial"]:
        lines += [
            "Partial: the official runner scored only the items done (its --partial-eval); run the same "
            "command again to finish, or leave out --limit.",
            "",
        ]
    lines += ["| category | accuracy | correct | total |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {_pct(c['accuracy'])} | {c['correct']} | {c['total']} |"
        for name, c in sorted(report["categories"].items())
    ]
    if report.get("runner_error"):
        lines += [
            "",
            f"The official runner failed after scoring the categories above, so it wrote no summary "
            f"table: {report['runner_error']}.",
        ]
    summary = report.get("summary") or {}
    shown = [(column, summary[column]) for column in SUMMARY_COLUMNS if column in summary]
    if shown:
        lines += ["", "| BFCL summary (official runner) | value |", "|---|---|"]
        lines += [f"| {column} | {value} |" for column, value in shown]
    if report.get("missing_weight"):
        parts = ", ".join(f"{part} {weight}%" for part, weight in report["missing_weight"].items())
        lines += ["", f"Not run, counted as 0 in the overall as the official runner counts them: {parts}."]
    lines += failure_lines(
        "Items that failed and are not scored (run the same command again to retry them)",
        report.get("failed_run_errors") or [],
        "error",
        "report.json",
    )
    return "\n".join(lines)
