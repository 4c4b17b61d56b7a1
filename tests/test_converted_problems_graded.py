"""Code problems converted by `nanbeige problems FILE --format NAME` (APPS, LiveCodeBench, CodeContests), judged
by the real grader: known-correct programs earn full reward, and on LiveCodeBench's problems the grader gives
the same verdicts as LiveCodeBench's own harness but for the differences its rules explain (docs/code-rl.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import JAIL
from test_cli import nanbeige
from test_code_formats import (
    APPS_CALL,
    APPS_LINES,
    APPS_METHOD,
    APPS_SUM,
    FUNCTIONAL,
    LEETCODE_STARTER,
    PRIVATE_CASES,
    PRIVATE_FUNCTIONAL,
    STDIN_CASES,
    SUM_PROGRAM,
    compressed,
    contest_row,
    convert,
    jsonl,
    lcb_row,
    parquet,
)
from test_code_judge import fenced, rollout
from test_judge import write

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

pytestmark_jail = pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")

MAX_SCORE = "def maxScore(nums, k):\n    return sum(sorted(nums)[-k:])\n"
MAX_SCORE_WRONG = "def maxScore(nums, k):\n    return max(nums)\n"
ADD = "def add(a, b):\n    return a + b\n"


@pytestmark_jail
def test_known_correct_programs_earn_full_reward_on_converted_problems(tmp_path: Path) -> None:
    apps = jsonl(tmp_path / "apps.jsonl", [APPS_SUM, APPS_LINES, APPS_CALL, APPS_METHOD])
    lcb = jsonl(
        tmp_path / "lcb.jsonl",
        [
            lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
            lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore", LEETCODE_STARTER),
        ],
    )
    contests = parquet(tmp_path / "cc.parquet", [contest_row("1A. Sum")])
    problems = tmp_path / "problems.jsonl"
    parts = [
        convert(source, form, tmp_path / f"{form}.out.jsonl")
        for source, form in ((apps, "apps"), (lcb, "livecodebench"), (contests, "codecontests"))
    ]
    assert all(result.returncode == 0 for result, _ in parts)
    problems.write_text(
        "".join((tmp_path / f"{form}.out.jsonl").read_text() for form in ("apps", "livecodebench", "codecontests"))
    )
    src = write(
        tmp_path / "in.jsonl",
        [
            rollout("apps-sum", "apps-1", fenced(SUM_PROGRAM)),
            rollout("apps-lines", "apps-2", fenced(SUM_PROGRAM)),
            rollout("apps-add", "apps-3", fenced(ADD)),
            rollout("apps-method", "apps-4", fenced(MAX_SCORE)),
            rollout("lcb-stdin", "abc001_a", fenced(SUM_PROGRAM)),
            rollout("lcb-call", "2847", fenced(MAX_SCORE)),
            rollout("cc-sum", "1A. Sum", fenced(SUM_PROGRAM)),
            rollout("lcb-call-wrong", "2847", fenced(MAX_SCORE_WRONG)),
            rollout("cc-wrong", "1A. Sum", fenced("print(3)\n")),
        ],
    )
    out = tmp_path / "judged.jsonl"
    result = nanbeige(
        "judge",
        str(src),
        "--out",
        str(out),
        "--no-critic",
        "--grader",
        "code-tests",
        "--problems",
        str(problems),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    rewards = {t.id: t.reward for t in load_trajectories(out)}
    assert rewards == {
        "apps-sum": 1.0,
        "apps-lines": 1.0,
        "apps-add": 1.0,
        "apps-method": 1.0,
        "lcb-stdin": 1.0,
        "lcb-call": 1.0,
        "cc-sum": 1.0,
        "lcb-call-wrong": 0.5,
        "cc-wrong": 0.25,
    }


# ---------------------------------------------------------------- against LiveCodeBench's own harness


def livecodebench_verdict(cases: list[dict[str, str]], func_name: str | None, program: str) -> bool:
    """Whether LiveCodeBench's own `run_test` (as NVIDIA packages it) passes PROGRAM on every case, in a process
    of its own: its reliability guard disables much of `os` for the rest of the process."""
    sample = {
        "input_output": json.dumps(
            {"inputs": [c["input"] for c in cases], "outputs": [c["output"] for c in cases], "fn_name": func_name}
        )
    }
    script = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.find_spec('livecodebench')\n"
        "path = spec.submodule_search_locations[0] + '/evaluation/testing_util.py'\n"
        "module_spec = importlib.util.spec_from_file_location('lcb_testing_util', path)\n"
        "util = importlib.util.module_from_spec(module_spec)\n"
        "module_spec.loader.exec_module(util)\n"
        "sample, program = json.loads(sys.stdin.read())\n"
        "results, _ = util.run_test(sample, test=program, timeout=6)\n"
        "sys.__stdout__.write('\\nVERDICT ' + json.dumps(all(r is True for r in results)) + '\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([sample, program]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("VERDICT ")]
    assert verdicts, done.stderr
    return json.loads(verdicts[-1].split(" ", 1)[1])


LCB_PROGRAMS = {  # (problem, program): the same program text goes to both harnesses
    "stdin-right": ("abc001_a", SUM_PROGRAM),
    "stdin-wrong": ("abc001_a", "print(3)\n"),
    "stdin-crash": ("abc001_a", "raise ValueError('no')\n"),
    "stdin-leading-space": ("abc001_a", "a, b = map(int, input().split())\nprint(' ', a + b)\n"),
    "stdin-float": ("abc001_a", "a, b = map(int, input().split())\nprint(float(a + b))\n"),
    "call-right": ("2847", MAX_SCORE),
    "call-wrong": ("2847", MAX_SCORE_WRONG),
    "call-method": (
        "2847",
        "class Solution:\n    def maxScore(self, nums, k):\n        return sum(sorted(nums)[-k:])\n",
    ),
}
LCB_DIFFERENCES = {
    # LiveCodeBench strips each line and compares numbers as decimals; the grader compares line by line with
    # trailing spaces ignored (docs/code-rl.md)
    "stdin-leading-space": "leading spaces",
    "stdin-float": "3.0 is not 3",
    # the converted statement asks for a top-level function; LiveCodeBench calls Solution().maxScore
    "call-method": "class Solution",
}


@pytestmark_jail
@pytest.mark.skipif(
    importlib.util.find_spec("livecodebench") is None,
    reason="LiveCodeBench's harness (nvidia-livecodebench, tests/oracles.txt) is not installed",
)
def test_the_grader_agrees_with_livecodebench_own_harness_on_converted_problems(tmp_path: Path) -> None:
    rows = {"abc001_a": (STDIN_CASES + PRIVATE_CASES, None), "2847": (FUNCTIONAL + PRIVATE_FUNCTIONAL, "maxScore")}
    source = jsonl(
        tmp_path / "lcb.jsonl",
        [
            lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
            lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore", LEETCODE_STARTER),
        ],
    )
    result, _ = convert(source, "livecodebench", tmp_path / "problems.jsonl")
    assert result.returncode == 0, result.stderr
    src = write(
        tmp_path / "in.jsonl",
        [rollout(name, problem, fenced(program)) for name, (problem, program) in LCB_PROGRAMS.items()],
    )
    out = tmp_path / "judged.jsonl"
    judged = nanbeige(
        "judge",
        str(src),
        "--out",
        str(out),
        "--no-critic",
        "--grader",
        "code-tests",
        "--problems",
        str(tmp_path / "problems.jsonl"),
        timeout=180,
    )
    assert judged.returncode == 0, judged.stderr
    ours = {t.id: bool(t.judge["solved"]) for t in load_trajectories(out)}
    theirs = {name: livecodebench_verdict(*rows[problem], program) for name, (problem, program) in LCB_PROGRAMS.items()}
    assert theirs == {
        name: True for name in ("stdin-right", "stdin-leading-space", "stdin-float", "call-right", "call-method")
    } | {"stdin-wrong": False, "stdin-crash": False, "call-wrong": False}
    disagree = {name for name in LCB_PROGRAMS if ours[name] != theirs[name]}
    assert disagree == set(LCB_DIFFERENCES)  # every other program: the same verdict from both
