"""What the commands say agrees with itself and with the trajectory: turns are counted one way
everywhere (as `max_turns` counts them), a rolled-back reply is named as such, and a run that ended
without an answer never says it answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fake_openai import FakeOpenAI, Reply, mcp_answer

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def ask(server: FakeOpenAI, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NANBEIGE, "ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_rolled_back_reply_is_named_and_not_counted_as_a_turn(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    cut_off = Reply(content="<think>\nLet me think about this at great length", finish_reason="length")
    with FakeOpenAI([cut_off, mcp_answer("42"), mcp_answer("42")]) as server:
        result = ask(server, path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    [dropped] = [line for line in lines if "rolled back" in line and line.startswith("turn ")]
    assert dropped.startswith("turn 1 ") and "reply rolled back, sampled again" in dropped
    assert any(line.startswith("turn 1 ") and line.endswith("answered") for line in lines)  # the same turn, again
    assert any(line.startswith("turn 2 ") and "final answer requested" in line for line in lines)
    turns = [record for record in map(json.loads, path.read_text().splitlines()) if record["type"] == "turn"]
    assert [t.get("rolled_back", False) for t in turns] == [True, False, False]
    assert "answered after 2 turns (1 reply rolled back) in " in result.stderr


def test_a_run_that_ends_without_a_usable_answer_never_says_it_answered(tmp_path: Path) -> None:
    unboxed = "<think>\nDone.\n</think>\n\nThe answer is forty-two."
    with FakeOpenAI([unboxed, unboxed]) as server:
        result = ask(server, tmp_path / "run.jsonl")
    assert result.returncode == 1
    assert "answered after" not in result.stderr and "stop reason answered" not in result.stderr
    assert "ended without a usable answer after 2 turns" in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "held no usable answer" in error


def tool_call_ask(server: FakeOpenAI, path: Path) -> subprocess.CompletedProcess[str]:
    from test_cli import TESTKIT

    return subprocess.run(
        [
            NANBEIGE,
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--dialect",
            "tool-call",
            "--mcp",
            TESTKIT,
            "--no-default-servers",
            "--trajectory",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_tools_a_server_template_leaves_out_are_told_once(tmp_path: Path) -> None:
    with FakeOpenAI(["Let me see.", "Four."]) as dropping:  # a template without a tools slot
        result = tool_call_ask(dropping, tmp_path / "run.jsonl")
    assert result.returncode == 0, result.stderr
    [warning] = [line for line in result.stderr.splitlines() if "left out" in line]
    assert warning.startswith("warning: the server's chat template left out the ") and "--dialect mcp-xml" in warning


def test_tools_a_server_template_shows_bring_no_warning(tmp_path: Path) -> None:
    with FakeOpenAI(["Four."], template_takes_tools=True) as showing:
        result = tool_call_ask(showing, tmp_path / "run.jsonl")
    assert result.returncode == 0, result.stderr
    assert "left out" not in result.stderr


def test_a_failed_http_mcp_server_is_not_sent_to_a_log_that_holds_only_other_servers_lines(tmp_path: Path) -> None:
    import shlex
    import socket

    from conftest import TEST_SERVER

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"  # nothing listens there once closed
    noisy = "noisy=" + shlex.join(["sh", "-c", f"echo starting up >&2; exec {shlex.join(TEST_SERVER)}"])
    with FakeOpenAI([]) as server:
        result = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "q",
                "--base-url",
                server.base_url,
                "--mcp",
                noisy,
                "--mcp",
                f"web={url}",
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "run.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "300"},
        )
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "'web'" in error and url in error
    assert "servers.log" not in error  # the log has the noisy server's line, and nothing of web's
