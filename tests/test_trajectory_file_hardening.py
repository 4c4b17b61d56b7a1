"""The trajectory file against what could break it: input the writer must keep (bytes that are not UTF-8,
text the encoder refuses, a file that is not a trajectory, a fifo, a full disk) and files the readers must
survive (torn lines, crafted records) without slowing good ones. The rest of what a hostile user or page
could feed the runtime is `tests/test_hardening.py`, whose command runner this file shares."""

from __future__ import annotations

import errno
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from test_hardening import assert_one_line_error, nanbeige

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

# 1. Input that could break writing


def test_a_question_that_is_not_utf8_runs_with_the_bytes_replaced(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        result = nanbeige(
            "ask",
            b"caf\xe9 \xff\xfe?",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--trajectory",
            str(path),
        )
    assert result.returncode == 0, result.stderr
    assert "the question is not valid UTF-8" in result.stderr
    assert load_trajectories(path)[0].question == "caf\ufffd \ufffd\ufffd?"


def test_text_the_encoder_refuses_is_written_replaced_rather_than_lost(tmp_path: Path) -> None:
    trajectory = Trajectory(question="q", id="t0")
    # a server's JSON may hold a lone surrogate ("\ud800"), and numbers of any size
    trajectory.turns.append(Turn(index=0, assistant={"content": "half \ud800 a pair"}, usage={"big": 2**70}))
    writer = TrajectoryWriter(tmp_path / "t.jsonl")
    writer.start(trajectory)
    writer.turn(trajectory, trajectory.turns[0])
    writer.close()
    [loaded] = load_trajectories(tmp_path / "t.jsonl")
    assert loaded.turns[0].assistant["content"] == "half \ufffd a pair"
    assert loaded.turns[0].usage == {"big": str(2**70)}


def test_a_file_that_is_not_a_trajectory_is_refused_and_left_alone(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        refused = nanbeige(
            "ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(notes)
        )
        into_empty = nanbeige(
            "ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(empty)
        )
        appended = nanbeige(
            "ask", "q2", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(empty)
        )
    assert_one_line_error(refused, "notes.txt exists and is not a trajectory file", "--trajectory")
    assert notes.read_text() == "my notes\n"
    assert into_empty.returncode == 0 and appended.returncode == 0, appended.stderr
    assert [t.question for t in load_trajectories(empty)] == ["q", "q2"]


def test_a_fifo_or_a_device_is_refused_at_once_and_dev_null_discards(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        common = ("--base-url", server.base_url, "--no-default-servers", "--trajectory")
        # it used to wait for a reader forever; none ever comes, so an answer at all means it did not wait
        # (and a wait would end in the timeout's TimeoutExpired, a failure)
        to_fifo = nanbeige("ask", "q", *common, str(fifo), timeout=60)
        to_full = nanbeige("ask", "q", *common, "/dev/full")
        to_null = nanbeige("ask", "q", *common, os.devnull)
    assert_one_line_error(to_fifo, "is not a regular file")
    assert_one_line_error(to_full, "/dev/full is not a regular file")
    assert to_null.returncode == 0 and to_null.stdout == "ok\n", to_null.stderr


def _file_size_limit(limit: int) -> Any:
    """Writes past `limit` bytes fail (EFBIG), as on a full disk; Python ignores the signal."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("limit", [100, 2500])  # the start record fails; a later record fails
def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_whole_lines(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "t.jsonl"
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        result = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--trajectory",
            str(path),
            preexec_fn=_file_size_limit(limit),
        )
    assert_one_line_error(result, "the run stopped: cannot write the trajectory", "File too large")
    assert "write_error after" in result.stderr
    data = path.read_bytes()
    assert len(data) <= limit and (data == b"" or data.endswith(b"\n"))
    assert [json.loads(line)["type"] for line in data.splitlines()] == ([] if limit == 100 else ["start", "turn"])


class FailingFile:
    """A trajectory file whose disk fills after `whole` writes: the next write stores half, then fails."""

    def __init__(self, real: Any, whole: int):
        self.real, self.left = real, whole

    def write(self, data: memoryview) -> int:
        if self.left == 0:
            self.real.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= 1
        return self.real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.anyio
async def test_a_failed_write_ends_the_run_with_a_stop_reason_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    writer._file = FailingFile(writer._file, whole=2)  # type: ignore[assignment]  # start and turn 1 fit
    llm = ScriptedLLM([mcp_call("calc", "add", {"a": 1})], default=mcp_answer("5"))
    trajectory = await run("q", llm, None, AgentConfig(date="2026-11-21"), writer)
    writer.close()
    assert trajectory.stop_reason == "write_error"
    assert trajectory.error == f"cannot write the trajectory to {path}: No space left on device"
    assert [
        json.loads(line)["type"] for line in path.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")
    ] == ["start", "turn"]
    assert path.read_bytes().endswith(b"\n")  # the half-written line was cut off
    assert len(llm.calls) == 2  # nothing more was asked of the model once the log could not keep up


# 2. Reading files that were torn or crafted


def test_show_skips_a_torn_line_followed_by_more_records(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        nanbeige("ask", "first", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path))
        path.write_bytes(path.read_bytes()[:200] + b"\n")  # a crash in the start record, then another run
        nanbeige("ask", "second", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path))
    result = nanbeige("show", str(path))
    assert result.returncode == 0, result.stderr
    assert f"warning: {path}:1: skipped a line that is not a JSON object" in result.stderr
    assert "question: second" in result.stdout and "answer: ok" in result.stdout


CRAFTED = [
    ({"type": "start", "question": "no id"}, "no 'id'"),
    ({"type": "start", "id": "x", "question": 5}, "'question' is int"),
    ([1, 2], "not a JSON object"),
    ({"type": "turn", "trajectory_id": "a", "index": 0, "assistant": {}, "tool_calls": "abc"}, "'tool_calls' is str"),
    ({"type": "turn", "trajectory_id": "a", "index": 0, "assistant": "text"}, "'assistant' is str"),
    ({"type": "turn", "trajectory_id": "a", "index": "0", "assistant": {}}, "'index' is str"),
    ({"type": "turn", "trajectory_id": ["a"], "index": 0, "assistant": {}}, "'trajectory_id'"),
    ({"type": "turn", "trajectory_id": "a", "index": 0, "assistant": {"content": 5}}, "content is not text"),
    (
        {
            "type": "turn",
            "trajectory_id": "a",
            "index": 0,
            "assistant": {},
            "tool_calls": [{"server": "s", "name": 5, "arguments": {}}],
            "tool_results": [{"text": "r"}],
        },
        "'name' is int",
    ),
    ({"type": "turn", "trajectory_id": "a", "index": 0, "assistant": {}, "tool_results": ["r"]}, "not an object"),
    ({"type": "end", "trajectory_id": "a", "answer": 42}, "'answer' is int"),
]


def test_crafted_records_are_skipped_with_a_warning_naming_their_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good_start = {"type": "start", "id": "a", "question": "q"}
    good_end = {"type": "end", "trajectory_id": "a", "answer": "fine", "stop_reason": "answered"}
    lines = [good_start, *(record for record, _ in CRAFTED), good_end]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    warnings: list[str] = []
    [trajectory] = load_trajectories(path, warn=warnings.append)
    assert (trajectory.turns, trajectory.answer) == ([], "fine")
    assert len(warnings) == len(CRAFTED)
    for number, (warning, (_, why)) in enumerate(zip(warnings, CRAFTED), start=2):
        assert warning.startswith(f"{path}:{number}: skipped") and why in warning, warning
    result = nanbeige("show", str(path))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert result.stderr.count("warning:") == len(CRAFTED) and "answer: fine" in result.stdout


def test_a_file_of_nothing_but_crafted_records_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"type": "start", "question": "no id"}) + "\n")
    result = nanbeige("show", str(path))
    assert_one_line_error(result, "holds no trajectory")
    assert f"{path}:1: skipped the start record" in result.stderr


def test_good_records_load_as_fast_as_before(tmp_path: Path) -> None:
    """Checking each record must cost little beside parsing it: a file of long token lists."""
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    for n in range(200):
        trajectory = Trajectory(question="q", id=f"t{n}")
        writer.start(trajectory)
        for index in range(10):
            turn = Turn(
                index=index,
                assistant={"content": "x" * 2000},
                prompt_delta_ids=list(range(2000)),
                completion_ids=list(range(500)),
                logprobs=[-0.5] * 500,
                tool_calls=[ToolCall("s", "t", {"q": "a"})],
                tool_results=[ToolResult("r" * 2000)],
            )
            writer.turn(trajectory, turn)
        writer.end(trajectory)
    writer.close()
    import orjson

    # CPU time of this process, not the clock: a busy machine must not slow one side of the comparison only
    started = time.process_time()
    for line in path.read_bytes().splitlines():
        orjson.loads(line)
    parse_only = time.process_time() - started
    started = time.process_time()
    loaded = load_trajectories(path)
    assert len(loaded) == 200 and len(loaded[0].turns) == 10
    assert time.process_time() - started < 3 * parse_only + 0.5
