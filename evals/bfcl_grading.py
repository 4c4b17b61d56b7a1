"""Grading a BFCL out folder by the official runner, once every item is generated (`bfcl_run.py`), and the
report read from its score files and summary table; `nanbeige eval report` grades a BFCL folder again here. The
runner executes the model's calls for some categories: those are graded in the sandbox (`bfcl_jail.py`)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
from pathlib import Path
from typing import Any, TextIO

from nanbeige.evals import bfcl, bfcl_jail
from nanbeige.evals.eval_config import EvalError
from nanbeige.evals.out_folder import MANIFEST, REPORT, read_manifest

WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}
"""BFCL-V4's overall: the weights its runner gives each part (`generate_leaderboard_csv`)."""
AGENTIC = ("web_search_base", "web_search_no_snippet", "memory_kv", "memory_vector", "memory_rec_sum")


def tidy_results(out: Path) -> None:
    """Each result file kept to whole, unique lines (a kill can tear the last one; the official runner
    cannot read a torn line), sorted as the official generator leaves them."""
    folder = bfcl.result_dir(out)
    if not folder.exists():
        return
    sort_key = bfcl.official().utils.sort_key
    for path in folder.rglob("*_result.json"):
        entries: dict[str, dict[str, Any]] = {}
        for line in bfcl.read_out_file(path, out).splitlines():
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                entries.setdefault(entry["id"], entry)
        path.write_text("".join(json.dumps(e) + "\n" for e in sorted(entries.values(), key=sort_key)))


def append_log(path: Path) -> TextIO:
    """The log `path` opened to append what the handler prints. The out folder may be handed over: anything
    there but a regular file (a FIFO would block the writer for ever, a link lead it elsewhere) is one line."""
    fix = "remove it, or pass another out folder"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise EvalError(f"{path} is not a regular file: {fix}")
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as exc:
        raise EvalError(f"cannot write {path}: {exc.strerror or exc}; {fix}") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # swapped since it was looked at
        os.close(descriptor)
        raise EvalError(f"{path} is not a regular file: {fix}")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "a")


