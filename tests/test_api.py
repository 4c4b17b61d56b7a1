"""The Python API (`nanbeige.agent.api`): one answer in a line, many runs at once over one setup, the
settings `nanbeige ask` would use, and clear errors for what the caller got wrong. Loopback model
servers (`FakeOpenAI`) and the test MCP server only."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER, free_port
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from typer.testing import CliRunner

from nanbeige.agent import api
from nanbeige.agent.api import RunSettings, SetupError, ask, ask_many, ask_many_async
from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli import program
from nanbeige.agent.cli.ranges import RANGES
from nanbeige.agent.run.run_config import ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

TESTKIT = "testkit=" + shlex.join(TEST_SERVER)
DELAY_S = 1.0  # how long the fake model takes over each question's first reply


@pytest.fixture(autouse=True)
def like_a_new_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No settings file and no NANBEIGE_* settings but the runs folder, wherever the tests run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("NANBEIGE_BASE_URL", "NANBEIGE_MODEL", "NANBEIGE_API_KEY", "NANBEIGE_REFERENCE", "NANBEIGE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NANBEIGE_RUNS_DIR", str(tmp_path / "runs"))


def numbers(request: dict[str, Any]) -> Reply:
    """The fake model: `Which number is N?` is answered N, slowly the first time (N=3 slowest of all);
    a question with `Fail` in it gets an HTTP 400, which the client does not retry."""
    question = request["messages"][1]["content"]
    if "Fail" in question:
        return Reply(status=400, body={"error": {"message": "the fake refuses this question"}})
    number = re.search(r"Which number is (\d+)\?", question).group(1)
    first = len(request["messages"]) == 2  # system and user message: the run's first call
    return Reply(content=mcp_answer(number), delay_s=(DELAY_S + 0.5 * (number == "3")) if first else 0.0)


def test_one_question_is_answered_in_one_line_with_a_tool_call_in_between(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with FakeOpenAI(
        [mcp_call("testkit", "add", {"a": 2, "b": 3}), mcp_answer("5")], default=mcp_answer("5")
    ) as server:  # the summary turn: the answer again
        trajectory = ask(
            "What is 2+3?", base_url=server.base_url, mcp=TESTKIT, no_default_servers=True, trajectory=path
        )
    assert (trajectory.answer, trajectory.stop_reason) == ("5", "answered")
    assert len(trajectory.turns) == 3  # the call, the answer, the summary turn mcp-xml ends every run with
    [call], [result] = trajectory.turns[0].tool_calls, trajectory.turns[0].tool_results
    assert (call.server, call.name, call.arguments) == ("testkit", "add", {"a": 2, "b": 3})
    assert (result.text, result.is_error) == ("5", False)
    assert "5" in server.requests[1]["messages"][-1]["content"]  # the model read the result
    # the dialect's sampling, as `nanbeige ask` sends it
    assert (server.requests[0]["temperature"], server.requests[0]["top_p"]) == (1.0, 0.95)
    # the trajectory file, as `nanbeige ask` writes it
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "turn", "turn", "turn", "end"]
    [saved] = load_trajectories(path)
    assert (saved.id, saved.answer, len(saved.turns)) == (trajectory.id, "5", 3)


def test_settings_left_unset_resolve_as_nanbeige_ask_resolves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings_file = tmp_path / "settings.toml"
    settings_file.write_text("max_turns = 7\n\n[ask]\ntemperature = 0.3\n")
    monkeypatch.setenv("NANBEIGE_CONFIG", str(settings_file))
    monkeypatch.setenv("NANBEIGE_MODEL", "env-model")
    with FakeOpenAI([], default=mcp_answer("ok")) as server, caplog.at_level(logging.WARNING, logger="nanbeige"):
        trajectory = ask("q", base_url=server.base_url, no_default_servers=True)
    assert trajectory.answer == "ok"
    request = server.requests[0]
    assert request["model"] == "env-model"  # the environment
    assert (request["temperature"], request["top_p"]) == (0.3, 0.95)  # the settings file, then the dialect's
    assert trajectory.limits["max_turns"] == 7
    [saved] = (tmp_path / "runs").glob("*.jsonl")  # a new file in the runs folder, as `ask` makes
    assert [t.id for t in load_trajectories(saved)] == [trajectory.id]
    assert "no tools available" in caplog.text  # the setup's notices are warnings on the `nanbeige` logger
    settings_file.write_text("[ask]\nmax_turn = 3\n")  # and the file is checked as the command checks it
    with pytest.raises(SetupError, match=r"\[ask\] has no setting 'max_turn'"):
        ask("q", base_url=server.base_url)


def test_a_run_settings_object_is_used_as_given_with_the_overrides_on_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANBEIGE_MODEL", "env-model")  # only settings=None reads what `nanbeige ask` reads
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        settings = RunSettings(
            llm=LLMConfig(base_url=server.base_url, temperature=0.2),
            tools=ToolsConfig(default_servers=False),
            trajectory=tmp_path / "t.jsonl",
        )
        trajectory = ask("q", settings, max_tokens=300)
    request = server.requests[0]
    assert (request["model"], request["temperature"], request["max_tokens"]) == (LLMConfig.model, 0.2, 300)
    assert settings.llm.max_tokens == LLMConfig.max_tokens  # the caller's settings are left as they were
    assert [t.id for t in load_trajectories(tmp_path / "t.jsonl")] == [trajectory.id]


@pytest.mark.anyio
async def test_many_questions_run_at_once_over_one_setup_and_come_back_in_order(tmp_path: Path) -> None:
    questions = ["Which number is 3?", "Which number is 1?", "Fail on this one.", "Which number is 2?"]
    path = tmp_path / "many.jsonl"
    with FakeOpenAI(numbers) as server:
        trajectories = await ask_many_async(
            questions, base_url=server.base_url, no_default_servers=True, trajectory=path, concurrency=4
        )
    # in the questions' order, though 3 was answered last; the failed run is there, saying why
    assert [t.answer for t in trajectories] == ["3", "1", None, "2"]
    assert [t.stop_reason for t in trajectories] == ["answered", "answered", "model_error", "answered"]
    assert "the fake refuses this question" in trajectories[2].error
    # every first call reached the model before the first answer came back: the runs overlapped
    firsts = [r["_received"] for r in server.requests if len(r["messages"]) == 2]
    assert len(firsts) == 4 and max(firsts) - min(firsts) < DELAY_S
    assert server.gets.count("/v1/models") == 1  # one setup asked the server what it is, for all four
    assert {t.id for t in load_trajectories(path)} == {t.id for t in trajectories}  # one file, as `eval` writes


def test_the_sync_forms_work_from_a_plain_function(tmp_path: Path) -> None:
    assert ask_many([]) == []  # nothing to run: nothing is started
    with FakeOpenAI(numbers) as server:
        trajectories = ask_many(
            ["Which number is 1?", "Which number is 2?"],
            base_url=server.base_url,
            no_default_servers=True,
            trajectory=tmp_path / "t.jsonl",
            concurrency=1,
        )
    assert [t.answer for t in trajectories] == ["1", "2"]
    firsts = [r["_received"] for r in server.requests if len(r["messages"]) == 2]
    assert firsts[1] - firsts[0] >= DELAY_S  # concurrency=1: the second began once the first was done


@pytest.mark.anyio
async def test_the_sync_forms_inside_a_running_event_loop_point_to_the_async_ones() -> None:
    with pytest.raises(RuntimeError, match=r"running event loop.*await ask_async\(\.\.\.\)"):
        ask("q", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(RuntimeError, match=r"await ask_many_async\(\.\.\.\)"):
        ask_many(["q"], base_url="http://127.0.0.1:9/v1")


def test_what_the_caller_got_wrong_is_a_clear_error_before_anything_starts() -> None:
    with FakeOpenAI([]) as server:
        with pytest.raises(TypeError, match=r"unknown setting 'max_turn' \(did you mean 'max_turns'\?\)"):
            ask("q", base_url=server.base_url, max_turn=3)
        with pytest.raises(TypeError, match=r"max_turns must be int or None, not str"):
            ask("q", base_url=server.base_url, max_turns="3")
        with pytest.raises(TypeError, match=r"settings must be a RunSettings, not LLMConfig"):
            ask("q", LLMConfig(base_url=server.base_url))
        with pytest.raises(ValueError, match=r"budget wants UNIT=N"):
            ask("q", base_url=server.base_url, budget={"dollars": 5})
        with pytest.raises(ValueError, match=r"question is empty"):
            ask("  ", base_url=server.base_url)
        with pytest.raises(TypeError, match=r"not one string"):
            ask_many("Which number is 1?", base_url=server.base_url)
        with pytest.raises(ValueError, match=r"concurrency must be at least 1"):
            ask_many(["q"], base_url=server.base_url, concurrency=0)
        assert (server.gets, server.requests) == ([], [])  # the model server was not even asked
    assert "max_turns" in api.OVERRIDES and "no_default_servers" in api.OVERRIDES


def outside(name: str) -> list[Any]:
    """Values just outside setting `name`'s range, of the type the API takes for it; NaN for a float."""
    low, high = RANGES[name]
    step = 1 if api.OVERRIDES[name][2] is int else 0.5
    values = [] if step == 1 else [float("nan")]
    values += [] if low is None else [type(step)(low) - step]
    return values + ([] if high is None else [type(step)(high) + step])


