"""MCP server `tool-python`: sandboxes where the model runs Python and shell commands.

The tools, their names and parameters are those the model was trained with (E2B's code
interpreter behind MiroThinker's server); the work is done by `nanbeige.tools.sandbox`, on E2B when
E2B_API_KEY is set (`sandbox.e2b`), else on this machine (`sandbox.local`, which describes the
limits; `sandbox.SandboxConfig` lists their variables).

    python -m nanbeige.servers.python [--transport stdio|http] [--host 127.0.0.1] [--port 8001]

Sandboxes are closed when the server stops (stdin closed, SIGTERM, Ctrl-C): as soon as the client
closes stdin, even while calls are still running in them, since an MCP client kills a server that
has not exited 2 s after that. Logs go to stderr; stdout carries the stdio protocol.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import logging
import os
import select
import signal
import stat
import struct
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult

from nanbeige.servers.listing import fastmcp_tool, server_version
from nanbeige.servers.metered import metered_result
from nanbeige.tools import paid_units
from nanbeige.tools.sandbox import ERROR_DETAIL_CHARS, SandboxError, Sandboxes, config_from_env

log = logging.getLogger(__name__)


def answer(work: Callable[[], str]) -> CallToolResult:
    """The tool's text. A failure answers as the reference server did, with a text starting
    `[ERROR]: ` (there it was an ordinary result; here it is also marked as an error)."""
    with paid_units.metered() as cost:  # E2B's sandbox seconds
        try:
            return metered_result(work(), cost)
        except SandboxError as exc:
            text = f"[ERROR]: {exc}"
        except Exception as exc:
            log.exception("tool-python failed")
            text = (
                f"[ERROR]: The sandbox failed unexpectedly; try again. Exception type: {type(exc).__name__}, "
                f"Details: {str(exc)[:ERROR_DETAIL_CHARS]}"
            )
    return metered_result(text, cost, is_error=True)


def sandboxes(ctx: Context) -> Sandboxes:
    """The server's sandboxes, handed to the tools by the lifespan in `build_server`."""
    return ctx.request_context.lifespan_context["sandboxes"]


def create_sandbox(ctx: Context, timeout: Any = 600) -> CallToolResult:
    """Create a Linux sandbox for running Python code and shell commands, and return its id.

    Files live in /home/user. Variables, imports and definitions persist between
    `run_python_code` calls on the same sandbox. Wait for this tool's answer before using the
    id; do not make up ids.

    Args:
        timeout: Seconds without use after which the sandbox shuts down (at most 600).

    Returns:
        `Sandbox created with sandbox_id: <id>`; pass that id to the other tools.
    """
    # `Any`: the reference left it unannotated, so its schema is `{'default': 600, 'title': 'Timeout'}`.
    return answer(lambda: sandboxes(ctx).create(timeout))  # checked there: whole seconds within the limit


def run_command(ctx: Context, command: str, sandbox_id: str) -> CallToolResult:
    """Run a short shell command in the sandbox, in /home/user.

    Keep commands quick; long-running servers or heavy jobs are stopped at the time limit, and
    background processes are stopped when the command returns.

    Args:
        command: The shell command.
        sandbox_id: The id returned by `create_sandbox`.

    Returns:
        CommandResult(stderr=..., stdout=..., exit_code=..., error=...).
    """
    return answer(lambda: sandboxes(ctx).run_command(command, sandbox_id))


def run_python_code(ctx: Context, code_block: str, sandbox_id: str) -> CallToolResult:
    """Run Python code in the sandbox, like a notebook cell, and return what it produced.

    State persists between calls on the same sandbox. The value of a final expression is
    returned as a result; printed output appears in the logs; an exception appears as Error.
    Keep each call short: code that runs past the time limit is stopped, and processes it
    starts are stopped when the call ends.

    Args:
        code_block: The Python code to run.
        sandbox_id: The id returned by `create_sandbox`; reuse it across calls.

    Returns:
        Execution(Results: [...], Logs: Logs(stdout: [...], stderr: [...]), Error: ...).
    """
    return answer(lambda: sandboxes(ctx).run_python(code_block, sandbox_id))


def upload_file_from_local_to_sandbox(
    ctx: Context, sandbox_id: str, local_file_path: str, sandbox_file_path: str = "/home/user"
) -> CallToolResult:
    """Copy a local file into the sandbox.

    Args:
        sandbox_id: The id returned by `create_sandbox`.
        local_file_path: Path of the file on the local machine.
        sandbox_file_path: Folder (or file path) in the sandbox to copy it to; default /home/user.

    Returns:
        The path of the file in the sandbox.
    """
    return answer(lambda: sandboxes(ctx).upload(sandbox_id, local_file_path, sandbox_file_path))


