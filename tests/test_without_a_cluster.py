"""`--ray` without a cluster: the records a shard sends back are written byte for byte as the run itself would
write them, an address that does not answer or is of the wrong form is one line, and without `--ray` the
commands never load Ray."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_test_server
import pytest
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from ray_cluster import (
    NANBEIGE,
    SAYS_IF_RAY_LOADED,
    command_env,
)

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories


class BothWriters:
    """A run's writer that writes its file and records for the driver at once."""

    def __init__(self, *writers: Any):
        self.writers, self.secrets, self.error = writers, [], None

    def __getattr__(self, name: str) -> Any:
        return lambda *args: [getattr(writer, name)(*args) for writer in self.writers]


@pytest.mark.anyio
@pytest.mark.parametrize("whole", [False, True])
async def test_the_records_a_shard_sends_back_are_written_byte_for_byte_as_the_run_would(
    tmp_path: Path, whole: bool
) -> None:
    from nanbeige.agent.cluster import Recorder, replay

    secret = "sk-never-written-0123"
    own, driven = tmp_path / "own.jsonl", tmp_path / "driven.jsonl"
    writer, recorder = TrajectoryWriter(own, secrets=[secret], whole=whole), Recorder([secret])
    llm = ScriptedLLM([mcp_call("testkit", "echo", {"text": secret}), mcp_answer("done"), mcp_answer("done")])
    async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
        await run("Echo the key.", llm, tools, AgentConfig(), BothWriters(writer, recorder))
        # a model with nothing to say: the run ends as model_error, not on its own
        await run("Then fail.", ScriptedLLM([]), tools, AgentConfig(), BothWriters(writer, recorder))
    writer.close()
    driver = TrajectoryWriter(driven, secrets=[secret], whole=whole)
    replay(recorder.calls, driver)
    driver.close()
    assert driven.read_bytes() == own.read_bytes() and secret not in driven.read_text()
    # whole (collect): the failed run is left out, as its own writer left it out
    assert [t.stop_reason for t in load_trajectories(driven)] == ["answered", *([] if whole else ["model_error"])]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    address = f"127.0.0.1:{closed_port()}"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        done = subprocess.run(
            [
                NANBEIGE,
                "collect",
                "--questions",
                str(questions),
                "--out",
                str(tmp_path / "o.jsonl"),
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--allow-inexact",
                "--ray",
                address,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=command_env(),
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    said = (
        f"error: no Ray cluster answers at {address} (Connection refused); start one with `ray start --head` "
        "there, or pass another --ray"
    )
    assert done.stderr.strip().splitlines() == [said]
    assert not (tmp_path / "o.jsonl").exists()


def test_without_ray_the_commands_never_load_it(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    data = tmp_path / "metadata.jsonl"
    data.write_text(
        json.dumps({"task_id": "t", "Question": "What is 2+2?", "Level": 1, "Final answer": "4", "file_name": ""})
        + "\n"
    )
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        model = ["--base-url", server.base_url, "--no-default-servers"]
        commands = [
            [
                "collect",
                "--questions",
                str(questions),
                "-G",
                "1",
                "--out",
                str(tmp_path / "r.jsonl"),
                "--allow-inexact",
                *model,
            ],
            [
                "eval",
                "gaia",
                "--data",
                str(data),
                "-k",
                "1",
                "--grader",
                "gaia-exact",
                "--out",
                str(tmp_path / "eval"),
                *model,
            ],
            ["judge", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "j.jsonl"), "--no-critic"],
        ]
        for command in commands:
            done = subprocess.run(
                [sys.executable, "-c", SAYS_IF_RAY_LOADED, *command],
                capture_output=True,
                text=True,
                timeout=120,
                env=command_env(),
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip().endswith("ray not loaded"), done.stdout
    assert len(load_trajectories(tmp_path / "j.jsonl")) == 1  # each command ran to its end


@pytest.mark.parametrize(
    "command",
    [
        ["collect", "--questions", "q.jsonl", "--out", "r.jsonl"],
        ["eval", "gaia", "--out", "runs"],
        ["judge", "r.jsonl", "--out", "j.jsonl"],
    ],
)
def test_a_ray_address_of_the_wrong_form_is_one_line_before_anything_runs(tmp_path: Path, command: list[str]) -> None:
    done = subprocess.run(
        [NANBEIGE, *command, "--ray", "head-node"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=command_env(),
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --ray takes auto or HOST:PORT (the head node's address), not 'head-node'"
    ], done.stderr
    assert list(tmp_path.iterdir()) == []
