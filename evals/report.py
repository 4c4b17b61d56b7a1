"""Scores from `results.jsonl`: avg@k, pass@k, per-run accuracy, a per-level breakdown, and what the
runs did (turns, tool calls, stop reasons, judge failures, tokens and paid tool units used); as JSON and as a
markdown table.

With n tasks and k runs, C[q][r] = 1 when run r of task q was graded correct (a run not done yet,
or one the judge could not decide, counts 0):
- avg@k = mean over runs and tasks of C (the reference harness's "avg@3", pass@1 averaged over runs);
- pass@k = mean over tasks of max over runs of C;
- best@1 = the best run's accuracy, and the standard deviation of the runs' accuracies.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from nanbeige.agent.usage import total, usage_text


def scores(cells: dict[tuple[str, int], bool], task_ids: list[str], k: int) -> dict[str, Any]:
    """avg@k, pass@k and per-run accuracies (in %) of `task_ids` from the correct cells."""
    n = len(task_ids)
    if n == 0:
        return {"tasks": 0, "avg_at_k": None, "pass_at_k": None, "runs": []}
    per_run = [100 * sum(cells.get((t, r), False) for t in task_ids) / n for r in range(k)]
    passed = sum(any(cells.get((t, r), False) for r in range(k)) for t in task_ids)
    return {"tasks": n, "avg_at_k": round(statistics.fmean(per_run), 2), "pass_at_k": round(100 * passed / n, 2),
            "best_at_1": round(max(per_run), 2), "std": round(statistics.pstdev(per_run), 2),
            "runs": [round(a, 2) for a in per_run]}


def build_report(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of an eval from its manifest (`eval.json`) and its graded rows."""
    k, tasks = manifest["k"], manifest.get("tasks") or []
    task_ids = [t["id"] for t in tasks]
    known = set(task_ids)
    rows = [row for row in rows if row["task_id"] in known and 0 <= row["run"] < k]
    cells = {(row["task_id"], row["run"]): row["correct"] is True for row in rows}
    report: dict[str, Any] = {
        "bench": manifest["bench"], "grader": manifest["grader"], "judge_model": manifest.get("judge_model"),
        "reference": manifest.get("reference"),
        "k": k, "runs_done": len(cells), "runs_expected": len(task_ids) * k,
        "complete": len(cells) == len(task_ids) * k, **scores(cells, task_ids, k),
    }
    levels: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        if task.get("level") is not None:
            levels[str(task["level"])].append(task["id"])
    report["levels"] = {level: scores(cells, ids, k) for level, ids in sorted(levels.items())}
    report["mean_turns"] = _mean(row.get("turns") for row in rows)
    report["mean_tool_calls"] = _mean(row.get("tool_calls") for row in rows)
    report["stop_reasons"] = dict(Counter(row.get("stop_reason") or "none" for row in rows).most_common())
    report["judge_failures"] = sum(row["correct"] is None for row in rows)
    report["calibration_error"] = calibration_error(rows, manifest["grader"])
    report["no_answer"] = sum(row.get("prediction") is None for row in rows)
    report["usage"] = total(row.get("usage") for row in rows)
    return report


def calibration_error(rows: list[dict[str, Any]], grader: str) -> float | None:
    """How far the judged confidences are from the accuracy, in %, over the runs whose judge gave a
    confidence. BrowseComp-ZH's way for its grader: fixed bins [0,20), [20,40), ..., [80,100], summing
    |accuracy - mean confidence| weighted by the bin's share. HLE's way for the others: the runs sorted
    by confidence in bins of 100, the root of the bin-share-weighted squared gaps (the last bin counts
    too; HLE's own script leaves it out)."""
    pairs = sorted((min(max(row["confidence"], 0), 100) / 100, row["correct"] is True) for row in rows
                   if isinstance(row.get("confidence"), (int, float)) and row["correct"] is not None)
    if not pairs:
        return None
    if grader == "browsecomp-zh":
        bins = [[p for p in pairs if low <= 100 * p[0] < high] for low, high in
                ((0, 20), (20, 40), (40, 60), (60, 80), (80, 101))]
        gap = sum(len(b) * abs(_share(b) - statistics.fmean(c for c, _ in b)) for b in bins if b) / len(pairs)
        return round(100 * gap, 2)
    bins = [pairs[i:i + 100] for i in range(0, len(pairs), 100)]
    squared = sum(len(b) * (_share(b) - statistics.fmean(c for c, _ in b)) ** 2 for b in bins) / len(pairs)
    return round(100 * squared ** 0.5, 2)