def download_file_from_internet_to_sandbox(
    ctx: Context, sandbox_id: str, url: str, sandbox_file_path: str = "/home/user"
) -> CallToolResult:
    """Download a file from an http(s) URL into the sandbox.

    Args:
        sandbox_id: The id returned by `create_sandbox`.
        url: The URL of the file.
        sandbox_file_path: Folder (or file path) in the sandbox to save it to; default /home/user.

    Returns:
        The path of the downloaded file in the sandbox.
    """
    return answer(lambda: sandboxes(ctx).download_url(sandbox_id, url, sandbox_file_path))


def download_file_from_sandbox_to_local(
    ctx: Context, sandbox_id: str, sandbox_file_path: str, local_filename: str | None = None
) -> CallToolResult:
    """Copy a file from the sandbox to the local machine, where other tools can read it.

    Args:
        sandbox_id: The id returned by `create_sandbox`.
        sandbox_file_path: Path of the file in the sandbox.
        local_filename: Name to save it under; default the file's own name.

    Returns:
        The local path of the saved file.
    """
    return answer(lambda: sandboxes(ctx).download_to_local(sandbox_id, sandbox_file_path, local_filename))


TOOLS: list[Callable[..., CallToolResult]] = [
    create_sandbox,
    run_command,
    run_python_code,
    upload_file_from_local_to_sandbox,
    download_file_from_internet_to_sandbox,
    download_file_from_sandbox_to_local,
]


def build_server(boxes: Sandboxes | None = None) -> MCPServer:
    """The `tool-python` server over `boxes` (by default configured from the environment); the
    sandboxes are closed when a session with the server ends."""
    boxes = boxes or Sandboxes(config_from_env())

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        boxes.start()
        try:
            yield {"sandboxes": boxes}
        finally:
            await anyio.to_thread.run_sync(boxes.close)

    return MCPServer(
        name="tool-python", version=server_version(), lifespan=lifespan, tools=[fastmcp_tool(tool) for tool in TOOLS]
    )


STOP_WAIT_S = 10.0  # the longest a signal waits for the sandboxes to close before the server exits anyway
READ_WAIT_S = 0.5  # the longest a hangup waits for the transport to read what came before it


def close_on_hangup(boxes: Sandboxes, fd: int = 0) -> threading.Thread | None:
    """Closes the sandboxes once the client has closed stdin (a pipe or socket) and the transport has
    read what it sent. The server itself ends later, when its calls in flight do: their sandboxes are
    what ends them, and a client gives it 2 s before it kills it. None where stdin cannot hang up."""
    if not (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
        return None
    watched = os.dup(fd)  # the transport moves fd 0 elsewhere; the copy stays on the pipe

    def watch() -> None:
        poller = select.poll()
        poller.register(watched, 0)  # no events asked for: poll returns on hangup (or error) only
        poller.poll()
        deadline = time.monotonic() + READ_WAIT_S
        while unread_bytes(watched) and time.monotonic() < deadline:
            time.sleep(0.01)
        boxes.close()

    thread = threading.Thread(target=watch, name="stdin-hangup", daemon=True)
    thread.start()
    return thread


def unread_bytes(fd: int) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def serve(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8001) -> None:
    """Runs the server until stdin closes (stdio) or it is stopped, then closes every sandbox."""
    boxes = Sandboxes(config_from_env())
    server = build_server(boxes)

    def stop(signum: int, frame: Any) -> None:
        # Exit at once: unwinding would wait for the thread blocked reading stdin. The close runs in a
        # thread of its own: this (the main) one may have been stopped holding a lock it needs. A second
        # signal (a dying runtime's parent-death signal comes once per thread it had) must not cut the
        # cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        closer = threading.Thread(target=boxes.close, name="sandbox-stop", daemon=True)
        closer.start()
        closer.join(STOP_WAIT_S)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    atexit.register(boxes.close)
    try:
        if transport == "stdio":
            close_on_hangup(boxes)
            server.run()
        elif transport == "http":
            server.run("streamable-http", host=host, port=port)
        else:
            raise ValueError(f"transport must be stdio or http, not {transport!r}")
    finally:
        boxes.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m nanbeige.servers.python", description=__doc__.split("\n")[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