def grade(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The official runner over the result files; the report from its score files and summary table."""
    package = bfcl.official()
    ids = [task["id"] for task in manifest["tasks"]]
    categories = sorted({task["level"] for task in manifest["tasks"]})
    tidy_results(out)
    done = bfcl.done_ids(out)
    partial = any(task_id not in done for task_id in ids) or bool(manifest.get("limit"))
    scores = bfcl.score_dir(out)
    log = out / "bfcl" / "runner.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)  # a handed-over folder's log could be a FIFO: writing to it would block
    except OSError as exc:
        raise EvalError(f"cannot write {log}: {exc.strerror or exc}; pass another out folder") from None
    present = [c for c in categories if any(i in done for i in ids_of(manifest, c))]
    bfcl.fresh_state()  # the runner replays the model's and the ground truth's calls from initial states
    for stale in [*scores.glob("*.csv"), *scores.rglob("*_score.json")] if scores.exists() else []:
        stale.unlink()
    failure = None
    if any(bfcl_jail.graded_by_execution(c) for c in present):  # it runs the model's calls: in the sandbox
        failure = bfcl_jail.grade_in_sandbox(out, present, partial, log)
    else:
        with log.open("w") as stream, contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            try:
                if present:
                    package.runner.runner(
                        [bfcl.model_dir()], present, bfcl.result_dir(out), scores, allow_missing=partial
                    )
            except Exception as exc:  # the runner's own failure (its summary table needs 2 items or more)
                failure = f"{type(exc).__name__}: {exc}"
    return report(out, manifest, present, partial, done) | {"runner_error": failure}


def ids_of(manifest: dict[str, Any], category: str) -> list[str]:
    return [task["id"] for task in manifest["tasks"] if task["level"] == category]


def report(out: Path, manifest: dict[str, Any], graded: list[str], partial: bool, done: set[str]) -> dict[str, Any]:
    """The report from the runner's score files; `done`: the items with a result line (read once, by `grade`)."""
    scores = bfcl.score_dir(out)
    per_category, wrong = {}, set()
    for path in (scores / bfcl.model_dir()).rglob("*_score.json") if (scores / bfcl.model_dir()).exists() else []:
        category = path.name.removeprefix(f"{bfcl.official().categories.VERSION_PREFIX}_").removesuffix("_score.json")
        if category in graded:
            head, *lines = score_lines(path, out)
            per_category[category] = {
                "accuracy": round(100 * head["accuracy"], 2),
                "correct": head["correct_count"],
                "total": head["total_count"],
            }
            wrong |= {str(line["id"]) for line in lines if "id" in line}
    overall = summary_row(scores / "data_overall.csv", out)
    scored = [t["id"] for t in manifest["tasks"] if "_prereq_" not in t["id"]]  # memory's prerequisites are not
    verdicts = {task_id: task_id not in wrong for task_id in scored if task_id in done}
    missing = [c for c in bfcl.RUNNABLE + AGENTIC if c not in graded]
    return {
        "kind": "bfcl",
        "bench": manifest["bench"],
        "grader": f"{bfcl.PACKAGE} eval_runner",
        "search_engine": search_engine(graded),
        "handler": f"{bfcl.official().entry['model_handler'].__name__} ({bfcl.HANDLER_ENTRY})",
        "items": len(manifest["tasks"]),
        "items_done": len(verdicts),
        "partial": partial,
        "correct": sum(verdicts.values()),
        "categories": per_category,
        "summary": overall,
        "not_run": missing,
        "missing_weight": missing_weight(missing),
        "wrong_ids": sorted(wrong),
    }


def score_lines(path: Path, out: Path) -> list[dict[str, Any]]:
    """A score file's lines: its head (accuracy, counts), then one line per wrong item. The runner writes it,
    in the sandbox when it runs model code; what comes back is checked before the report uses it."""
    lines = []
    for raw in bfcl.read_out_file(path, out).splitlines():
        try:
            line = json.loads(raw) if raw.strip() else None
        except (ValueError, RecursionError):
            line = "not JSON"
        if line is not None:
            lines.append(line)
    head = lines[0] if lines else None
    numbers = ("accuracy", "correct_count", "total_count")
    if not isinstance(head, dict) or not all(isinstance(head.get(k), int | float) for k in numbers):
        raise EvalError(f"{path} is not a score file of BFCL's runner (its first line: accuracy and counts)")
    if not all(isinstance(line, dict) for line in lines):
        raise EvalError(f"{path} is not a score file of BFCL's runner (a line that is not a JSON object)")
    return lines


def summary_row(path: Path, out: Path) -> dict[str, str]:
    """The official summary table's one row (ours is the only model in the score folder)."""
    if not path.exists():
        return {}
    text = bfcl.read_out_file(path, out).decode("utf-8", errors="replace")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise EvalError(f"{path} is not BFCL's summary table: {exc}") from None
    return {str(k): str(v) for k, v in rows[0].items()} if rows else {}


def missing_weight(missing: list[str]) -> dict[str, float]:
    """How much of each part of the overall the categories not run take away (as the official runner
    counts a category not run as 0)."""
    groups = {
        "non_live": ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple"),
        "live": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
        "irrelevance": ("irrelevance", "live_irrelevance"),
        "multi_turn": bfcl.GROUPS["multi_turn"],
        "agentic": AGENTIC,
    }
    return {part: WEIGHTS[part] for part, members in groups.items() if all(m in missing for m in members)} | {
        f"{part} (in part)": WEIGHTS[part]
        for part, members in groups.items()
        if any(m in missing for m in members) and not all(m in missing for m in members)
    }


def rerender(folder: Path) -> dict[str, Any]:
    """`nanbeige eval report` for a BFCL out folder: graded again by the official runner. The folder may be
    handed over: its manifest is read as such and each task must name its BFCL category."""
    manifest = read_manifest(folder / MANIFEST)
    if not all(isinstance(task.get("level"), str) for task in manifest["tasks"]):
        raise EvalError(f"{folder / MANIFEST} is not a BFCL eval's manifest (a task without its category)")
    result = grade(folder, manifest)
    (folder / REPORT).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def search_engine(categories: list[str]) -> str | None:
    """Which engine the web search categories ran on, for the report."""
    if not any(c in bfcl.WEB_SEARCH for c in categories):
        return None
    if bfcl.official_search():
        return "SerpAPI (the official engine)"
    from nanbeige.tools.search_config import choose_backend, config_from_env

    try:
        backend = choose_backend(config_from_env())
    except Exception:  # noqa: BLE001 - the report is written even when search is no longer set up
        backend = "unknown"
    return f"nanbeige's {backend} search backend, not the official engine: not the official number"
