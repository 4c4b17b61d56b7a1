"""vLLM's own scaling in front of several servers: vllm-router (the `vllm-router` package) as the one
`--base-url`, instead of naming each server. The rows are those of the pool: the same questions, rollout
indices, answers and turns, whichever of the two spreads the requests. The servers are loopback fakes whose
replies depend only on the request, so both ways give the same text."""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from conftest import free_port
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from test_pool import NANBEIGE, collect

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

ROUTER = str(Path(NANBEIGE).parent / "vllm-router")


def question_script(request: dict[str, Any]) -> Reply:
    """A model that shouts the question's number once, then answers it (wrongly for every third question,
    so answers differ): the same request always gets the same reply, whichever server it reaches."""
    number = int(re.search(r"What is (\d+) \+ 4", request["messages"][1]["content"]).group(1))
    if len(request["messages"]) > 2:  # the tool result is back
        return Reply(mcp_answer("5" if number % 3 == 0 else "4"), delay_s=0.02)
    return Reply(mcp_call("testkit", "shout", {"text": f"question {number}"}), delay_s=0.02)


@contextmanager
def vllm_router(servers: list[FakeOpenAI], *args: str) -> Iterator[str]:
    """vllm-router in front of the servers; yields its base URL once it says every server is healthy (it asks
    each one's `GET /health`, as it would a vLLM)."""
    port = free_port()
    workers = [server.base_url.removesuffix("/v1") for server in servers]
    with tempfile.TemporaryFile("w+") as log:  # a file: a pipe nobody reads would fill and stall it
        router = subprocess.Popen(
            [
                ROUTER,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                *workers,
                "--worker-startup-check-interval",
                "1",
                "--worker-startup-timeout-secs",
                "30",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while not healthy(port):
                if router.poll() is not None:
                    log.seek(0)
                    raise AssertionError(f"vllm-router exited: {log.read()[-2000:]}")
                assert time.monotonic() < deadline, "vllm-router did not become ready in 30 s"
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            router.terminate()
            router.wait(10)


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def rows(path: Path) -> list[tuple]:
    """What a rollout is, without where or when it ran: question, rollout index, answer, and each turn's
    reply and tool results."""
    return sorted(
        (
            t.group_id,
            t.rollout_index,
            t.answer,
            tuple((u.assistant.get("content"), tuple(r.text for r in u.tool_results)) for u in t.turns),
        )
        for t in load_trajectories(path)
    )


def test_collect_through_vllm_router_gets_the_rows_the_pool_gets(tmp_path: Path) -> None:
    (tmp_path / "router").mkdir()
    (tmp_path / "pool").mkdir()
    with ExitStack() as stack:
        servers = [stack.enter_context(FakeOpenAI(question_script)) for _ in range(3)]
        router = stack.enter_context(vllm_router(servers))
        through_router = collect(tmp_path / "router", [router], 9, "--concurrency", "6", group_size=3)
        routed = [len(server.requests) for server in servers]
        through_pool = collect(tmp_path / "pool", [s.base_url for s in servers], 9, "--concurrency", "6", group_size=3)
    assert through_router.returncode == 0, through_router.stderr
    assert through_pool.returncode == 0, through_pool.stderr
    by_router, by_pool = rows(tmp_path / "router" / "rollouts.jsonl"), rows(tmp_path / "pool" / "rollouts.jsonl")
    assert len(by_router) == 27 and by_router == by_pool
    assert {row[2] for row in by_router} == {"4", "5"}
    trajectories = load_trajectories(tmp_path / "router" / "rollouts.jsonl")
    turns = sum(len(t.turns) for t in trajectories)
    assert sum(routed) == turns and sum(count > 0 for count in routed) >= 2, routed  # once each, spread
