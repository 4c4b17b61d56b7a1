"""`code-tests` on E2B: with a key (E2B_API_KEY), `nanbeige judge --grader code-tests` runs each program and the
same harness in an E2B sandbox, the tests on stdin, the limits kept inside the sandbox by its launcher. Run
through the real command against `fake_e2b.py`, which imitates the SDK and runs the commands for real here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_code_judge import (
    ADD,
    ADD_HALF,
    ADD_RIGHT,
    SUM_TWO,
    SUM_TWO_HALF,
    SUM_TWO_RIGHT,
    fenced,
    judged,
    problems_file,
    rollout,
)
from test_judge import assert_one_error_line, write

FAKE_E2B = Path(__file__).with_name("fake_e2b.py")
KEY = "e2b_k3y_never_shown_0123456789"
CHECKED = {
    "id": "add-checked",
    "statement": "Write add(a, b).",
    "entry_point": "add",
    "tests": [{"assert": "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(candidate)\n"}],
}


def judge_on_e2b(tmp_path: Path, rollouts: list[Any], **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    root = tmp_path / "e2b"
    root.mkdir(exist_ok=True)
    src, out = write(tmp_path / "in.jsonl", rollouts), tmp_path / "out.jsonl"
    problems = problems_file(tmp_path, SUM_TWO, ADD, CHECKED)
    result = subprocess.run(
        [
            sys.executable,
            str(FAKE_E2B),
            "judge",
            str(src),
            "--out",
            str(out),
            "--no-critic",
            "--grader",
            "code-tests",
            "--problems",
            str(problems),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_plain_env(), "E2B_API_KEY": KEY, "FAKE_E2B_ROOT": str(root), "COLUMNS": "200", **env},
    )
    return result, out


def _plain_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("NANBEIGE_SANDBOX_", "E2B_"))}


def test_with_a_key_programs_are_graded_in_e2b_sandboxes_as_in_the_local_jail(tmp_path: Path) -> None:
    """Same rewards as the local jail gives: stdin/stdout, call and assert tests; the start line names E2B;
    the key reaches E2B's SDK and no output."""
    result, out = judge_on_e2b(
        tmp_path,
        [
            rollout("stdio-right", "sum-two", fenced(SUM_TWO_RIGHT)),
            rollout("stdio-half", "sum-two", fenced(SUM_TWO_HALF)),
            rollout("call-right", "add", fenced(ADD_RIGHT)),
            rollout("call-half", "add", fenced(ADD_HALF)),
            rollout("assert-right", "add-checked", fenced(ADD_RIGHT)),
            rollout("assert-wrong", "add-checked", fenced("def add(a, b):\n    return a - b\n")),
        ],
    )
    assert result.returncode == 0, result.stderr
    assert "code-tests runs programs in E2B sandboxes" in result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {
        "stdio-right": 1.0,
        "stdio-half": 0.5,
        "call-right": 1.0,
        "call-half": 0.5,
        "assert-right": 1.0,
        "assert-wrong": 0.0,
    }
    assert found["assert-wrong"].judge["counts"]["fail"] == 1
    created = [json.loads(line) for line in (tmp_path / "e2b" / "created.jsonl").read_text().splitlines()]
    assert created and all(c["key_given"] for c in created)  # the known-good check's sandbox, then one each
    assert KEY not in out.read_text() + result.stdout + result.stderr


def test_the_tests_reach_the_harness_on_stdin_never_in_a_file(tmp_path: Path) -> None:
    """A program that looks through its sandbox's home for the check's source finds only its own and the
    harness's files; the program also runs with no_new_privs (no sudo to read the judge's side)."""
    snoop = (
        "import os\nSEEN = [open(f).read() for f in os.listdir('.') if os.path.isfile(f)]\n"
        "PRIVS = open('/proc/self/status').read()\n"
        "def add(a, b):\n    assert 'NoNewPrivs:\\t1' in PRIVS\n"
        "    assert not any('def ' + 'check' in text for text in SEEN)\n    return a + b\n"
    )  # not its own text
    result, out = judge_on_e2b(tmp_path, [rollout("snoop", "add-checked", fenced(snoop))])
    assert result.returncode == 0, result.stderr
    assert judged(out)["snoop"].reward == 1.0, judged(out)["snoop"].judge


def test_a_program_that_kills_its_launcher_is_its_own_failure_and_judge_goes_on(tmp_path: Path) -> None:
    """The launcher's report never comes; a known-good program in a fresh sandbox runs, so the program is
    to blame: reward 0 with the reason, and the next trajectory is judged."""
    killer = "import os\nos.kill(os.getppid(), 9)\n"  # a stdin/stdout program's parent is its launcher
    result, out = judge_on_e2b(
        tmp_path, [rollout("killer", "sum-two", fenced(killer)), rollout("after", "sum-two", fenced(SUM_TWO_RIGHT))]
    )
    assert result.returncode == 0, result.stderr
    found = judged(out)
    assert {id: t.reward for id, t in found.items()} == {"killer": 0.0, "after": 1.0}
    assert all("killed its sandbox" in test["detail"] for test in found["killer"].judge["tests"])


def test_sandboxes_that_cannot_start_stop_judge_in_one_line_without_the_key(tmp_path: Path) -> None:
    """The machine's failure is never a reward: judge stops before the first trajectory, and E2B's message,
    which echoes the key here, is shown without it."""
    result, out = judge_on_e2b(tmp_path, [rollout("right", "sum-two", fenced(SUM_TWO_RIGHT))], FAKE_E2B_BROKEN="1")
    line = assert_one_error_line(result, "code-tests cannot run programs on E2B", "no sandboxes left")
    assert KEY not in result.stderr + result.stdout and "[E2B_API_KEY]" in line
    assert not out.exists() or not judged(out)


def test_an_envd_that_cannot_close_stdin_is_a_one_line_refusal(tmp_path: Path) -> None:
    """stdin/stdout programs read to the end of their input: without closing stdin E2B cannot grade them."""
    result, _ = judge_on_e2b(tmp_path, [rollout("right", "sum-two", fenced(SUM_TWO_RIGHT))], FAKE_E2B_OLD_ENVD="1")
    assert_one_error_line(result, "code-tests on E2B needs a sandbox that can close a command's stdin")
