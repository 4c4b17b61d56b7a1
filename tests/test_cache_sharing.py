"""One tool-result cache shared: 64 concurrent runs and six processes writing one file at once lose
nothing, an eval replayed from the cache fails when a run misses it, and a cache that cannot be written
never stops a run. Keys, recording and `ask` on the cache are `tests/test_cache.py`."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from mcp.server.mcpserver import MCPServer
from test_cache import NANBEIGE, rows
from test_eval_runner import TASKS, write_gaia

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.cache import ToolCache
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall
from nanbeige.evals.out_folder import read_results

# ---------------------------------------------------------------- many runs, many processes


def counting_server() -> tuple[MCPServer, list[str]]:
    calls: list[str] = []
    server = MCPServer(name="counter")

    @server.tool()
    async def look_up(q: str) -> str:
        """Look something up."""
        calls.append(q)
        await asyncio.sleep(0.01)
        return f"about {q}"

    return server, calls


def look_up_then_answer(messages: list[dict]) -> str:
    if any(m["role"] == "assistant" for m in messages):
        return mcp_answer("done")
    question = messages[1]["content"].split("\n")[0]
    return mcp_call("counter", "look_up", {"q": question})


@pytest.mark.anyio
async def test_64_concurrent_runs_share_one_cache(tmp_path: Path) -> None:
    server, calls = counting_server()
    cache = await ToolCache.open(tmp_path / "cache.sqlite")
    llm = ScriptedLLM([], default=look_up_then_answer, record=False)
    async with Toolbox([ServerSpec(name="counter", server=server)], cache=cache) as tools:

        async def wave() -> list:
            return await asyncio.gather(*(run(f"question {i}", llm, tools, AgentConfig()) for i in range(64)))

        first = await wave()
        second = await wave()
    await cache.aclose()
    assert len(calls) == 64 and len(set(calls)) == 64
    assert all(t.stop_reason == "answered" for t in first + second)
    assert [t.turns[0].tool_results[0].text for t in second] == [t.turns[0].tool_results[0].text for t in first]
    assert all(t.turns[0].tool_results[0].cached for t in second)
    assert not any(t.turns[0].tool_results[0].cached for t in first)
    assert cache.summary() == "cache: 64 hits, 64 misses" and len(rows(tmp_path / "cache.sqlite")) == 64


HAMMER = """
import asyncio, sys
from pathlib import Path
from nanbeige.agent.toolbox.cache import ToolCache

async def main(path, who, n):
    cache = await ToolCache.open(Path(path))
    async def one(i):
        await cache.record("s", "t", {"q": f"{who}-{i}"}, f"answer {who} {i}", False)
        await cache.lookup("s", "t", {"q": f"{who}-{(i * 7) % n}"})
    await asyncio.gather(*(one(i) for i in range(n)))
    await cache.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_processes_writing_one_file_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"  # made by the processes themselves, all starting at once
    workers = [
        subprocess.Popen([sys.executable, "-c", HAMMER, str(path), str(who), "300"], stderr=subprocess.PIPE, text=True)
        for who in range(6)
    ]
    errors = [worker.communicate(timeout=120)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * 6, errors
    assert not any("locked" in error for error in errors)
    with sqlite3.connect(path) as db:
        stored = dict(db.execute("SELECT arguments, text FROM tool_results"))
    assert len(stored) == 6 * 300
    assert stored['{"q":"5-299"}'] == "answer 5 299"


def echo_then_answer(twist: str = "") -> Callable[[dict], Reply]:
    """Echoes the question (with `twist` added to the last task's), then gives the gold answer."""

    def reply(request: dict) -> Reply:
        messages = request["messages"]
        task = next(t for t in TASKS if t[2] in messages[1]["content"])
        if not any(m["role"] == "assistant" for m in messages):
            return Reply(content=mcp_call("testkit", "echo", {"text": task[2] + (twist if task == TASKS[-1] else "")}))
        return Reply(content=mcp_answer(task[3]))

    return reply


@pytest.mark.slow
def test_an_eval_replayed_from_the_cache_fails_when_a_run_misses_it(tmp_path: Path) -> None:
    data, cache = write_gaia(tmp_path / "gaia"), tmp_path / "tools.sqlite"

    def evaluate(model: FakeOpenAI, out: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                NANBEIGE,
                "eval",
                "gaia",
                "--grader",
                "official",
                "--data",
                str(data),
                "--out",
                str(tmp_path / out),
                "-k",
                "1",
                "--base-url",
                model.base_url,
                "--no-default-servers",
                "--mcp",
                f"testkit={' '.join(TEST_SERVER)}",
                "--cache",
                str(cache),
                *flags,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            timeout=120,
        )

    with FakeOpenAI(echo_then_answer()) as model:
        recorded = evaluate(model, "recorded")
        replayed = evaluate(model, "replayed", "--replay")
    with FakeOpenAI(echo_then_answer(twist=" (reworded)")) as model:
        missed = evaluate(model, "missed", "--replay")
    assert recorded.returncode == 0 and replayed.returncode == 0, recorded.stderr + replayed.stderr
    assert "| avg@1 | 100.00% |" in recorded.stdout and "| avg@1 | 100.00% |" in replayed.stdout
    assert len(rows(cache)) == len(TASKS)
    assert missed.returncode == 1
    assert missed.stderr.strip().splitlines()[-1] == (
        f"error: 1 run could not be replayed; their trajectories in {tmp_path / 'missed'} say which tool call the "
        "cache did not hold"
    )
    assert len(read_results(tmp_path / "missed")) == len(TASKS) - 1  # the missed run is not scored
    ends = [
        json.loads(line)
        for line in (tmp_path / "missed" / "trajectories.jsonl").read_text().splitlines()
        if '"type":"end"' in line
    ]
    assert [e["stop_reason"] for e in ends].count("replay_miss") == 1


@pytest.mark.anyio
async def test_a_cache_that_cannot_be_written_does_not_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nanbeige.agent.toolbox.cache.BUSY_TIMEOUT_S", 0.2)
    cache = await ToolCache.open(tmp_path / "cache.sqlite")
    other = sqlite3.connect(tmp_path / "cache.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock past the busy timeout
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], cache=cache) as tools:
        result = await tools.call(ToolCall("testkit", "add", {"a": 1, "b": 2}))
    other.rollback()
    other.close()
    assert (result.text, result.is_error, result.cached) == ("3", False, False)
    assert cache.summary() == "cache: 0 hits, 1 miss, 1 failed to read or write the file (the last: database is locked)"
    await cache.aclose()
    assert rows(tmp_path / "cache.sqlite") == []
