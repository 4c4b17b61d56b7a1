"""What a user or a hostile web page could feed the runtime, and what must never come out: keys and
URL credentials in no output, no raw terminal control characters, input that cannot break the
trajectory file, files that cannot break the readers, and questions of any length."""

from __future__ import annotations

import errno
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer, mcp_call

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.cli.console import hide, out, out_json, shown
from nanbeige.agent.loop import AgentConfig, run
from nanbeige.agent.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory_file import TrajectoryWriter, load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)
KEY = "k3yQx9PzR2mW8vT4nL6sY1aB"  # as a search API key would look
PASSWORD = "hunter2-hunter2"
# A clear screen, a window title, an 8-bit CSI (C1), DEL, a carriage return and a bell
EVIL = "A\x1b[2J\x1b]0;pwned\x07B\x9b31mC\x7fD\rE"
RAW_CONTROLS = ("\x1b", "\x9b", "\x7f", "\x07", "\r")


def nanbeige(*args: str | bytes, env: dict[str, str] | None = None, input: bytes | None = None,
             timeout: float = 60, **popen: Any) -> subprocess.CompletedProcess:
    result = subprocess.run([NANBEIGE, *args], capture_output=True, timeout=timeout, input=input,
                            env={**os.environ, "COLUMNS": "200", **(env or {})}, **popen)
    result.stdout, result.stderr = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    return result


