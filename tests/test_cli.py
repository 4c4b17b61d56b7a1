"""`nanbeige ask` and `nanbeige show` as a user runs them: real processes, loopback servers."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TEST_SERVER, free_port, wait_for_http
from fake_openai import FakeOpenAI, Reply, created_sandbox, mcp_answer, mcp_call

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)


def nanbeige(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "Error:", "│"))]
    assert len(errors) >= 1
    message = " ".join(line.strip("│ ") for line in errors)
    for word in words:
        assert word in message


def test_ask_prints_only_the_answer_on_stdout_and_saves_the_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    replies = [mcp_call("testkit", "add", {"a": 2, "b": 3}), mcp_answer("5")]
    with FakeOpenAI(replies, default=mcp_answer("5")) as server:  # the summary turn: the answer again
        result = nanbeige(
            "ask",
            "What is 2+3?",
            "--base-url",
            server.base_url,
            "--mcp",
            TESTKIT,
            "--trajectory",
            str(path),
            "--api-key",
            "sk-secret-value",
            "--tool-timeout",
            "30",
            "--max-result-chars",
            "5000",
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "5\n"
    assert "add(a=2, b=3)" in result.stderr and str(path) in result.stderr and "answered after 3 turns" in result.stderr
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "turn", "turn", "turn", "end"]  # the last: the summary turn
    # the toolbox settings that shaped what the model read are recorded with the run
    assert (records[0]["limits"]["tool_timeout_s"], records[0]["limits"]["max_result_chars"]) == (30.0, 5000)
    assert "sk-secret-value" not in path.read_text()
    assert server.requests[0]["_headers"]["Authorization"] == "Bearer sk-secret-value"


def test_json_prints_the_end_record(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_answer("Paris")], default=mcp_answer("Paris")) as server:
        result = nanbeige(
            "ask",
            "Capital of France?",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
            "--json",
        )
    end = json.loads(result.stdout)
    # two turns: the answer, then the summary turn
    assert (end["type"], end["answer"], end["stop_reason"], end["num_turns"]) == ("end", "Paris", "answered", 2)
    assert "no tools available" in result.stderr


def test_settings_come_from_the_environment_and_runs_go_to_the_runs_folder(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_answer("ok")], default=mcp_answer("ok")) as server:
        result = nanbeige(
            "ask",
            "q",
            env={
                "NANBEIGE_BASE_URL": server.base_url,
                "NANBEIGE_MODEL": "env-model",
                "NANBEIGE_RUNS_DIR": str(tmp_path / "runs"),
            },
        )
    assert result.returncode == 0, result.stderr
    assert server.requests[0]["model"] == "env-model"
    [saved] = list((tmp_path / "runs").glob("*.jsonl"))
    assert str(saved) in result.stderr


def test_an_unreachable_model_server_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = nanbeige(
            "ask", "q", "--base-url", f"http://127.0.0.1:{port}/v1", "--trajectory", str(tmp_path / "t.jsonl")
        )
    assert_one_line_error(result, "cannot reach the model server", "--base-url")
    assert result.returncode == 1


@pytest.mark.slow
def test_bad_flags_and_specs_are_clear_errors(tmp_path: Path) -> None:
    assert_one_line_error(nanbeige("ask", "q", "--max-turns", "zero"), "--max-turns")
    assert_one_line_error(nanbeige("ask", "q", "--dialect", "yaml"), "--dialect must be one of mcp-xml, tool-call")
    assert_one_line_error(nanbeige("ask", "q", "--mcp", "no-equals"), "NAME=COMMAND")
    assert_one_line_error(
        nanbeige("ask", "q", "--mcp", "a=x", "--mcp", "a=y", "--no-default-servers"), "two MCP servers share a name: a"
    )
    assert_one_line_error(nanbeige("ask", "q", "--base-url", "http://[::1"), "--base-url", "not a valid URL")
    assert_one_line_error(nanbeige("ask", "q", "--base-url", "ftp://host/v1"), "must be an http(s) URL")
    assert_one_line_error(nanbeige("ask", "q", "--timeout", "-5"), "--timeout")  # it used to stop the run at once


def test_a_tool_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_answer("x")], default=mcp_answer("x")) as server:
        result = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--mcp",
            "broken=/no/such/program",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
        )
    assert_one_line_error(result, "MCP server 'broken'", "failed to start")


def test_an_unwritable_trajectory_path_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with FakeOpenAI([mcp_answer("x")], default=mcp_answer("x")) as server:
        result = nanbeige("ask", "q", "--base-url", server.base_url, "--trajectory", str(tmp_path / "file" / "t.jsonl"))
    assert_one_line_error(result, "cannot write the trajectory", "--trajectory")


def ask_with_testkit_only(server: FakeOpenAI, question: str, path: Path) -> subprocess.CompletedProcess:
    """`nanbeige ask QUESTION` against the loopback model server with testkit's tools and no built-in servers."""
    tools = ["--mcp", TESTKIT, "--no-default-servers"]
    return nanbeige("ask", question, "--base-url", server.base_url, *tools, "--trajectory", str(path))


