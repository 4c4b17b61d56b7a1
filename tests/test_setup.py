"""The setup layer, as `ask` uses it: cheap checks before expensive work, one clear line for what the
user must fix, nothing left behind by a failed start, settings from `nanbeige.toml`, and SIGTERM
closing the trajectory like Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from test_cli import NANBEIGE, TESTKIT, assert_one_line_error, nanbeige
from tiny_model import make_tiny_model

from nanbeige.agent.backends.llm import ModelError
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def ask_server(server: FakeOpenAI, path: Path, *args: str) -> subprocess.CompletedProcess:
    """`nanbeige ask q` against the loopback model server, with no tool servers."""
    return nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path), *args)


def in_process(tiny: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return nanbeige(
        "ask", "q", "--backend", "transformers", "--model", str(tiny), "--no-default-servers", *args, env=env
    )


def test_a_bad_trajectory_path_is_reported_before_the_model_is_loaded(tiny: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = in_process(tiny, "--trajectory", str(tmp_path / "file" / "t.jsonl"))
    assert_one_line_error(result, "cannot write the trajectory", "--trajectory")
    assert "loading" not in result.stderr  # nothing expensive was started
    result = in_process(tiny, "--trajectory", str(tmp_path))
    assert_one_line_error(result, "it is a folder")


def test_a_trajectory_folder_that_cannot_be_made_is_reported_before_the_model_server_is_asked(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with FakeOpenAI([mcp_answer("4")]) as server:
        result = ask_server(server, tmp_path / "file" / "no" / "such" / "t.jsonl")
        assert server.gets == [] and server.requests == []  # not even probed
    assert_one_line_error(result, "cannot write the trajectory", "is not a folder", "--trajectory")


def test_a_tool_server_that_cannot_start_is_reported_before_the_model_is_loaded(tiny: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = in_process(tiny, "--mcp", "broken=/no/such/program", env={"NANBEIGE_RUNS_DIR": str(runs)})
    assert_one_line_error(result, "MCP server 'broken'", "failed to start")
    assert "loading" not in result.stderr
    assert not runs.exists()  # no empty trajectory, log or folder left behind


def test_a_model_that_cannot_be_downloaded_fails_at_once_with_the_fixes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    hub = f"http://127.0.0.1:{free_port()}"  # stands for a machine with no network: nothing answers there
    result = nanbeige(
        "ask",
        "q",
        "--backend",
        "transformers",
        "--model",
        "nobody/no-such-model",
        "--mcp",
        TESTKIT,
        env={"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf"), "NANBEIGE_RUNS_DIR": str(runs)},
        timeout=120,
    )
    # the check's own answer, before loading began: transformers alone retries for about a minute, in loading
    assert_one_line_error(result, "'nobody/no-such-model' is not downloaded", "--model", "--base-url")
    assert "loading" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr  # a line, not twenty
    assert not runs.exists()


def test_the_settings_file_sits_between_the_environment_and_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "nanbeige.toml").write_text(
        'model = "file-model"\nmax_turns = 3\n\n[ask]\nkeep_tool_results = 2\ntemperature = 0.25\n'
    )
    assert (
        nanbeige("trust", "--yes", str(tmp_path / "nanbeige.toml")).returncode == 0
    )  # a folder's file counts once trusted
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        result = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "q",
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--max-turns",
                "9",
                "--trajectory",
                "t.jsonl",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "NANBEIGE_MODEL": "env-model"},
        )
    assert result.returncode == 0, result.stderr
    start = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert server.requests[0]["model"] == "env-model"  # the environment beats the file
    assert start["limits"]["max_turns"] == 9  # a flag beats the file
    assert start["limits"]["keep_tool_results"] == 2 and server.requests[0]["temperature"] == 0.25  # the file
    assert start["limits"]["max_context"] == 262144  # the default, where nothing else says


def test_a_command_group_with_options_of_its_own_takes_them_from_its_table(tmp_path: Path) -> None:
    """`train` runs itself and has subcommands (`train report`): its own options sit in [train] beside
    [train.report], and top-level settings reach it as any command."""
    from nanbeige.agent.cli import settings_file
    from nanbeige.agent.cli.program import app

    path = tmp_path / "settings.toml"
    path.write_text("lr = 2e-6\n[train]\nlora_rank = 16\nsteps = 3\n")
    found = settings_file.Found(used=[(path, "NANBEIGE_CONFIG")], ignored=[])
    train = settings_file.default_map(app, found)["train"]
    assert train["lr"] == 2e-6 and train["lora_rank"] == 16 and train["steps"] == 3
    path.write_text("[train]\nlora_rnak = 16\n")
    with pytest.raises(settings_file.SettingsError, match=r"\[train\] has no setting 'lora_rnak'"):
        settings_file.default_map(app, found)


def test_a_setting_no_command_has_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("[ask]\nmax_turn = 3\n")
    assert_one_line_error(nanbeige("ask", "q", env={"NANBEIGE_CONFIG": str(path)}), "[ask] has no setting 'max_turn'")
    path.write_text("[index]\nout = 'x'\n")  # a group's table holds its commands' tables, not settings
    assert_one_line_error(
        nanbeige("ask", "q", env={"NANBEIGE_CONFIG": str(path)}), "[index] has no setting 'out'", "[index.build]"
    )
    path.write_text("[ask\n")
    result = nanbeige("ask", "q", env={"NANBEIGE_CONFIG": str(path)})
    assert_one_line_error(result, "not valid TOML")
    assert result.returncode == 2


def test_sigterm_closes_the_trajectory_like_ctrl_c(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    replies = [mcp_call("testkit", "echo", {"text": "a"}), Reply(content="never", delay_s=30)]
    with FakeOpenAI(replies) as server:
        process = subprocess.Popen(
            [
                NANBEIGE,
                "ask",
                "q",
                "--base-url",
                server.base_url,
                "--mcp",
                TESTKIT,
                "--no-default-servers",
                "--trajectory",
                str(path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # as a job scheduler or `kill` does: to this process alone
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    end = json.loads(path.read_text().splitlines()[-1])
    assert (end["type"], end["stop_reason"], end["num_turns"]) == ("end", "interrupted", 1)


@pytest.mark.anyio
async def test_a_bug_ends_the_trajectory_as_crashed_not_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    with pytest.raises(ZeroDivisionError):
        await run("q", ScriptedLLM([ZeroDivisionError("division by zero")]), None, AgentConfig(), writer)
    writer.close()
    [saved] = load_trajectories(path)
    assert saved.stop_reason == "crashed" and saved.error == "ZeroDivisionError: division by zero"
    # what the model server did wrong is a model error, not a crash
    trajectory = await run("q", ScriptedLLM([ModelError("bad reply")]), None, AgentConfig())
    assert trajectory.stop_reason == "model_error"


def test_the_context_length_comes_from_the_server_unless_given(tmp_path: Path) -> None:
    with FakeOpenAI([], default=mcp_answer("a"), vllm=True, max_model_len=40960) as server:
        told = ask_server(server, tmp_path / "told.jsonl")
        given = ask_server(server, tmp_path / "given.jsonl", "--max-context", "20000")
    assert told.returncode == 0 and given.returncode == 0, told.stderr + given.stderr
    for name, expected in (("told", 40960), ("given", 20000)):
        start = json.loads((tmp_path / f"{name}.jsonl").read_text().splitlines()[0])
        assert start["limits"]["max_context"] == expected


def test_ask_works_against_a_server_that_refuses_unknown_fields(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_call("testkit", "add", {"a": 2, "b": 3})], default=mcp_answer("5"), strict=True) as server:
        result = nanbeige(
            "ask",
            "What is 2+3?",
            "--base-url",
            server.base_url,
            "--mcp",
            TESTKIT,
            "--no-default-servers",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
        )
    assert result.returncode == 0 and result.stdout == "5\n", result.stderr
    assert all("return_token_ids" not in request for request in server.requests)


def test_a_bug_is_one_line_and_the_trajectory_is_closed_as_crashed(tmp_path: Path) -> None:
    import sys

    path = tmp_path / "t.jsonl"
    # the command line as installed, with a bug planted in reply parsing
    program = (
        "import sys; from nanbeige.agent.run import dialects; from nanbeige.agent.cli import program\n"
        "def broken(*args): return 1 / 0\n"
        "dialects.parse_reply = broken\n"
        "sys.argv[0] = 'nanbeige'; program.main()"
    )
    with FakeOpenAI([], default=mcp_answer("x")) as server:
        args = ["ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", str(path)]
        result = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=60)
        debug = subprocess.run(
            [sys.executable, "-c", program, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NANBEIGE_DEBUG": "1"},
        )
    assert_one_line_error(result, "nanbeige crashed: ZeroDivisionError: division by zero", "NANBEIGE_DEBUG=1")
    assert result.returncode == 1
    assert "Traceback" in debug.stderr and "in broken" in debug.stderr  # where it happened, when asked for
    ends = [json.loads(line) for line in path.read_text().splitlines() if '"type":"end"' in line]
    assert [end["stop_reason"] for end in ends] == ["crashed", "crashed"]


def test_token_mode_against_a_server_that_is_not_vllm_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_answer("x")]) as server:  # a plain OpenAI-compatible server
        result = nanbeige(
            "ask",
            "q",
            "--token-mode",
            "--base-url",
            server.base_url,
            "--mcp",
            TESTKIT,
            "--trajectory",
            str(tmp_path / "t.jsonl"),
        )
    assert_one_line_error(result, "--token-mode needs a vLLM server", "is not vLLM")
    assert list(tmp_path.iterdir()) == [] and server.requests == []


def test_the_default_reply_length_shrinks_to_fit_a_small_server_context(tmp_path: Path) -> None:
    with FakeOpenAI([], default=mcp_answer("ok"), vllm=True, max_model_len=8192) as server:
        fitted = ask_server(server, tmp_path / "t.jsonl")
        asked = ask_server(server, tmp_path / "u.jsonl", "--max-tokens", "8000")
    assert fitted.returncode == 0, fitted.stderr
    assert "replies shortened" in fitted.stderr and server.requests[0]["max_tokens"] == 2048
    assert_one_line_error(asked, "--max-tokens 8000 leaves no room", "8192")  # what the user asked is not overridden
    assert asked.returncode == 2


def test_sigterm_during_setup_ends_the_command_at_once(tmp_path: Path) -> None:
    import socket

    with socket.socket() as silent:  # takes connections, never answers: the probe waits for its timeout
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(120)  # only against a hang: the probe connects as soon as the command has started
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        process = subprocess.Popen(
            [NANBEIGE, "ask", "q", "--base-url", url, "--trajectory", str(tmp_path / "t.jsonl")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        probe, _ = silent.accept()  # the command is in setup, waiting for the probe's answer
        probing = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        ended = time.monotonic()
        probe.close()
    assert process.returncode == 143, stderr
    # measured from the probe's start, which the signal followed at once: the probe gives up after 10 s
    assert ended - probing < 10  # ended by the signal, not after the probe gave up
    assert "Traceback" not in stderr and not (tmp_path / "t.jsonl").exists()


def test_a_key_quoted_back_by_the_server_never_reaches_stdout_or_stderr(tmp_path: Path) -> None:
    key = "sk-very-secret-1234"
    quoting = Reply(status=401, body={"error": {"message": f"invalid key: Bearer {key}"}})
    with FakeOpenAI([quoting, quoting]) as server:
        plain = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
            env={"NANBEIGE_API_KEY": key},
        )
        as_json = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--json",
            "--trajectory",
            str(tmp_path / "t.jsonl"),
            env={"NANBEIGE_API_KEY": key},
        )
    assert server.requests[0]["_headers"]["Authorization"] == f"Bearer {key}"  # the key was sent, and quoted back
    assert "invalid key: Bearer [REDACTED]" in plain.stderr and "Bearer [REDACTED]" in as_json.stdout
    for text in (plain.stdout, plain.stderr, as_json.stdout, as_json.stderr, (tmp_path / "t.jsonl").read_text()):
        assert key not in text


@pytest.mark.slow
def test_sampling_and_turn_limits_follow_the_dialect_unless_given(tmp_path: Path) -> None:
    def ask(*args: str, vllm: bool = True) -> tuple[dict, dict]:
        with FakeOpenAI([], default=mcp_answer("ok"), vllm=vllm) as server:
            result = ask_server(server, tmp_path / "t.jsonl", *args)
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
        start = [record for record in records if record["type"] == "start"][-1]
        return server.requests[0], start

    request, start = ask()  # mcp-xml: the card's deep-search temperature, the reference's penalty and turns
    assert (request["temperature"], request["top_p"], request["repetition_penalty"]) == (1.0, 0.95, 1.05)
    assert start["limits"]["max_turns"] == 600 and start["sampling"]["repetition_penalty"] == 1.05
    request, start = ask("--dialect", "tool-call")  # the card's general settings; no penalty to send
    assert (request["temperature"], request["top_p"], "repetition_penalty" in request) == (0.6, 0.95, False)
    assert start["limits"]["max_turns"] == 200
    request, start = ask("--temperature", "0.3", "--repetition-penalty", "1.2", "--max-turns", "7")
    assert (request["temperature"], request["repetition_penalty"], start["limits"]["max_turns"]) == (0.3, 1.2, 7)
    request, _ = ask(vllm=False)  # a server that is not vLLM does not know the field
    assert request["temperature"] == 1.0 and "repetition_penalty" not in request


def test_a_system_prompt_file_replaces_the_built_in_prompt(tmp_path: Path) -> None:
    template = tmp_path / "prompt.txt"
    template.write_text("You research questions. Date: {date}.\nTools:\n{tools}")
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        result = nanbeige(
            "ask",
            "q",
            "--base-url",
            server.base_url,
            "--mcp",
            TESTKIT,
            "--no-default-servers",
            "--system-prompt-file",
            str(template),
            "--trajectory",
            str(tmp_path / "t.jsonl"),
        )
    assert result.returncode == 0, result.stderr
    system = server.requests[0]["messages"][0]["content"]
    assert system.startswith("You research questions. Date: ") and "\nTools:\n\n## Server name: testkit\n" in system
    assert "{date}" not in system and "{tools}" not in system
    template.write_text("No tools here.")
    assert_one_line_error(nanbeige("ask", "q", "--system-prompt-file", str(template)), "no {tools} placeholder")
    assert_one_line_error(
        nanbeige("ask", "q", "--system-prompt-file", str(tmp_path / "missing.txt")), "cannot read --system-prompt-file"
    )
