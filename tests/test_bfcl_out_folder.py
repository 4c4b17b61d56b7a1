"""A BFCL out folder may come from anyone (`nanbeige eval report` on a folder handed over, an eval resumed in
it): its result files are read as handed over (no FIFO, no link out, size capped) and its manifest is checked
before anything uses it. What is wrong is one line and a non-zero exit, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanbeige.evals import bfcl
from nanbeige.evals.eval_config import EvalError

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
GIB = 1024**3


def nanbeige(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command as a user runs it; a reader that blocks on a FIFO fails by the timeout."""
    return subprocess.run([NANBEIGE, *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert all(word in error for word in words), done.stderr


def handed_over_folder(tmp_path: Path, task: dict[str, str]) -> Path:
    """An out folder of one simple item, as someone could hand it over; its result file left to each test."""
    out = tmp_path / "X"
    (out / "bfcl" / "result" / bfcl.model_dir()).mkdir(parents=True)
    (out / "eval.json").write_text(json.dumps({"bench": "bfcl", "tasks": [task]}))
    return out


def result_file(out: Path) -> Path:
    return out / "bfcl" / "result" / bfcl.model_dir() / "BFCL_v4_simple_python_result.json"


def test_eval_report_answers_a_result_file_that_is_a_fifo_in_one_line(tmp_path: Path) -> None:
    out = handed_over_folder(tmp_path, {"id": "simple_python_0", "level": "simple_python"})
    os.mkfifo(result_file(out))  # no writer ever opens it: a plain read never returns
    one_line_error(nanbeige("eval", "report", "X", cwd=tmp_path), "_result.json is not a regular file")


def test_eval_report_refuses_a_sparse_giant_result_file_unread(tmp_path: Path) -> None:
    out = handed_over_folder(tmp_path, {"id": "simple_python_0", "level": "simple_python"})
    with open(result_file(out), "wb") as file:
        file.truncate(6 * GIB)  # read whole, a MemoryError traceback
    one_line_error(nanbeige("eval", "report", "X", cwd=tmp_path), "_result.json is 6144.0 MiB, more than")


def test_eval_report_refuses_a_manifest_task_without_its_category_in_one_line(tmp_path: Path) -> None:
    handed_over_folder(tmp_path, {"id": "simple_python_0"})  # was a KeyError traceback
    one_line_error(nanbeige("eval", "report", "X", cwd=tmp_path), "eval.json", "BFCL")


def test_a_resumed_bfcl_eval_answers_a_result_file_that_is_a_fifo_in_one_line(tmp_path: Path) -> None:
    """The first run writes the folder's manifest and stops (no model here); the second resumes it."""
    command = ["eval", "bfcl-simple-python", "--limit", "1", "--out", "X", "--base-url", "http://127.0.0.1:9/v1"]
    nanbeige(*command, cwd=tmp_path)
    assert (tmp_path / "X" / "eval.json").is_file()
    (tmp_path / "X" / "bfcl" / "result" / bfcl.model_dir()).mkdir(parents=True, exist_ok=True)
    os.mkfifo(result_file(tmp_path / "X"))
    one_line_error(nanbeige(*command, cwd=tmp_path), "_result.json is not a regular file")


def test_a_resumed_bfcl_eval_appends_to_no_log_that_is_a_fifo(tmp_path: Path) -> None:
    command = ["eval", "bfcl-simple-python", "--limit", "1", "--out", "X", "--base-url", "http://127.0.0.1:9/v1"]
    nanbeige(*command, cwd=tmp_path)
    (tmp_path / "X" / "bfcl" / "generator.log").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "X" / "bfcl" / "generator.log")  # opened to append, with no reader, it blocks for ever
    one_line_error(nanbeige(*command, cwd=tmp_path), "generator.log is not a regular file")


def test_done_ids_never_reads_a_result_file_through_a_link(tmp_path: Path) -> None:
    private = tmp_path / "private.json"
    private.write_text(json.dumps({"id": "simple_python_0"}) + "\n")
    out = handed_over_folder(tmp_path, {"id": "simple_python_0", "level": "simple_python"})
    result_file(out).symlink_to(private)
    with pytest.raises(EvalError, match="is a symbolic link"):
        bfcl.done_ids(out)


def test_eval_report_writes_no_runner_log_into_a_fifo_planted_there(tmp_path: Path) -> None:
    out = handed_over_folder(tmp_path, {"id": "simple_python_0", "level": "simple_python"})
    os.mkfifo(out / "bfcl" / "runner.log")  # opened to write, with no reader, it blocks for ever
    done = nanbeige("eval", "report", "X", cwd=tmp_path)
    assert done.returncode == 0 and "0 of 1 items" in done.stdout, done.stdout + done.stderr
    assert (out / "bfcl" / "runner.log").is_file()
