"""What local sandboxes can leave on the host (loop devices, mounts, disk images, folders), and
`python` servers under load closed the way the MCP SDK's stdio client closes them: stdin closed,
2 s of grace, then SIGTERM to the server's process group, 2 s more, then SIGKILL."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import JAIL
from mcp import Client, StdioServerParameters, stdio_client


@dataclass
class Leftovers:
    loops: list[str]
    """Loop devices whose backing file lies under the root."""
    mounts: list[str]
    """Mount points under the root, in this process's mount namespace."""
    images: list[str]
    """Disk images (files named disk.img) under the root."""
    places: list[str]
    """Sandbox folders under the root."""

    def __bool__(self) -> bool:
        return bool(self.loops or self.mounts or self.images or self.places)


def leftovers(root: Path) -> Leftovers:
    base = os.path.realpath(root)
    loops = []
    for device in sorted(Path("/sys/block").glob("loop*")):
        try:
            backing = (device / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue  # not attached
        if backing.startswith(base + "/"):
            loops.append(device.name)
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(base + "/")
    ]
    images = [str(p) for p in Path(base).glob("*/disk.img")] if os.path.isdir(base) else []
    places = [p.name for p in Path(base).iterdir() if p.name != "downloads"] if os.path.isdir(base) else []
    return Leftovers(loops, mounts, images, places)


def processes_running(*markers: str) -> list[str]:
    """The command lines of processes (of any user this process can see) holding one of the markers: what a
    judged program's run (`harness.py`, `solution.py`) may leave behind."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue  # ended meanwhile
        if any(marker.encode() in line for marker in markers):
            found.append(line.replace(b"\0", b" ").decode(errors="replace"))
    return found


def server_params(root: Path, sandboxes: int) -> StdioServerParameters:
    env = {
        "PATH": os.environ["PATH"],
        "NANBEIGE_SANDBOX_BACKEND": "local",
        "NANBEIGE_SANDBOX_DIR": str(root),
        "NANBEIGE_SANDBOX_TIMEOUT": "120",
        "NANBEIGE_SANDBOX_MAX_SANDBOXES": str(sandboxes),
        "NANBEIGE_SANDBOX_JAIL": str(int(JAIL)),
    }
    if "PYTHONPATH" in os.environ:  # the server imports what its caller does
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return StdioServerParameters(command=sys.executable, args=["-m", "nanbeige.servers.python"], env=env)


# Writes the data, then keeps the worker busy (CPU and open files on its disk) until it is killed.
BUSY_WRITER = """\
import os
with open('/home/user/data.bin', 'wb') as f:
    for _ in range({mb}):
        f.write(os.urandom(1 << 20))
held = open('/home/user/data.bin', 'rb')
"""


async def one_server(
    root: Path, sandboxes: int, mb: int, ready: asyncio.Event, close: asyncio.Event, loaded: list[int]
) -> float:
    """Opens a server with `sandboxes` sandboxes that each wrote `mb` MB and hold a worker busy, then
    closes it when `close` is set. Returns the seconds the SDK's close took."""
    with open(os.devnull, "w") as devnull:
        client = Client(stdio_client(server_params(root, sandboxes), errlog=devnull))
        async with client:
            made = await asyncio.gather(*(client.call_tool("create_sandbox", {}) for _ in range(sandboxes)))
            ids = [m.content[0].text.splitlines()[0].split(": ")[1] for m in made]  # type: ignore[union-attr]
            wrote = await asyncio.gather(
                *(
                    client.call_tool("run_python_code", {"code_block": BUSY_WRITER.format(mb=mb), "sandbox_id": i})
                    for i in ids
                )
            )
            loaded.append(sum(not w.is_error for w in wrote))
            spin = [
                asyncio.ensure_future(
                    client.call_tool("run_python_code", {"code_block": "while True: pass", "sandbox_id": i})
                )
                for i in ids
            ]
            await asyncio.sleep(0.2)  # the cells are running when the client closes
            ready.set()
            await close.wait()
            started = time.monotonic()
        closed = time.monotonic() - started
    await asyncio.gather(*spin, return_exceptions=True)  # each failed when the connection closed
    return closed


async def close_under_load(root: Path, servers: int, sandboxes: int, mb: int) -> tuple[list[float], int, float]:
    """Runs `servers` servers at once over one sandbox root and closes them all together; returns the
    seconds each close took, how many sandboxes wrote their data, and the setup's seconds."""
    ready = [asyncio.Event() for _ in range(servers)]
    close, loaded = asyncio.Event(), []
    started = time.monotonic()
    tasks = [asyncio.ensure_future(one_server(root, sandboxes, mb, r, close, loaded)) for r in ready]
    await asyncio.gather(*(r.wait() for r in ready))
    setup = time.monotonic() - started
    close.set()
    return list(await asyncio.gather(*tasks)), sum(loaded), setup
