"""A path a command is told to write that the system cannot take (a name over 255 bytes) is refused in one
line, with a non-zero exit, before any model is asked: never a crash. Run as a user runs them: real
processes, and an address on loopback where nothing listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanbeige.tools.index import build_index

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
NOTHING_THERE = "http://127.0.0.1:9/v1"
TOO_LONG = "n" * 300  # a name of 300 bytes: every Linux filesystem stops at 255


def nanbeige(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "200"}
    )


def gaia_data(folder: Path) -> Path:
    path = folder / "metadata.jsonl"
    row = {"task_id": "t1", "Question": "q", "Final answer": "a", "Level": 1, "file_name": ""}
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["ask", "hi", "--trajectory", f"{TOO_LONG}.jsonl"], "cannot write the trajectory to"),
        (["research", "hi", "--report", f"{TOO_LONG}.md"], "cannot write the report to"),
        (["research", "hi", "--trajectory", f"{TOO_LONG}.jsonl"], "cannot write the trajectory to"),
        (["eval", "gaia", "--data", "metadata.jsonl", "--out", TOO_LONG], "pass another --out"),
        (["train", "--model", "m", "--data", "metadata.jsonl", "--out", TOO_LONG], "cannot write to --out"),
        (["loop", "--model", "m", "--questions", "metadata.jsonl", "--out", TOO_LONG], "cannot write to --out"),
        (["collect", "--questions", "metadata.jsonl", "--out", f"{TOO_LONG}.jsonl"], "cannot write --out"),
        (["synth", "--corpus", "index", "--out", f"{TOO_LONG}.jsonl"], "cannot write --out"),
    ],
)
def test_a_name_too_long_for_the_filesystem_is_one_line(tmp_path: Path, command: list[str], words: str) -> None:
    gaia_data(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "otters.md").write_text("Sea otters hold hands while they sleep.")
    build_index([tmp_path / "docs"], tmp_path / "index")
    before = sorted(os.listdir(tmp_path))
    judge = ["--judge-base-url", NOTHING_THERE, "--judge-model", "judge"] if command[0] == "eval" else []
    result = nanbeige(*command, "--base-url", NOTHING_THERE, *judge, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "crashed" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0] and "File name too long" in errors[0], result.stderr
    assert sorted(os.listdir(tmp_path)) == before  # nothing made