def _share(pairs: list[tuple[float, bool]]) -> float:
    return sum(correct for _, correct in pairs) / len(pairs)


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
    if not report["complete"]:
        lines += [f"Incomplete: {report['runs_done']} of {report['runs_expected']} runs done; runs not done count "
                  "as wrong. Run the same command again to finish.", ""]
    lines += ["| metric | value |", "|---|---|",
              f"| avg@{k} | {_pct(report['avg_at_k'])} |", f"| pass@{k} | {_pct(report['pass_at_k'])} |",
              f"| best@1 | {_pct(report.get('best_at_1'))} |", f"| std across runs | {_num(report.get('std'))} |",
              f"| per run | {', '.join(_pct(a) for a in report['runs']) or '-'} |",
              f"| mean turns | {_num(report['mean_turns'])} |",
              f"| mean tool calls | {_num(report['mean_tool_calls'])} |",
              f"| stop reasons | {', '.join(f'{r} {n}' for r, n in report['stop_reasons'].items()) or '-'} |",
              f"| no answer | {report['no_answer']} |", f"| judge failures | {report['judge_failures']} |",
              f"| used in all | {usage_text(report.get('usage')) or '-'} |"]
    if report.get("calibration_error") is not None:
        lines.append(f"| calibration error | {_pct(report['calibration_error'])} |")
    if report["levels"]:
        lines += ["", f"| level | tasks | avg@{k} | pass@{k} |", "|---|---|---|---|"]
        lines += [f"| {level} | {s['tasks']} | {_pct(s['avg_at_k'])} | {_pct(s['pass_at_k'])} |"
                  for level, s in report["levels"].items()]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


SUMMARY_COLUMNS = ("Overall Acc", "Non-Live AST Acc", "Live Acc", "Multi Turn Acc", "Web Search Acc", "Memory Acc",
                   "Relevance Detection", "Irrelevance Detection")


def bfcl_markdown(report: dict[str, Any]) -> str:
    """BFCL's report: the official runner's per-category accuracies and its summary numbers."""
    lines = [f"## {report['bench']}: {report['items_done']} of {report['items']} items, graded by {report['grader']}",
             "", f"Prompts and decoding: {report['handler']}.", ""]
    if report["partial"]:
        lines += ["Partial: the official runner scored only the items done (its --partial-eval); run the same "
                  "command again to finish, or leave out --limit.", ""]
    lines += ["| category | accuracy | correct | total |", "|---|---|---|---|"]
    lines += [f"| {name} | {_pct(c['accuracy'])} | {c['correct']} | {c['total']} |"
              for name, c in sorted(report["categories"].items())]
    if report.get("runner_error"):
        lines += ["", f"The official runner failed after scoring the categories above, so it wrote no summary "
                  f"table: {report['runner_error']}."]
    summary = report.get("summary") or {}
    shown = [(column, summary[column]) for column in SUMMARY_COLUMNS if column in summary]
    if shown:
        lines += ["", "| BFCL summary (official runner) | value |", "|---|---|"]
        lines += [f"| {column} | {value} |" for column, value in shown]
    if report.get("missing_weight"):
        parts = ", ".join(f"{part} {weight}%" for part, weight in report["missing_weight"].items())
        lines += ["", f"Not run, counted as 0 in the overall as the official runner counts them: {parts}."]
    return "\n".join(lines)
