"""`nanbeige resume` as a command, on a real process: a run stopped by SIGKILL, Ctrl-C or SIGTERM is resumed
into the same file and asks the model what an uninterrupted run asked; what it refuses (a finished run, other
tools, a file still written, a fifo) and the server it names. The loop resumed in process is
`tests/test_resume.py`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from test_resume import comparable, cut

from nanbeige.agent.trajectory.trajectory import NOT_ENDED_ON_ITS_OWN
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + " ".join(TEST_SERVER)


def model(block_at: int | None = None) -> Any:
    """The loopback model: echo calls, then the answer (and again for the summary turn). With
    `block_at`, its first reply at that turn never comes in time: the run is stopped while it waits."""
    blocked: list[bool] = []

    def reply(request: dict[str, Any]) -> Reply | str:
        step = sum(m["role"] == "assistant" for m in request["messages"])
        if step == block_at and not blocked:
            blocked.append(True)
            return Reply(content="too late", delay_s=60)
        return (
            mcp_call("testkit", "echo", {"text": f"finding {step}"}, thought=f"Step {step}.")
            if step < 6
            else mcp_answer("42")
        )

    return reply


def nanbeige(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )


def bodies(server: FakeOpenAI) -> list[dict[str, Any]]:
    """What the model server received, without what the fake adds (`_headers`, `_received`)."""
    return [{k: v for k, v in request.items() if not k.startswith("_")} for request in server.requests]


ASK = ("--mcp", TESTKIT, "--no-default-servers", "--keep-tool-results", "2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A run that was not stopped: its file, and every request its model received."""
    path = tmp_path_factory.mktemp("whole") / "whole.jsonl"
    with FakeOpenAI(model()) as server:
        result = nanbeige("ask", "What is it?", "--base-url", server.base_url, "--trajectory", str(path), *ASK)
    assert result.returncode == 0 and result.stdout == "42\n", result.stderr
    return path, bodies(server)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_a_stopped_run_is_resumed_by_the_command_into_the_same_file(
    how: str, uninterrupted: Any, tmp_path: Path
) -> None:
    whole_path, whole_requests = uninterrupted
    path = tmp_path / "run.jsonl"
    with FakeOpenAI(model(block_at=4)) as server:
        process = subprocess.Popen(
            [NANBEIGE, "ask", "What is it?", "--base-url", server.base_url, "--trajectory", str(path), *ASK],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while len(server.requests) < 5 and time.monotonic() < deadline:  # waiting for its turn 4
            time.sleep(0.05)
        if how == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:  # SIGKILL: as a machine that stops; SIGINT: as a terminal's Ctrl-C, tool servers included
            os.killpg(process.pid, getattr(signal, how))
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == {"SIGKILL": -9, "SIGINT": 130, "SIGTERM": 143}[how], stderr
        [stopped] = load_trajectories(path)
        assert len(stopped.turns) == 4
        assert stopped.stop_reason == (None if how == "SIGKILL" else "interrupted")
        before = bodies(server)
        resumed = nanbeige("resume", str(path), "--base-url", server.base_url, "--mcp", TESTKIT, "--no-default-servers")
        assert resumed.returncode == 0 and resumed.stdout == "42\n", resumed.stderr
        after = bodies(server)[len(before) :]
    # the model was asked what an uninterrupted run asked it, the stopped request again first
    assert before[:-1] + after == whole_requests and before[-1] == after[0]
    [saved], [whole] = load_trajectories(path), load_trajectories(whole_path)
    assert [t.index for t in saved.turns] == list(range(len(whole.turns))) == list(range(8))
    assert [comparable(t) for t in saved.turns] == [comparable(t) for t in whole.turns]
    assert (saved.answer, saved.stop_reason) == ("42", "answered") and saved.stop_reason not in NOT_ENDED_ON_ITS_OWN
    shown = nanbeige("show", str(path))
    assert shown.stdout.count("trajectory ") == 1 and "stop reason: answered" in shown.stdout
    assert "turn 8" in shown.stdout and "answer: 42" in shown.stdout


def test_resume_names_the_runs_own_server_recorded_without_its_credentials(uninterrupted: Any, tmp_path: Path) -> None:
    """Without --base-url a resume used to fall back to loading the model in this process; then it went to the
    server the file recorded, with the user's key. Now it names that server for the user to give again."""
    path = tmp_path / "run.jsonl"
    with FakeOpenAI(model(block_at=4)) as server:
        with_credentials = server.base_url.replace("http://", "http://someone:hunter2secret@")
        process = subprocess.Popen(
            [NANBEIGE, "ask", "What is it?", "--base-url", with_credentials, "--trajectory", str(path), *ASK],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while len(server.requests) < 5 and time.monotonic() < deadline:  # waiting for its turn 4
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
        [stopped] = load_trajectories(path)
        assert stopped.limits["server"] == server.base_url and "hunter2secret" not in path.read_text()
        asked = len(server.requests)
        refused = nanbeige("resume", str(path), "--mcp", TESTKIT, "--no-default-servers")
        assert refused.returncode == 2 and f"was served by '{server.base_url}'" in refused.stderr
        assert "--base-url" in refused.stderr and len(server.requests) == asked
        resumed = nanbeige("resume", str(path), "--mcp", TESTKIT, "--no-default-servers", "--base-url", server.base_url)
        assert resumed.returncode == 0 and resumed.stdout == "42\n", resumed.stderr
    gone = nanbeige("resume", str(path), "--mcp", TESTKIT, "--no-default-servers")  # finished now: refused
    assert gone.returncode != 0 and "finished on its own" in gone.stderr


def test_a_finished_trajectory_is_not_resumed(uninterrupted: Any, tmp_path: Path) -> None:
    path = tmp_path / "done.jsonl"
    shutil.copy(uninterrupted[0], path)
    result = nanbeige("resume", str(path), "--no-default-servers")
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert "finished on its own (stop reason answered)" in result.stderr
    assert path.read_bytes() == uninterrupted[0].read_bytes()


def test_a_resume_without_the_run_s_tools_is_refused_and_writes_nothing(uninterrupted: Any, tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    cut(uninterrupted[0], path, 3)
    written = path.read_bytes()
    with FakeOpenAI(model()) as server:
        result = nanbeige("resume", str(path), "--base-url", server.base_url, "--no-default-servers")
        assert server.requests == []
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "the tools offered now are not the run's (missing testkit/echo" in result.stderr
    assert path.read_bytes() == written


def test_a_file_another_process_still_writes_is_not_resumed(uninterrupted: Any, tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    cut(uninterrupted[0], path, 3)
    written = path.read_bytes()
    live = TrajectoryWriter(path)  # as the run itself, still going, holds its file
    result = nanbeige("resume", str(path), "--no-default-servers")
    assert result.returncode == 1 and "another process is still writing" in result.stderr
    assert path.read_bytes() == written
    live.close()  # once it has ended (or was killed: the lock goes with the process) the file is free
    from nanbeige.agent.cli.resume import check_not_in_use

    check_not_in_use(path)


def test_a_fifo_is_refused_without_waiting_on_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = nanbeige("resume", str(fifo), "--no-default-servers")
    assert result.returncode == 1 and "not a regular file" in result.stderr and "Traceback" not in result.stderr