def test_no_answer_exits_non_zero_with_the_stop_reason(tmp_path: Path) -> None:
    with FakeOpenAI(
        [mcp_call("testkit", "echo", {"text": "a"})],
        default=Reply(status=400, body={"error": {"message": "bad request"}}),
    ) as server:
        result = ask_with_testkit_only(server, "q", tmp_path / "t.jsonl")
    assert result.stdout == ""
    assert_one_line_error(result, "no answer (stop reason model_error)", "bad request")


def test_ctrl_c_closes_the_trajectory_and_exits_130(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    replies = [mcp_call("testkit", "echo", {"text": "a"}), Reply(content="never", delay_s=30)]
    with FakeOpenAI(replies) as server:
        process = subprocess.Popen(
            [NANBEIGE, "ask", "q", "--base-url", server.base_url, "--mcp", TESTKIT, "--trajectory", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the tool servers get it too
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    end = json.loads(path.read_text().splitlines()[-1])
    assert (end["type"], end["stop_reason"], end["num_turns"]) == ("end", "interrupted", 1)


def test_show_renders_a_saved_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with FakeOpenAI(
        [mcp_call("testkit", "add", {"a": 20, "b": 22}, thought="Add them.")], default=mcp_answer("42")
    ) as server:
        ask_with_testkit_only(server, "Sum?", path)
    result = nanbeige("show", str(path))
    assert result.returncode == 0, result.stderr
    for text in (
        "question: Sum?",
        "Add them.",
        "testkit/add",
        '{"a": 20, "b": 22}',
        "stop reason: answered",
        "answer: 42",
    ):
        assert text in result.stdout


def test_show_rejects_what_is_not_a_trajectory(tmp_path: Path) -> None:
    assert_one_line_error(nanbeige("show", str(tmp_path / "missing.jsonl")), "cannot read")
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    assert_one_line_error(nanbeige("show", str(tmp_path / "notes.txt")), "not a JSON line")


def test_index_build_then_search_from_the_command_line(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "volcano.md").write_text("# Mount Etna\n\nEtna is an active stratovolcano on the east coast of Sicily.")
    (docs / "river.txt").write_text("The Danube flows through ten countries before reaching the Black Sea.")
    built = nanbeige("index", "build", str(docs), "--out", str(tmp_path / "index"))
    assert built.returncode == 0, built.stderr
    assert "indexed 2 documents" in built.stderr
    found = nanbeige("index", "search", str(tmp_path / "index"), "volcano in Sicily", "-k", "1")
    assert found.returncode == 0 and "Mount Etna" in found.stdout and "Danube" not in found.stdout
    assert_one_line_error(nanbeige("index", "build", str(tmp_path / "nope")), "no such file or folder")
    assert_one_line_error(nanbeige("index", "search", str(tmp_path / "docs"), "x"), "index")


def test_index_build_reports_the_size_of_a_small_index_in_a_unit_that_fits(tmp_path: Path) -> None:
    import re

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "river.txt").write_text("The Danube flows through ten countries before reaching the Black Sea.")
    index = tmp_path / "index"
    built = nanbeige("index", "build", str(docs), "--out", str(index))
    assert built.returncode == 0, built.stderr
    size = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
    assert size < 1e6  # a few KB: "0.0 MB" said nothing
    shown = re.search(r"; ([\d.]+) (B|KB|MB) in ", built.stderr)
    assert shown, built.stderr
    number, unit = float(shown.group(1)), shown.group(2)
    assert unit == ("KB" if size >= 1000 else "B") and number >= 1
    assert abs(number * {"B": 1, "KB": 1e3, "MB": 1e6}[unit] - size) <= 0.05 * size


def test_a_built_in_server_runs_for_any_mcp_client(tmp_path: Path) -> None:
    import anyio
    import mcp

    async def list_tools() -> list[str]:
        params = mcp.StdioServerParameters(command=NANBEIGE, args=["server", "scrape"])
        async with mcp.Client(params) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert anyio.run(list_tools) == ["scrape_and_extract_info"]
    assert_one_line_error(nanbeige("server", "email"), "unknown server 'email'")


def test_a_built_in_server_over_streamable_http(tmp_path: Path) -> None:
    import anyio
    import mcp

    port = free_port()
    process = subprocess.Popen(
        [NANBEIGE, "server", "python", "--transport", "http", "--port", str(port)],
        stderr=open(tmp_path / "server.err", "w"),
        env={**os.environ, "NANBEIGE_SANDBOX_DIR": str(tmp_path / "boxes")},
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/mcp")

        async def run_code() -> str:
            async with mcp.Client(f"http://127.0.0.1:{port}/mcp") as client:
                made = await client.call_tool("create_sandbox", {})
                sandbox_id = created_sandbox([{"content": made.content[0].text}])
                result = await client.call_tool("run_python_code", {"code_block": "6 * 7", "sandbox_id": sandbox_id})
                return result.content[0].text

        assert "42" in anyio.run(run_code)
    finally:
        process.terminate()
        process.wait(10)


def test_serve_without_vllm_names_the_alternatives(tmp_path: Path) -> None:
    result = nanbeige("serve", env={"PATH": str(tmp_path)})  # no `vllm` anywhere on PATH
    assert_one_line_error(result, "vLLM is not installed", "nanbeige[serve]", "in-process model")


def test_something_that_is_not_a_model_server_is_not_taken_for_one(tmp_path: Path) -> None:
    from fake_site import Site

    with Site() as site:  # answers HTTP, but 404 for /v1/models
        result = nanbeige("ask", "q", "--base-url", site.url("/v1"), "--trajectory", str(tmp_path / "t.jsonl"))
    assert_one_line_error(result, "not an OpenAI-compatible server")
    assert_one_line_error(nanbeige("ask", "q", "--token-mode", "--backend", "transformers"), "--token-mode")


def test_help_shows_the_defaults_that_depend_on_the_dialect() -> None:
    result = nanbeige("ask", "--help-all", env={"COLUMNS": "250"})
    text = " ".join(result.stdout.split())
    for shown in (
        "[default: 1.0 for mcp-xml, 0.6 for tool-call]",
        "[default: 600 for mcp-xml, 200 for tool-call]",
        "[default: the server's max_model_len, else 262144]",
    ):
        assert shown in text, shown


def test_the_commands_that_run_the_agent_take_the_run_flags_from_one_definition() -> None:
    """ask, research, eval and collect each get every flag of options.RUN_OPTIONS (but the few each leaves out
    or defines its own way), with the one definition's help and default: a flag changed there changes in all."""
    import typer

    from nanbeige.agent.cli import options
    from nanbeige.agent.cli.program import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    own_way = {
        "ask": set(),
        "research": {"max_turns", "timeout", "tokenizer"},
        "eval": {"tokenizer", "temperature"},
        "collect": {"verbose", "top_p", "repetition_penalty"},
    }
    for name, exceptions in own_way.items():
        params = {param.name: param for param in commands[name].params}
        for flag, (annotation, default) in options.RUN_OPTIONS.items():
            if flag in exceptions:
                continue
            shared = annotation.__metadata__[0]
            assert flag in params, (name, flag)
            assert (params[flag].help, params[flag].default) == (shared.help, default), (name, flag)
    assert "tokenizer" not in {param.name for param in commands["eval"].params}


def test_an_option_of_another_command_is_one_line_saying_where_it_is() -> None:
    # eval's benchmark is its argument; collect is the command that takes --bench
    result = nanbeige("eval", "--bench", "humaneval")
    assert result.returncode == 2
    assert_one_line_error(result, "No such option: --bench", "`nanbeige eval BENCH`", "collect has --bench")
    assert "--backend" not in result.stderr  # not the guess at a near spelling
    assert len([line for line in result.stderr.splitlines() if line.startswith("│")]) == 1
    result = nanbeige("doctor", "--dialect", "tool-call")
    assert_one_line_error(
        result, "No such option: --dialect", "ask, collect, eval, loop, research, serve have --dialect"
    )


def test_an_option_no_command_has_keeps_the_guess_at_a_near_spelling() -> None:
    result = nanbeige("ask", "--verbos", "q")
    assert result.returncode == 2
    # click words it "No such option: --verbos" or "No such option '--verbos'" by version
    assert_one_line_error(result, "No such option", "--verbos", "--verbose")