def children_cpu_s() -> float:
    """CPU seconds used so far by the commands this process ran and waited for. What a command costs
    in CPU time tells a quadratic step from a linear one whatever else the machine is doing; the
    seconds it takes do not."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    for word in words:
        assert word in error


# 1. Secrets


def test_a_key_the_model_and_a_tool_repeat_is_in_no_output(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    replies = [mcp_call("testkit", "echo", {"text": "y" * 50 + KEY}),  # the live view cuts this call short
               mcp_call("testkit", "shout", {"text": f"401 Unauthorized: invalid key {KEY}"}),  # a server's log line
               mcp_answer(f"the key is {KEY}")]
    with FakeOpenAI(replies, default=mcp_answer(f"the key is {KEY}")) as server:
        # a narrow terminal: a line folded inside the key would no longer match it
        result = nanbeige("ask", "q", "--base-url", server.base_url, "--mcp", TESTKIT, "--trajectory", str(path),
                          "--json", env={"SERPER_API_KEY": KEY, "COLUMNS": "20"})
    assert result.returncode == 0, result.stderr
    log = Path(f"{path}.servers.log").read_text()
    for output in (result.stdout, result.stderr, path.read_text(), log):
        assert KEY[:6] not in output  # not even the part before a cut
    assert json.loads(result.stdout)["answer"] == "the key is [REDACTED]"
    assert "echo(text=yyyy" in result.stderr and "[REDACTED]" in result.stderr
    assert "invalid key [REDACTED]" in log


def test_a_tool_server_that_fails_to_start_leaves_its_output_redacted_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    says = f"import sys; print('rejected key {KEY}', file=sys.stderr); sys.exit(3)"
    broken = shlex.join([sys.executable, "-c", says])
    with FakeOpenAI([mcp_answer("x")], default=mcp_answer("x")) as server:
        result = nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--mcp",
                          f"broken={broken}", "--trajectory", str(path), env={"SERPER_API_KEY": KEY})
    assert_one_line_error(result, "MCP server 'broken'", f"its output is in {path}.servers.log")
    assert Path(f"{path}.servers.log").read_text() == "rejected key [REDACTED]\n"
    assert KEY[:6] not in result.stderr and not path.exists()


def test_credentials_in_the_base_url_reach_only_the_model_server(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    replies = [mcp_call("testkit", "env_value", {"name": "NANBEIGE_BASE_URL"}), mcp_answer("done")]
    with FakeOpenAI(replies, default=mcp_answer("done")) as server:
        url = server.base_url.replace("http://", f"http://alice:{PASSWORD}@")
        result = nanbeige("ask", "q", "--mcp", TESTKIT, "--trajectory", str(path), "--json",
                          env={"NANBEIGE_BASE_URL": url})
    assert result.returncode == 0, result.stderr
    assert server.requests[0]["_headers"]["Authorization"].startswith("Basic ")  # still used where they belong
    [trajectory] = load_trajectories(path)
    assert trajectory.turns[0].tool_results[0].text == server.base_url  # what the user's server was given
    for output in (result.stdout, result.stderr, path.read_text()):
        assert PASSWORD not in output


def test_an_unreachable_server_named_with_credentials_is_reported_without_them(tmp_path: Path) -> None:
    result = nanbeige("ask", "q", "--base-url", f"http://alice:{PASSWORD}@127.0.0.1:9/v1", "--trajectory",
                      str(tmp_path / "t.jsonl"))
    assert_one_line_error(result, "cannot reach the model server at http://[REDACTED]@127.0.0.1:9/v1")
    assert PASSWORD not in result.stderr


def test_json_output_hides_a_key_however_json_spells_it(capsys: pytest.CaptureFixture[str]) -> None:
    hide(['quote"and\\backslash-key'])
    try:
        out_json({"answer": 'it is quote"and\\backslash-key'})
        out('plain: quote"and\\backslash-key')
    finally:
        hide([])
    printed = capsys.readouterr().out.splitlines()
    assert json.loads(printed[0]) == {"answer": "it is [REDACTED]"}
    assert printed[1] == "plain: [REDACTED]"


# 2. Terminal control characters


@pytest.mark.slow
def test_control_characters_are_shown_escaped_and_kept_exactly_in_the_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "t\x1b[2J.jsonl"  # printed too, as the path of the trajectory
    replies = [mcp_call("testkit", "echo", {"text": EVIL}), mcp_answer(EVIL)]
    with FakeOpenAI(replies, default=mcp_answer(EVIL)) as server:
        asked = nanbeige("ask", "Q" + EVIL, "--base-url", server.base_url, "--mcp", TESTKIT, "--trajectory", str(path))
        as_json = nanbeige("ask", "Q" + EVIL, "--base-url", server.base_url, "--mcp", TESTKIT, "--trajectory",
                           str(tmp_path / "j.jsonl"), "--json")
    shown_later = nanbeige("show", str(path))
    for result in (asked, as_json, shown_later):
        assert result.returncode == 0, result.stderr
        for control in RAW_CONTROLS:
            assert control not in result.stdout and control not in result.stderr
    assert asked.stdout == "A\\x1b[2J\\x1b]0;pwned\\x07B\\x9b31mC\\x7fD\\x0dE\n"
    assert "echo(text=A\\x1b[2J" in asked.stderr  # the live view
    assert "t\\x1b[2J.jsonl" in asked.stderr
    assert "question: QA\\x1b[2J\\x1b]0;pwned\\x07B\\x9b31mC" in shown_later.stdout
    assert json.loads(as_json.stdout)["answer"] == EVIL  # valid JSON that reads back exactly
    [trajectory] = load_trajectories(path)
    assert (trajectory.question, trajectory.answer) == ("Q" + EVIL, EVIL)
    assert trajectory.turns[0].tool_results[0].text == EVIL


def test_errors_and_notices_escape_control_characters(tmp_path: Path) -> None:
    result = nanbeige("ask", "--question-file", str(tmp_path / "no\x1b]0;title\x07such"))
    assert_one_line_error(result, "cannot read --question-file", "no\\x1b]0;title\\x07such")
    assert "\x1b" not in result.stderr
    assert shown("tab\tand\nnewline stay, \x00 and \x85 do not") == "tab\tand\nnewline stay, \\x00 and \\x85 do not"


# 3. Input that could break writing


def test_a_question_that_is_not_utf8_runs_with_the_bytes_replaced(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        result = nanbeige("ask", b"caf\xe9 \xff\xfe?", "--base-url", server.base_url, "--no-default-servers",
                          "--trajectory", str(path))
    assert result.returncode == 0, result.stderr
    assert "the question is not valid UTF-8" in result.stderr
    assert load_trajectories(path)[0].question == "caf\ufffd \ufffd\ufffd?"


def test_text_the_encoder_refuses_is_written_replaced_rather_than_lost(tmp_path: Path) -> None:
    trajectory = Trajectory(question="q", id="t0")
    # a server's JSON may hold a lone surrogate ("\ud800"), and numbers of any size
    trajectory.turns.append(Turn(index=0, assistant={"content": "half \ud800 a pair"}, usage={"big": 2 ** 70}))
    writer = TrajectoryWriter(tmp_path / "t.jsonl")
    writer.start(trajectory)
    writer.turn(trajectory, trajectory.turns[0])
    writer.close()
    [loaded] = load_trajectories(tmp_path / "t.jsonl")
    assert loaded.turns[0].assistant["content"] == "half \ufffd a pair"
    assert loaded.turns[0].usage == {"big": str(2 ** 70)}


def test_a_file_that_is_not_a_trajectory_is_refused_and_left_alone(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        refused = nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory",
                           str(notes))
        into_empty = nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory",
                              str(empty))
        appended = nanbeige("ask", "q2", "--base-url", server.base_url, "--no-default-servers", "--trajectory",
                            str(empty))
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
        result = nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path),
                          preexec_fn=_file_size_limit(limit))
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
    assert [json.loads(line)["type"] for line in path.read_bytes().splitlines(keepends=True)
            if line.endswith(b"\n")] == ["start", "turn"]
    assert path.read_bytes().endswith(b"\n")  # the half-written line was cut off
    assert len(llm.calls) == 2  # nothing more was asked of the model once the log could not keep up


# 4. Reading files that were torn or crafted


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
    ({"type": "turn", "trajectory_id": "a", "index": 0, "assistant": {}, "tool_calls": [
        {"server": "s", "name": 5, "arguments": {}}], "tool_results": [{"text": "r"}]}, "'name' is int"),
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
            turn = Turn(index=index, assistant={"content": "x" * 2000}, prompt_delta_ids=list(range(2000)),
                        completion_ids=list(range(500)), logprobs=[-0.5] * 500,
                        tool_calls=[ToolCall("s", "t", {"q": "a"})], tool_results=[ToolResult("r" * 2000)])
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


# 5. Long questions


@pytest.mark.slow
@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_10_mb_question_runs_end_to_end_and_is_kept_intact(tmp_path: Path, source: str) -> None:
    words = ["alpha", "ünïcode", "数据", 'quote"', "back\\slash", "tab\there"]
    question = " ".join(words[i % len(words)] for i in range(1_400_000))[:10_000_000].strip()
    (tmp_path / "q.txt").write_text(question)
    path = tmp_path / "t.jsonl"
    asked = ("--question-file", str(tmp_path / "q.txt")) if source == "file" else ("-",)
    with FakeOpenAI([mcp_answer("long")], default=mcp_answer("long")) as server:
        cpu_before = children_cpu_s()
        result = nanbeige("ask", *asked, "--base-url", server.base_url, "--no-default-servers", "--trajectory",
                          str(path), "--max-context", "50000000",
                          input=question.encode() if source == "stdin" else None)
        cpu_used = children_cpu_s() - cpu_before
    assert result.returncode == 0, result.stderr
    assert result.stdout == "long\n"
    assert cpu_used < 30  # a few seconds of CPU: nothing on the way is quadratic
    assert question in server.requests[0]["messages"][-1]["content"]
    assert load_trajectories(path)[0].question == question
    if source == "file":
        cpu_before = children_cpu_s()
        shown_in_full = nanbeige("show", "--full", str(path))
        assert shown_in_full.returncode == 0 and len(shown_in_full.stdout) > len(question)
        assert question.rsplit("\t", 1)[-1] in shown_in_full.stdout  # (rich turns tabs into spaces)
        assert children_cpu_s() - cpu_before < 30  # rich folding megabytes itself took a minute of CPU


def test_the_question_comes_from_one_place_only(tmp_path: Path) -> None:
    (tmp_path / "q.txt").write_text("from the file")
    assert_one_line_error(nanbeige("ask", "q", "--question-file", str(tmp_path / "q.txt")), "one of them")
    assert_one_line_error(nanbeige("ask"), "one of them")
    assert_one_line_error(nanbeige("ask", "-", input=b"  \n"), "the question is empty")


def test_a_key_that_cannot_go_in_a_header_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run([NANBEIGE, "ask", "q", "--base-url", "http://127.0.0.1:9/v1", "--no-default-servers",
                             "--trajectory", str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "NANBEIGE_API_KEY": "pässwörd-123456"})
    assert result.returncode == 2 and "not ASCII" in result.stderr and "crashed" not in result.stderr
    assert "pässwörd" not in result.stderr and not (tmp_path / "t.jsonl").exists()
