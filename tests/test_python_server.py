"""The `tool-python` MCP server: in process through the SDK's client, and as a real stdio subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import mcp
import pytest
from conftest import JAIL
from mcp.client.stdio import PROCESS_TERMINATION_TIMEOUT
from sandbox_leftovers import Leftovers, close_under_load, leftovers

from nanbeige.servers.python import build_server
from nanbeige.tools.sandbox import SandboxConfig, Sandboxes

pytestmark = pytest.mark.anyio

TOOLS = {
    "create_sandbox": {"timeout": 600},
    "run_command": {"command": None, "sandbox_id": None},
    "run_python_code": {"code_block": None, "sandbox_id": None},
    "upload_file_from_local_to_sandbox": {
        "sandbox_id": None,
        "local_file_path": None,
        "sandbox_file_path": "/home/user",
    },
    "download_file_from_internet_to_sandbox": {"sandbox_id": None, "url": None, "sandbox_file_path": "/home/user"},
    "download_file_from_sandbox_to_local": {"sandbox_id": None, "sandbox_file_path": None, "local_filename": None},
}


def local_config(tmp_path: Path, **overrides: object) -> SandboxConfig:
    return SandboxConfig(
        root=tmp_path / "sandboxes",
        upload_dirs=[tmp_path],
        download_dir=tmp_path / "downloads",
        jail=JAIL,
        timeout_s=2.0,
        **overrides,
    )  # type: ignore[arg-type]


def text(result: mcp.types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content)  # type: ignore[union-attr]


async def test_offers_the_six_tools_with_the_trained_signatures(tmp_path: Path) -> None:
    async with mcp.Client(build_server(Sandboxes(local_config(tmp_path)))) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == set(TOOLS)
    for name, params in TOOLS.items():
        schema = tools[name].input_schema
        assert list(schema["properties"]) == list(params), name
        assert {p: schema["properties"][p].get("default") for p in params} == params, name
        assert sorted(schema.get("required", [])) == sorted(
            p for p, d in params.items() if d is None and p != "local_filename"
        ), name
        assert "Args:" in tools[name].description and "Returns:" in tools[name].description
        # listed as the reference's fastmcp server listed them: cleaned docstring, no schema title
        description = tools[name].description
        assert description == description.strip() and "\n    Args:" not in description
        assert "title" not in schema, name
    assert tools["create_sandbox"].input_schema["properties"] == {"timeout": {"default": 600, "title": "Timeout"}}


async def assert_made_up_ids_are_refused(client: mcp.Client, tmp_path: Path) -> None:
    """Sandbox ids no sandbox was created with: one of the model's own making, and `default`."""
    bad = await client.call_tool("run_python_code", {"code_block": "1", "sandbox_id": "my-sandbox"})
    assert bad.is_error and text(bad) == (
        "[ERROR]: 'my-sandbox' is not a valid sandbox_id. Please create a "
        "real sandbox first using the create_sandbox tool."
    )
    # a made-up id is refused by every tool that takes one, in the reference server's words
    for name, args in (
        ("run_python_code", {"code_block": "1 + 1"}),
        ("run_command", {"command": "echo hi"}),
        ("upload_file_from_local_to_sandbox", {"local_file_path": str(tmp_path / "notes.txt")}),
        ("download_file_from_internet_to_sandbox", {"url": "https://example.com/x.txt"}),
        ("download_file_from_sandbox_to_local", {"sandbox_file_path": "/home/user/notes.txt"}),
    ):
        made_up = await client.call_tool(name, {"sandbox_id": "default", **args})
        assert made_up.is_error and text(made_up) == (
            "[ERROR]: 'default' is not a valid sandbox_id. Please create a real sandbox first using the "
            "create_sandbox tool."
        ), name