@pytest.mark.parametrize("name", sorted(RANGES))
def test_the_api_holds_each_setting_to_the_range_of_its_flag(name: str) -> None:
    flag = "--" + name.replace("_", "-")
    low, high = RANGES[name]
    edges = {name: low if api.OVERRIDES[name][2] is int else float(low)}
    assert api.with_overrides(RunSettings(), edges)  # the bound itself is inside
    for value in outside(name):
        with pytest.raises(ValueError, match=rf"^{name} must be (at least|from|a finite number)"):
            ask("q", base_url="http://127.0.0.1:9/v1", **{name: value})
        result = CliRunner().invoke(program.app, ["ask", "q", flag, str(value), "--base-url", "http://127.0.0.1:9/v1"])
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output, result.output


def test_the_api_refuses_what_the_issue_tried() -> None:
    for settings in ({"max_turns": -1}, {"timeout": -5}, {"temperature": float("nan")}, {"max_tokens": -5}):
        with pytest.raises(ValueError, match=f"^{next(iter(settings))} must be"):
            ask("q", base_url="http://127.0.0.1:9/v1", **settings)


def test_a_server_that_does_not_answer_is_a_setup_error_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"cannot reach the model server.*nanbeige serve"):
        ask("q", base_url=f"http://127.0.0.1:{free_port()}/v1", no_default_servers=True)
    assert not (tmp_path / "runs").exists()  # a failed start leaves nothing behind


def test_the_api_is_importable_from_the_package_without_slowing_the_command_line() -> None:
    check = (
        "import sys, nanbeige.agent.cli.program\n"
        "assert 'nanbeige.agent.api' not in sys.modules, 'the command line imported the API'\n"
        "from nanbeige.agent import ask, ask_many_async, RunSettings\n"
        "import nanbeige.agent.api as api\n"
        "assert (ask, ask_many_async, RunSettings) == (api.ask, api.ask_many_async, api.RunSettings)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import nanbeige.agent

    with pytest.raises(AttributeError, match="no_such_name"):
        nanbeige.agent.no_such_name  # noqa: B018
