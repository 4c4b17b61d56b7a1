"""Nothing the runtime started outlives it: a `nanbeige ask` killed outright takes its tool servers
and their sandboxes' processes with it, and a tool server killed outright takes its sandboxes'."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JAIL
from fake_openai import FakeOpenAI, created_sandbox, mcp_answer, mcp_call
from processes import alive, command_line, tree, wait_for
from sandbox_leftovers import leftovers

from nanbeige.agent.toolbox.lifeline import tied_to_this_process
from nanbeige.agent.toolbox.server_env import passed_env
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall
from nanbeige.tools.sandbox import SandboxConfig, Sandboxes

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
# The model's code starts a process that leaves the worker's process group, then keeps its call busy.
STRAY = "import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\ntime.sleep(120)"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals are Linux's")
# How long processes may take to end once what started them is killed: far longer than a parent-death
# signal takes even on a busy machine, far shorter than they would live on their own (the cells above
# sleep 120 s and their strays 300 s; the last test's parent 60 s and its child 300 s).
GONE_WITHIN_S = 30.0


def sandbox_env(tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
        "NANBEIGE_RUNS_DIR": str(tmp_path),
        "NANBEIGE_SEARCH_BACKEND": "local",
        "NANBEIGE_INDEX": str(tmp_path / "no-index"),
    }
    for name in ("SERPER_API_KEY", "SEARXNG_URL", "JINA_API_KEY", "E2B_API_KEY"):
        env.pop(name, None)
    return env


def running(root: int, marker: str) -> bool:
    return any(command_line(pid) == f"sleep {marker}" for pid in tree(root))


def test_a_killed_ask_takes_its_tool_servers_and_sandboxes_with_it(tmp_path: Path) -> None:
    marker = "301.5"
    code = STRAY.format(marker=marker)

    def reply(request: dict) -> str:
        made = sum(m["role"] == "assistant" for m in request["messages"])
        if made == 0:
            return mcp_call("tool-python", "create_sandbox", {})
        if made == 1:
            return mcp_call(
                "tool-python",
                "run_python_code",
                {"code_block": code, "sandbox_id": created_sandbox(request["messages"])},
            )
        return mcp_answer("x")

    with FakeOpenAI(reply) as server:
        ask = subprocess.Popen(
            [NANBEIGE, "ask", "q", "--base-url", server.base_url],
            env=sandbox_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started: set[int] = set()
        try:
            assert wait_for(lambda: running(ask.pid, marker), 60), "the sandboxed code never started"
            started = tree(ask.pid) - {ask.pid}
            servers = [pid for pid in started if "nanbeige.servers." in command_line(pid)]
            assert len(servers) == 2 and len(started) >= 4  # python and scrape (no search index), worker, stray
            ask.kill()
            ask.wait()
            assert wait_for(lambda: not alive(started), GONE_WITHIN_S), [command_line(pid) for pid in alive(started)]
        finally:  # whatever survived a failure
            for pid in alive(tree(ask.pid) | started):
                os.kill(pid, signal.SIGKILL)
    # the python server had the time to clean up: its sandbox's folder is gone too
    assert list((tmp_path / "sandboxes").iterdir()) == []


@pytest.mark.anyio
async def test_a_python_server_killed_outright_takes_its_sandboxes_processes_with_it(
    tmp_path: Path, anyio_backend: str
) -> None:
    marker = "302.5"
    os.environ["NANBEIGE_SANDBOX_DIR"] = str(tmp_path / "sandboxes")
    try:
        spec = ServerSpec(
            name="tool-python", command=[sys.executable, "-m", "nanbeige.servers.python"], env=passed_env()
        )
    finally:
        del os.environ["NANBEIGE_SANDBOX_DIR"]
    async with Toolbox([spec]) as toolbox:
        made = await toolbox.call(ToolCall("tool-python", "create_sandbox", {}))
        busy = asyncio.create_task(
            toolbox.call(
                ToolCall(
                    "tool-python",
                    "run_python_code",
                    {
                        "code_block": STRAY.format(marker=marker),
                        "sandbox_id": created_sandbox([{"content": made.text}]),
                    },
                )
            )
        )
        me = os.getpid()
        assert await asyncio.to_thread(wait_for, lambda: running(me, marker), 60)
        server = next(pid for pid in tree(me) if "nanbeige.servers.python" in command_line(pid))
        sandbox = tree(server) - {server}
        assert len(sandbox) >= 2  # the worker and its stray
        place = next(p for p in (tmp_path / "sandboxes").iterdir() if p.name != "downloads")
        owner = json.loads((place / "owner.json").read_text())
        os.kill(server, signal.SIGKILL)  # no cleanup of its own: the sandbox's processes notice by themselves
        try:
            assert await asyncio.to_thread(wait_for, lambda: not alive(sandbox), GONE_WITHIN_S), [
                command_line(pid) for pid in alive(sandbox)
            ]
        finally:  # whatever survived a failure
            for pid in alive(sandbox):
                os.kill(pid, signal.SIGKILL)
        result = await busy
    assert result.is_error and "was restarted" in result.text
    # it could not remove its sandbox (folder, and as root its file system and cgroup): the next
    # server on the same folder (the toolbox's restart of it, or this one) sweeps them at start
    Sandboxes(SandboxConfig(root=tmp_path / "sandboxes", jail=JAIL)).backend.isolation  # noqa: B018 - finds, sweeps
    assert not place.exists() and str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
    # its loop device too (detached by the kernel once its unmounted file system is let go), and its image
    assert await asyncio.to_thread(wait_for, lambda: not leftovers(tmp_path / "sandboxes"), 5), leftovers(
        tmp_path / "sandboxes"
    )
    assert not any(Path(folder).exists() for folder in owner["cgroup"])


def test_any_server_command_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """Also a server the user plugged in, which knows nothing of this."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time\n"
            "from nanbeige.agent.toolbox.lifeline import tied_to_this_process\n"
            "subprocess.Popen(tied_to_this_process(['sleep', '303.5']))\ntime.sleep(60)",
        ]
    )
    try:
        assert wait_for(lambda: running(parent.pid, "303.5"), 60)
        child = tree(parent.pid) - {parent.pid}
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not alive(child), GONE_WITHIN_S)
    finally:
        for pid in alive(tree(parent.pid)):
            os.kill(pid, signal.SIGKILL)


def test_a_missing_program_is_left_to_fail_as_usual() -> None:
    assert tied_to_this_process(["no-such-program-here"]) == ["no-such-program-here"]
