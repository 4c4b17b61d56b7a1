"""Why eval runs failed, kept where people look: a graded program's first failing test with its first error line
(`failure` in results.jsonl, the report's list of failures), a run's own error, the failed runs' errors; and the
progress line, which shows the time since the start and an ETA from the first finished run on."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import JAIL
from fake_openai import FakeOpenAI, Reply
from test_cli import nanbeige
from test_code_judge import fenced
from test_code_problems import code_model, eval_command
from test_eval_runner import NANBEIGE, scripted_model, write_gaia

needs_jail = pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")

ASSERTED = {
    "id": "asserted",
    "statement": "Write triple(x), which returns 3 * x.",
    "entry_point": "triple",
    "tests": [{"assert": "assert candidate(1) == 3\nassert candidate(2) == 6, 'triple(2) must be 6'\n"}],
}
NAMED = {
    "id": "named",
    "statement": "Write half(x), which returns x / 2.",
    "entry_point": "half",
    "tests": [{"args": "[4]", "expected": "2.0"}, {"args": "[1]", "expected": "0.5"}],
}
SLOW = {
    "id": "slow",
    "statement": "Write stop(x), which returns x.",
    "entry_point": "stop",
    "time_limit_s": 1,
    "tests": [{"args": "[1]", "expected": "1"}],
}
NOISY = {
    "id": "noisy",
    "statement": "Write quiet(x), which returns x.",
    "entry_point": "quiet",
    "tests": [{"args": "[1]", "expected": "1"}],
}
PROGRAMS = {
    ASSERTED["statement"]: "def triple(x):\n    return 3 if x == 1 else 5\n",  # the second assertion fails
    NAMED["statement"]: "def half(x):\n    return x / divisor\n",
    SLOW["statement"]: "def stop(x):\n    while True:\n        pass\n",
    # a message with a terminal escape, a line break and a fake verdict, far longer than a report line
    NOISY["statement"]: "def quiet(x):\n    raise ValueError('\\x1b[2J\\x1b[31mall tests passed\\n' + 'x' * 500)\n",
}
EXPECTED = {
    "asserted": "test 1 of 1: AssertionError: triple(2) must be 6 at `assert candidate(2) == 6, 'triple(2) must be 6'`",
    "named": "test 1 of 2: NameError: name 'divisor' is not defined",
    "slow": "test 1 of 1: timed out after 1 s",
}


@needs_jail
def test_a_failing_program_keeps_its_first_error_line_in_results_and_report(tmp_path: Path) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(row) + "\n" for row in (ASSERTED, NAMED, SLOW, NOISY)))
    out = tmp_path / "out"
    with FakeOpenAI(code_model({key: fenced(program) for key, program in PROGRAMS.items()})) as server:
        result = nanbeige(*eval_command("code", out, server, "--data", str(problems)), timeout=180)
    assert result.returncode == 0, result.stderr
    rows = {row["task_id"]: row for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert {id: row["failure"] for id, row in rows.items() if id in EXPECTED} == EXPECTED
    assert all(row["correct"] is False and row["error"] is None for row in rows.values())  # the runs went well
    assert rows["named"]["reason"] == "pass rate 0.000 (2 error)"  # the counts stay where they were
    noisy = rows["noisy"]["failure"]
    assert noisy.startswith("test 1 of 1: ValueError: [2J[31mall tests passed x") and len(noisy) == 200
    assert not any(ord(char) < 32 or char == "\x7f" for char in noisy)  # no escape, no line break reaches a terminal

    report = json.loads((out / "report.json").read_text())
    assert [(f["task_id"], f["why"]) for f in report["failures"]] == [
        ("asserted", EXPECTED["asserted"]),
        ("named", EXPECTED["named"]),
        ("slow", EXPECTED["slow"]),
        ("noisy", noisy),
    ]
    for id, why in EXPECTED.items():
        assert f"- {id} run 0: {why}" in result.stdout
    again = subprocess.run([NANBEIGE, "eval", "report", str(out)], capture_output=True, text=True)
    assert again.returncode == 0 and f"- named run 0: {EXPECTED['named']}" in again.stdout


@needs_jail
def test_humaneval_says_which_name_the_program_lacked(tmp_path: Path) -> None:
    """The run a new user saw as `pass rate 0.000 (7 error)` and nothing else."""
    from nanbeige.evals.humaneval import humaneval_problems

    [first] = humaneval_problems()[:1]
    program = f"def {first.entry_point}(numbers, threshold):\n    return any_close(numbers, threshold)\n"
    out = tmp_path / "out"
    with FakeOpenAI(code_model({first.statement: fenced(program)})) as server:
        result = nanbeige(*eval_command("humaneval", out, server, "--limit", "1"), timeout=180)
    assert result.returncode == 0, result.stderr
    [row] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["reason"] == f"pass rate 0.000 ({len(first.tests)} error)"
    assert row["failure"] == f"test 1 of {len(first.tests)}: NameError: name 'any_close' is not defined"
    assert f"- {first.id} run 0: {row['failure']}" in result.stdout


def test_failed_runs_are_listed_with_their_errors_and_a_runs_own_error_is_kept(tmp_path: Path) -> None:
    """A run the model server failed is not recorded (a resume runs it again): the report lists it with the
    server's error. A run that ended with an error of its own (here its budget) keeps it in its row."""
    data = write_gaia(tmp_path / "gaia")
    answer = scripted_model()

    def model(request: dict[str, Any]) -> Reply:
        if "six times seven" in request["messages"][1]["content"]:
            return Reply(status=400, body={"error": {"message": "the prompt broke the \x1b[31mserver\x1b[0m"}})
        return answer(request)

    out = tmp_path / "out"
    with FakeOpenAI(model) as server:
        result = nanbeige(
            "eval",
            "gaia",
            "--grader",
            "official",
            "--data",
            str(data),
            "--out",
            str(out),
            "-k",
            "1",
            "--concurrency",
            "1",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    [failed] = report["failed_run_errors"]
    assert (failed["task_id"], failed["run"], report["failed_runs"]) == ("t2", 0, 1)
    assert "the prompt broke the [31mserver[0m" in failed["error"] and "\x1b" not in failed["error"], failed
    assert "Runs that failed and are not counted" in result.stdout
    assert f"- t2 run 0: {failed['error']}" in result.stdout


def test_a_runs_own_error_goes_in_its_row_and_the_reports_failures() -> None:
    from nanbeige.agent.trajectory.trajectory import Trajectory
    from nanbeige.evals.runner import result_row
    from nanbeige.evals.scores import build_report
    from nanbeige.evals.tasks import Task, Verdict

    trajectory = Trajectory(question="q", stop_reason="budget", error="the run's budget of $0.10\nran out")
    row = result_row(
        Task(id="a", question="q", answer="x"), 0, None, Verdict(correct=False, grader="gaia-exact"), trajectory
    )
    assert (row["error"], row["failure"]) == ("the run's budget of $0.10 ran out", None)
    report = build_report({"bench": "gaia", "grader": "gaia-exact", "k": 1, "tasks": [{"id": "a"}]}, [row])
    assert report["failures"] == [{"task_id": "a", "run": 0, "why": "the run's budget of $0.10 ran out"}]


def test_progress_shows_elapsed_and_an_eta_estimate_before_the_first_run_ends(tmp_path: Path) -> None:
    data, out = write_gaia(tmp_path / "gaia"), tmp_path / "out"
    with FakeOpenAI(scripted_model(delay_s=1.0)) as server:  # a run: its answer and the summary turn, 2 s
        result = subprocess.run(
            [
                NANBEIGE,
                "eval",
                "gaia",
                "--grader",
                "official",
                "--data",
                str(data),
                "--out",
                str(out),
                "-k",
                "1",
                "--limit",
                "2",
                "--concurrency",
                "1",
                "--base-url",
                server.base_url,
                "--no-default-servers",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NANBEIGE_PROGRESS_EVERY": "0.3"},
        )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("gaia: ")]
    before = [line for line in lines if line.startswith("gaia: 0/2 runs")]
    assert before and all(re.search(r"ETA estimating · \d+s elapsed$", line) for line in before), lines
    assert any(line.startswith("gaia: 0/2 runs · 1 running") for line in before), lines  # in flight
    assert any(re.search(r"[1-9]s elapsed$", line) for line in before), lines  # the clock runs from the start
    after = [line for line in lines if line.startswith("gaia: 1/2 runs · 1 running")]
    # the second run's ETA, or, once it has run longer than the first took, that it cannot be told
    eta = r"ETA (\d+s|unknown \(1 running, the longest for \d+s\)) · \d+s elapsed$"
    assert after and all(re.search(eta, line) for line in after), lines
    assert lines[-1].startswith("gaia: 2/2 runs · 0 running") and " ETA 0s · " in lines[-1]


def test_the_eta_counts_down_while_runs_are_in_flight() -> None:
    import time

    from nanbeige.evals.progress import Progress

    progress = Progress(total=5)
    first = progress.began_one()
    progress.began_one()
    assert progress.eta_s() is None  # nothing to go by before a run ends
    progress.ended_one(first, done=True)
    progress.done, progress.run_s = 1, 10.0  # a run of 10 s
    progress.in_flight[0] = second = time.monotonic() - 4  # the second began 4 s ago
    # 4 runs left of 10 s each, 4 s of one done already, 1 running: 36 s
    assert progress.eta_s() == pytest.approx(36, abs=0.5)
    progress.ended_one(second, done=False)  # a failed run is not timed
    assert (progress.running, progress.timed, progress.eta_s()) == (0, 1, pytest.approx(40))


def test_the_eta_is_unknown_not_0s_once_only_runs_in_flight_are_left_and_one_is_slower_than_the_others() -> None:
    """A first eval of 2 tasks said "ETA 0s" for minutes while its last run went on."""
    import io
    import time

    from rich.console import Console

    from nanbeige.agent.cli.view import RunsView
    from nanbeige.evals.progress import Progress

    progress = Progress(total=2)
    first, last = progress.began_one(), progress.began_one()
    progress.ended_one(first, done=True)
    progress.done, progress.run_s = 1, 10.0  # the first took 10 s
    progress.in_flight[0] = time.monotonic() - 4  # the last began 4 s ago: 6 s to go, as runs have gone
    assert progress.eta_s() == pytest.approx(6, abs=0.5)
    progress.in_flight[0] = time.monotonic() - 200  # 200 s and going: when it ends cannot be told
    assert progress.eta_s() is None
    view = RunsView(Console(file=io.StringIO()), progress, "gaia")
    view.stop()
    assert "ETA unknown (1 running, the longest for 3m20s)" in view._plain_line()
    assert last


def test_an_eval_without_out_that_cannot_start_leaves_no_folder_and_one_stopped_names_its_folder(
    tmp_path: Path,
) -> None:
    """Without --out each eval gets a new folder: one that stops before any run leaves none behind, and one
    stopped half way says to go on with `--out` and the folder it got, since the same command would start
    another."""
    import signal
    import socket
    import time

    runs, data = tmp_path / "runs", write_gaia(tmp_path / "gaia")
    env = {**os.environ, "NANBEIGE_RUNS_DIR": str(runs), "NANBEIGE_PROGRESS_EVERY": "0.3"}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens once the socket is closed
    command = [NANBEIGE, "eval", "gaia", "--grader", "official", "--data", str(data), "-k", "1", "--no-default-servers"]
    down = subprocess.run(
        [*command, "--base-url", f"http://127.0.0.1:{port}/v1"], capture_output=True, text=True, timeout=120, env=env
    )
    assert down.returncode != 0 and "error" in down.stderr
    assert not runs.exists() or list(runs.iterdir()) == [], down.stderr
    with FakeOpenAI([], default=Reply(content="never", delay_s=60)) as server:
        eval_run = subprocess.Popen(
            [*command, "--base-url", server.base_url], stderr=subprocess.PIPE, text=True, env=env
        )
        deadline = time.monotonic() + 60
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        eval_run.send_signal(signal.SIGINT)
        _, stderr = eval_run.communicate(timeout=60)
    (folder,) = runs.iterdir()
    assert eval_run.returncode == 130
    assert f"run the same command with --out {folder} to go on" in " ".join(stderr.split()), stderr