async def test_a_session_with_state_errors_and_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    async with mcp.Client(build_server(Sandboxes(local_config(tmp_path)))) as client:
        created = text(await client.call_tool("create_sandbox", {}))
        # the timeout's schema has no type (as in the reference), so the tool checks it itself
        for timeout, shown in (("soon", "'soon'"), (-5, "-5"), (0, "0"), (1e12, "1000000000000.0"), (True, "True")):
            refused = await client.call_tool("create_sandbox", {"timeout": timeout})
            assert refused.is_error and text(refused) == (
                f"[ERROR]: timeout must be a whole number of seconds from 1 to 600, not {shown}."
            ), timeout
        assert created.startswith("Sandbox created with sandbox_id: ")
        sid = created.splitlines()[0].split(": ")[1]  # a second line says what isolation is missing

        async def call(name: str, **args: object) -> mcp.types.CallToolResult:
            return await client.call_tool(name, {"sandbox_id": sid, **args})

        assert not (await call("run_python_code", code_block="total = 40")).is_error
        result = await call("run_python_code", code_block="print('adding')\ntotal + 2")
        assert (text(result), result.is_error) == (
            "Execution(Results: [Result(42)], Logs: Logs(stdout: ['adding\\n'], stderr: []), Error: None)",
            False,
        )
        raised = await call("run_python_code", code_block="raise ValueError('bad input')")
        assert not raised.is_error and "Error: ExecutionError(name='ValueError', value='bad input'" in text(raised)
        slow = await call("run_python_code", code_block="while True: pass")
        assert slow.is_error and "timed out after 2 s" in text(slow) and "lost" in text(slow)
        command = await call("run_command", command="echo $HOME")
        assert text(command) == "CommandResult(stderr='', stdout='/home/user\\n', exit_code=0, error=None)"
        failed = await call("run_command", command="echo $HOME; echo no >&2; exit 3")
        assert failed.is_error and text(failed) == (
            "[ERROR]: Failed to run command.\n\nException type: "
            "CommandExitException\nDetails: Command exited with code 3 "
            "and error:\nno\n"
        )
        uploaded = await call("upload_file_from_local_to_sandbox", local_file_path=str(tmp_path / "notes.txt"))
        assert text(uploaded) == "File uploaded to /home/user/notes.txt"
        refused = await call("upload_file_from_local_to_sandbox", local_file_path="/etc/passwd")
        assert refused.is_error and text(refused).startswith("[ERROR]: /etc/passwd cannot be uploaded")
        saved = await call("download_file_from_sandbox_to_local", sandbox_file_path="notes.txt", local_filename="n.txt")
        assert text(saved).endswith("/downloads/n.txt") and (tmp_path / "downloads" / "n.txt").read_text() == "hello"
        fetched = await call("download_file_from_internet_to_sandbox", url="http://127.0.0.1:9/x.txt")
        assert fetched.is_error and "local or private address" in text(fetched)

        await assert_made_up_ids_are_refused(client, tmp_path)
    assert os.listdir(tmp_path / "sandboxes") == []  # closed with the session


def server_env(tmp_path: Path) -> dict[str, str]:
    return {
        "NANBEIGE_SANDBOX_BACKEND": "local",
        "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
        "SERPER_API_KEY": "secret-serper",
        "PATH": os.environ["PATH"],
        "NANBEIGE_SANDBOX_JAIL": str(int(JAIL)),
    }


async def test_runs_as_a_stdio_subprocess(tmp_path: Path) -> None:
    params = mcp.StdioServerParameters(
        command=sys.executable, args=["-m", "nanbeige.servers.python"], env=server_env(tmp_path)
    )
    async with mcp.Client(params) as client:
        sid = text(await client.call_tool("create_sandbox", {"timeout": 60})).splitlines()[0].split(": ")[1]
        await client.call_tool(
            "run_python_code", {"code_block": "import os\nkeys = sorted(os.environ)", "sandbox_id": sid}
        )
        result = await client.call_tool("run_python_code", {"code_block": "keys", "sandbox_id": sid})
        assert not result.is_error and "'HOME'" in text(result) and "SERPER" not in text(result)
        assert os.listdir(tmp_path / "sandboxes") == [sid]
    assert os.listdir(tmp_path / "sandboxes") == []  # stdin closed: the server cleaned up


def rpc(proc: subprocess.Popen, message: dict) -> dict | None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline()) if "id" in message else None


def test_sigterm_closes_every_sandbox(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanbeige.servers.python"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=server_env(tmp_path),
    )
    try:
        rpc(
            proc,
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            },
        )
        rpc(proc, {"method": "notifications/initialized"})
        reply = rpc(proc, {"id": 2, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}})
        sid = reply["result"]["content"][0]["text"].splitlines()[0].split(": ")[1]  # type: ignore[index]
        reply = rpc(
            proc,
            {
                "id": 3,
                "method": "tools/call",
                "params": {"name": "run_python_code", "arguments": {"code_block": "x = 1", "sandbox_id": sid}},
            },
        )
        assert reply["result"]["isError"] is False  # type: ignore[index]
        assert os.listdir(tmp_path / "sandboxes") == [sid]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert os.listdir(tmp_path / "sandboxes") == []


async def test_a_client_closing_busy_sandboxes_leaves_nothing_behind_within_its_grace(tmp_path: Path) -> None:
    """The MCP client closes stdin and kills the server 2 s later: every sandbox (its processes, and as
    root its loop device, mount and image) must be gone by then, also with calls still running."""
    root = tmp_path / "sandboxes"
    closes, wrote, _ = await close_under_load(root, servers=1, sandboxes=8, mb=20)
    assert wrote == 8
    assert closes[0] < PROCESS_TERMINATION_TIMEOUT  # the server ended on its own, before any signal
    assert leftovers(root) == Leftovers([], [], [], [])
