"""The out folder of an eval (its layout is in `runner.py`'s docstring): the manifest that a resume is checked
against, the results file read back and appended to, and the refusal of a folder holding a symbolic link. The
runner, `eval report`, BFCL's pipeline and the Ray shards all read and write the folder through these."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.files import append_jsonl, file_sha256, first_link
from nanbeige.evals.grading import grader_name
from nanbeige.evals.tasks import Task
from nanbeige.tools import handed_over

RESULTS, TRAJECTORIES, MANIFEST, REPORT = "results.jsonl", "trajectories.jsonl", "eval.json", "report.json"
MAX_RESULTS_BYTES = 1024 * handed_over.MIB  # a result row is a few hundred bytes: millions of runs fit
MAX_MANIFEST_BYTES = 256 * handed_over.MIB  # the task list of the largest benchmark is a few megabytes


def manifest(
    config: EvalConfig, tasks: list[Task], reference: dict[str, Any] | None = None, judge_prompt: str | None = None
) -> dict[str, Any]:
    """What `eval.json` records: enough to check a resume and to re-render the report without the data.
    `reference`: the reference checkout the prompts came from (`--reference`), commit and hash."""
    data = config.data
    return {
        "bench": config.bench.name,
        "data": str(data.resolve()) if data else None,
        "data_sha256": file_sha256(data) if data and data.is_file() else tasks_sha256(tasks),
        "k": config.k,
        "limit": config.limit,
        "grader": grader_name(config),
        "judge_model": judge_model(config),
        "reference": reference,
        "judge_prompt": judge_prompt,
        "tasks": [{"id": task.id, "level": task.level} for task in tasks],
    }


def judge_prompt_origin(config: EvalConfig, reference_prompts: dict[str, str]) -> str | None:
    """Where the judge's prompt comes from, for the report."""
    from nanbeige.evals import judges

    name = grader_name(config)
    if name not in judges.PROFILES:
        return None
    if config.judge.template is not None:
        return f"the file {config.judge.template}"
    if name.endswith("/reference") and name.split("/")[0] in reference_prompts:
        return "the reference checkout's evaluator (its own text)"
    return "nanbeige's own words, with the source's fields and decision rule"


def judge_model(config: EvalConfig) -> str | None:
    from nanbeige.evals import judges

    name = grader_name(config)
    return None if name not in judges.PROFILES else config.judge.model or judges.PROFILES[name].model


def tasks_sha256(tasks: list[Task]) -> str:
    """A hash of what was loaded (ids, questions, answers), for data given as a folder."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(json.dumps([task.id, task.question, task.answer], ensure_ascii=False).encode())
    return digest.hexdigest()


def prepare_out(
    config: EvalConfig, tasks: list[Task], reference: dict[str, Any] | None = None, judge_prompt: str | None = None
) -> dict[str, Any]:
    """Create the out folder, or check that the one there holds this same eval (to be resumed);
    returns the manifest."""
    wanted = manifest(config, tasks, reference, judge_prompt)
    path = config.out / MANIFEST
    try:
        refuse_links(config.out)
        resumed = path.exists()
    except OSError as exc:  # even looking fails: a name over 255 bytes, a folder that cannot be read
        raise EvalError(f"cannot use {config.out}: {exc.strerror or exc}; pass another --out") from None
    if resumed:
        found = read_manifest(path)
        for key in ("bench", "data_sha256", "grader", "judge_model", "k", "limit", "reference"):
            if found.get(key) != wanted[key]:
                raise EvalError(
                    f"{config.out} holds an eval with {key} {found.get(key)!r}, not {wanted[key]!r}; "
                    "pass the same options to resume it, or another --out to start a new one"
                )
        return found
    try:
        config.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(wanted, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise EvalError(f"cannot write to {config.out}: {exc.strerror or exc}; pass another --out") from None
    return wanted


def read_results(out: Path, notice: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The graded runs so far. A last line torn by a kill is skipped, saying so (that run is done again,
    and the next append cuts it off); any other line that is not a result row is an `EvalError` naming it."""
    path = out / RESULTS
    if not path.exists():
        return []
    rows = []
    try:
        lines = handed_over.read_bytes(path, MAX_RESULTS_BYTES, inside=out).split(b"\n")
    except (OSError, ValueError) as exc:
        raise EvalError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}; pass another --out") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        problem = result_problem(row)
        if problem is None:
            rows.append(row)
        elif row is None and number == len(lines):  # no line break after it: the write was cut short
            if notice is not None:
                notice(
                    f"warning: {path}:{number}: the last line is cut short (a run killed mid-line?); skipped, "
                    "that run is done again"
                )
        else:
            raise EvalError(
                f"{path}:{number}: {problem}, not a result row of `nanbeige eval`; mend or remove the "
                "line, or pass another --out"
            )
    return rows


RESULT_FIELDS = {
    "task_id": (str,),
    "run": (int,),
    "correct": (bool, type(None)),
    "turns": (int, float, type(None)),
    "tool_calls": (int, float, type(None)),
    "stop_reason": (str, type(None)),
    "prediction": (str, type(None)),
    "usage": (dict, type(None)),
    "confidence": (int, float, type(None)),
}


def result_problem(row: Any) -> str | None:
    """Why a line of `results.jsonl` cannot be read as a result row, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    for name in ("task_id", "run", "correct"):
        if name not in row:
            return f"no {name!r}"
    for name, allowed in RESULT_FIELDS.items():
        value = row.get(name)
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            return f"{name!r} is {type(value).__name__}"
    return None


def refuse_links(out: Path) -> None:
    """An out folder may be someone else's (`eval report`, a resume): a symbolic link in it would lead the
    results, the report, score files or memory snapshots written there onto a file outside it. A folder
    holding one is refused before anything is read or written."""
    link = first_link(out) if out.is_dir() else None
    if link is not None:
        raise EvalError(
            f"{link} is a symbolic link: an eval's files are written only inside its folder {out}; "
            "remove the link, or pass another --out"
        )


def read_manifest(path: Path) -> dict[str, Any]:
    """`eval.json` of an out folder, checked to be one, in a folder without links (`refuse_links`)."""
    refuse_links(path.parent)
    try:
        found = json.loads(handed_over.read_bytes(path, MAX_MANIFEST_BYTES, inside=path.parent))
    except handed_over.HandedOverError as exc:
        raise EvalError(f"{exc}; pass another --out") from None
    except OSError as exc:
        raise EvalError(f"cannot read {path}: {exc.strerror or exc} (is {path.parent} an eval's out folder?)") from None
    except (ValueError, RecursionError) as exc:
        raise EvalError(f"{path} is not an eval's manifest: not JSON ({exc}); pass another --out") from None
    if (
        not isinstance(found, dict)
        or not isinstance(found.get("tasks"), list)
        or not all(isinstance(task, dict) and isinstance(task.get("id"), str) for task in found["tasks"])
    ):
        raise EvalError(f"{path} is not an eval's manifest (an object with its tasks); pass another --out")
    return found


def append_result(out: Path, row: dict[str, Any], secrets: list[str] | None = None) -> None:
    append_jsonl(out / RESULTS, row, secrets)


def pending_runs(tasks: list[Task], k: int, rows: list[dict[str, Any]]) -> list[tuple[Task, int]]:
    done = {(row["task_id"], row["run"]) for row in rows}
    return [(task, r) for r in range(k) for task in tasks if (task.id, r) not in done]
