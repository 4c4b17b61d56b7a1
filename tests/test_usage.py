"""What runs use and the budgets that stop them: paid units counted where the paid request is made,
summed per run into the end record, shown by `show` and eval reports; `--budget` stops a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from fake_search_apis import FakeSerper
from test_sandbox import make_config
from test_sandbox_e2b import FakeE2BSandbox

from nanbeige.agent.run.usage import over_budget, parse_budgets, run_usage, usage_text
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.scores import build_report, markdown
from nanbeige.tools import paid_units
from nanbeige.tools.sandbox import Sandboxes
from nanbeige.tools.sandbox.e2b import E2BBackend

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def searching_model(request: dict) -> Reply:
    """Searches a new query every turn until asked for the final answer, then answers."""
    messages = request["messages"]
    if "no more tools can be used" in (messages[-1]["content"] or ""):
        return Reply(content=mcp_answer("42"))
    step = sum(m["role"] == "assistant" for m in messages)
    return Reply(content=mcp_call("search_and_scrape_webpage", "google_search", {"q": f"query {step}"}))


def ask(tmp_path: Path, serper: FakeSerper, model: FakeOpenAI, *flags: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "SERPER_API_KEY": "test-key",
        "SERPER_BASE_URL": serper.url,
        "NANBEIGE_SEARCH_BACKEND": "serper",
        "NANBEIGE_SANDBOX_DIR": str(tmp_path / "boxes"),
    }
    return subprocess.run(
        [
            NANBEIGE,
            "ask",
            "What is the answer?",
            "--base-url",
            model.base_url,
            "--trajectory",
            str(tmp_path / "run.jsonl"),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_serper_budget_stops_the_run_and_the_answer_is_asked_for(tmp_path: Path) -> None:
    with FakeSerper() as serper, FakeOpenAI(searching_model) as model:
        result = ask(tmp_path, serper, model, "--budget", "serper_queries=2", "--max-turns", "10")
        searched = len(serper.requests)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"  # the final-answer request still came, as at the turn limit
    [trajectory] = load_trajectories(tmp_path / "run.jsonl")
    assert trajectory.stop_reason == "budget" and "2 Serper queries" in trajectory.error
    assert searched == 2 and trajectory.usage["serper_queries"] == 2 and trajectory.usage["tool_calls"] == 2
    assert [r.usage for t in trajectory.turns for r in t.tool_results] == [{"serper_queries": 1}] * 2
    assert trajectory.usage["model_calls"] == 3 and trajectory.usage["tokens"] == sum(
        t.usage["prompt_tokens"] + t.usage["completion_tokens"] for t in trajectory.turns
    )


@pytest.mark.slow
def test_show_prints_each_runs_usage_and_their_total(tmp_path: Path) -> None:
    with FakeSerper() as serper, FakeOpenAI(searching_model) as model:
        for _ in range(2):
            assert ask(tmp_path, serper, model, "--budget", "serper_queries=1").returncode == 0
    shown = subprocess.run(
        [NANBEIGE, "show", str(tmp_path / "run.jsonl")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    used = [line for line in shown.stdout.splitlines() if line.startswith("used")]
    assert len(used) == 3 and all(line.endswith("1 tool calls · 1 Serper queries") for line in used[:2])
    assert used[2].startswith("used in all: ") and used[2].endswith("2 tool calls · 2 Serper queries")


def test_a_bad_budget_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run([NANBEIGE, "ask", "q", "--budget", "dollars=3"], capture_output=True, text=True)
    assert result.returncode == 2 and "UNIT one of tokens, tool_calls, serper_queries" in result.stderr
    assert "Traceback" not in result.stderr
    for bad in ("tokens=0", "tokens=-1", "tokens=nan", "tokens=inf"):  # none of them a budget
        with pytest.raises(ValueError, match="must be a positive number"):
            parse_budgets([bad])
    assert parse_budgets(["tokens=1e6", "e2b_seconds=90"]) == {"tokens": 1e6, "e2b_seconds": 90.0}


def test_budgets_count_tokens_and_tool_calls_from_the_turns() -> None:
    turns = [
        Turn(
            index=i,
            assistant={},
            usage={"prompt_tokens": 100, "completion_tokens": 20},
            tool_calls=[ToolCall("s", "t", {})],
            tool_results=[ToolResult("x", usage={"jina_tokens": 7})],
        )
        for i in range(3)
    ]
    used = run_usage(turns)
    assert used == {
        "model_calls": 3,
        "prompt_tokens": 300,
        "completion_tokens": 60,
        "tokens": 360,
        "tool_calls": 3,
        "jina_tokens": 21,
    }
    assert over_budget(used, {"tokens": 400}) is None
    assert "360 used" in over_budget(used, {"tool_calls": 5, "tokens": 360})
    assert usage_text(used) == "360 tokens · 3 tool calls · 21 Jina tokens"


def test_e2b_sandbox_seconds_are_counted_against_the_calls_that_use_the_sandbox(tmp_path: Path) -> None:
    FakeE2BSandbox.created = []
    config = make_config(tmp_path, backend="e2b", e2b_api_key="key")
    boxes = Sandboxes(config, backend=E2BBackend(config, sandbox_class=FakeE2BSandbox))
    started = time.monotonic()
    with paid_units.metered() as creating:
        boxes.create()
    created = time.monotonic()
    time.sleep(0.3)  # alive, and billed, between calls
    with paid_units.metered() as running:
        boxes.run_python("1 + 1", "e2b0")
    ran = time.monotonic()
    boxes.close()
    # billed the time it was alive, measured around the calls rather than guessed (a busy machine
    # stretches it): creating costs at most the create call's own time, the call all since then
    assert creating.get("e2b_seconds", 0) <= created - started + 0.001  # (rounded to the millisecond)
    assert 0.3 <= running["e2b_seconds"] <= ran - started + 0.001


def test_eval_reports_sum_the_runs_usage() -> None:
    manifest = {"bench": "b", "grader": "gaia-exact", "k": 1, "tasks": [{"id": "a"}, {"id": "b"}]}
    used = {"tokens": 10, "serper_queries": 2}
    rows = [{"task_id": task, "run": 0, "correct": True, "prediction": "x", "usage": used} for task in ("a", "b")]
    report = build_report(manifest, rows)
    assert report["usage"] == {"tokens": 20, "serper_queries": 4}
    assert "| used in all | 20 tokens · 4 Serper queries |" in markdown(report)


def test_old_trajectories_without_usage_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(
        json.dumps({"type": "start", "id": "t", "question": "q"})
        + "\n"
        + json.dumps({"type": "end", "trajectory_id": "t", "answer": "a", "stop_reason": "answered"})
        + "\n"
    )
    [trajectory] = load_trajectories(path)
    assert isinstance(trajectory, Trajectory) and trajectory.usage == {}
