"""What a user or a hostile web page could feed the runtime, and what must never come out: keys and
URL credentials in no output, no raw terminal control characters, and questions of any length. Input
that could break the trajectory file and files that could break the readers are
`tests/test_trajectory_file_hardening.py`."""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer, mcp_call

from nanbeige.agent.cli.console import hide, out, out_json, shown
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)
KEY = "k3yQx9PzR2mW8vT4nL6sY1aB"  # as a search API key would look
PASSWORD = "hunter2-hunter2"
# A clear screen, a window title, an 8-bit CSI (C1), DEL, a carriage return and a bell
EVIL = "A\x1b[2J\x1b]0;pwned\x07B\x9b31mC\x7fD\rE"
RAW_CONTROLS = ("\x1b", "\x9b", "\x7f", "\x07", "\r")


def nanbeige(
    *args: str | bytes, env: dict[str, str] | None = None, input: bytes | None = None, timeout: float = 60, **popen: Any
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [NANBEIGE, *args],
        capture_output=True,
        timeout=timeout,
        input=input,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        **popen,
    )
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
    replies = [
        mcp_call("testkit", "echo", {"text": "y" * 50 + KEY}),  # the live view cuts this call short
        mcp_call("testkit", "shout", {"text": f"401 Unauthorized: invalid key {KEY}"}),  # a server's log line
        mcp_answer(f"the key is {KEY}"),
    ]
    with FakeOpenAI(replies, default=mcp_answer(f"the key is {KEY}")) as server:
        # a narrow terminal: a line folded inside the key would no longer match it
        result = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--mcp",
            TESTKIT,
            "--trajectory",
            str(path),
            "--json",
            env={"SERPER_API_KEY": KEY, "COLUMNS": "20"},
        )
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
        result = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--mcp",
            f"broken={broken}",
            "--trajectory",
            str(path),
            env={"SERPER_API_KEY": KEY},
        )
    assert_one_line_error(result, "MCP server 'broken'", f"its output is in {path}.servers.log")
    assert Path(f"{path}.servers.log").read_text() == "rejected key [REDACTED]\n"
    assert KEY[:6] not in result.stderr and not path.exists()


def test_credentials_in_the_base_url_reach_only_the_model_server(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    replies = [mcp_call("testkit", "env_value", {"name": "NANBEIGE_BASE_URL"}), mcp_answer("done")]
    with FakeOpenAI(replies, default=mcp_answer("done")) as server:
        url = server.base_url.replace("http://", f"http://alice:{PASSWORD}@")
        result = nanbeige(
            "ask", "q", "--mcp", TESTKIT, "--trajectory", str(path), "--json", env={"NANBEIGE_BASE_URL": url}
        )
    assert result.returncode == 0, result.stderr
    assert server.requests[0]["_headers"]["Authorization"].startswith("Basic ")  # still used where they belong
    [trajectory] = load_trajectories(path)
    assert trajectory.turns[0].tool_results[0].text == server.base_url  # what the user's server was given
    for output in (result.stdout, result.stderr, path.read_text()):
        assert PASSWORD not in output


def test_an_unreachable_server_named_with_credentials_is_reported_without_them(tmp_path: Path) -> None:
    result = nanbeige(
        "ask", "q", "--base-url", f"http://alice:{PASSWORD}@127.0.0.1:9/v1", "--trajectory", str(tmp_path / "t.jsonl")
    )
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
        # testkit's echo alone: the built-in servers would add nothing the test looks at
        command = ["ask", "Q" + EVIL, "--base-url", server.base_url, "--mcp", TESTKIT, "--no-default-servers"]
        asked = nanbeige(*command, "--trajectory", str(path))
        as_json = nanbeige(*command, "--trajectory", str(tmp_path / "j.jsonl"), "--json")
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


# 3. Long questions


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
        result = nanbeige(
            "ask",
            *asked,
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--trajectory",
            str(path),
            "--max-context",
            "50000000",
            input=question.encode() if source == "stdin" else None,
        )
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
    result = subprocess.run(
        [
            NANBEIGE,
            "ask",
            "q",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--no-default-servers",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NANBEIGE_API_KEY": "pässwörd-123456"},
    )
    assert result.returncode == 2 and "not ASCII" in result.stderr and "crashed" not in result.stderr
    assert "pässwörd" not in result.stderr and not (tmp_path / "t.jsonl").exists()
