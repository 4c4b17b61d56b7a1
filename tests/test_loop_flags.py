"""`nanbeige loop` is told how to run the agent as `collect` is: it takes every run flag collect takes (the same
declarations, not copies), and its rollouts are run as those flags say."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import TEST_SERVER
from tiny_model import make_tiny_model

from nanbeige.agent.cli.program import app

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")

# collect's flags that choose what it samples and where it writes: the loop chooses those itself each
# iteration (its questions file, its own folder, the policy version it trains); and the two it words its own
# way (--model: the policy it trains and serves; --ray: its training stays in its own process)
COLLECTS_OWN = {"questions", "bench", "data", "out", "limit", "policy_version", "allow_inexact", "model", "ray"}


def params_of(command: str) -> dict[str, Any]:
    """A command's parameters by name, as Typer made them."""
    return {param.name: param for param in typer.main.get_command(app).commands[command].params}  # type: ignore[attr-defined]


def test_the_loop_takes_every_run_flag_collect_takes_with_collects_help_and_defaults() -> None:
    collect, loop = params_of("collect"), params_of("loop")
    assert not sorted(set(collect) - COLLECTS_OWN - set(loop)), "nanbeige loop lacks some of collect's flags"
    for name in set(collect) - COLLECTS_OWN:
        assert (loop[name].help, loop[name].default) == (collect[name].help, collect[name].default), name


# run flags the loop did not take before, each to a value other than its default
RUN_FLAGS = ["--mcp", "testkit=" + shlex.join(TEST_SERVER), "--max-turns", "2", "--max-tokens", "6"]
RUN_FLAGS += ["--temperature", "0.7", "--max-result-chars", "777", "--tool-timeout", "9", "--concurrency", "1"]


@pytest.mark.slow
def test_the_loops_rollouts_are_run_as_its_run_flags_say(tmp_path: Path) -> None:
    tiny = make_tiny_model(tmp_path / "tiny")
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "a", "question": "What is 2+2?", "answer": "4"}\n')
    out = tmp_path / "loop"
    done = subprocess.run(
        [
            NANBEIGE,
            "loop",
            "--iterations",
            "1",
            "--questions",
            str(questions),
            "-G",
            "2",
            "--model",
            str(tiny),
            "--backend",
            "transformers",
            "--no-default-servers",
            *RUN_FLAGS,
            "--no-critic",
            "--sync",
            "none",
            "--min-pass-rate",
            "0",
            "--max-pass-rate",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Add MCP servers with --mcp" not in done.stderr  # the loop was given one
    # the line per iteration says how many rollouts called a tool (the tiny model's noise calls none)
    assert "pass rate 0.0, tool use 0.0," in done.stderr
    judged = json.loads((out / "loop.json").read_text())["iterations"][0]["judged"]
    assert (judged["pass_rate"], judged["tool_use"]) == (0.0, 0.0)
    starts = [
        json.loads(line)
        for line in (out / "iter-1" / "rollouts.jsonl").read_text().splitlines()
        if json.loads(line)["type"] == "start"
    ]
    assert len(starts) == 2
    for start in starts:
        assert {tool["server"] for tool in start["tools"]} == {"testkit"}
        assert start["sampling"]["temperature"] == 0.7 and start["sampling"]["max_tokens"] == 6
        assert start["limits"]["max_turns"] == 2
        assert start["limits"]["max_result_chars"] == 777 and start["limits"]["tool_timeout_s"] == 9
