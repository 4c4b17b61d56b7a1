"""Benchmark: overhead of one local-sandbox call, through `Sandboxes` and through MCP.

- create: `Sandboxes.create()` (place, uid, cgroup, file system of its own; the worker starts at
  the first call). The targets: at most 150 ms.
- warm python: one sandbox whose Python worker is already running; each timed call is
  `run_python("print(1)", id)` (a JSON line to the worker and back, plus the sweep for
  processes left behind).
- warm command: `run_command("true", id)` in the same sandbox (a new process chain per call:
  unshare, setpriv where used, the worker's limits, /bin/sh).
- MCP warm python: `run_python_code` with `print(1)` through the real `tool-python` server over
  stdio (the official MCP client), in a sandbox whose worker runs. The target: at most 5 ms.

The isolation line says whether the sandboxes were jailed (bwrap), and which budgets the kernel holds.

Run from the repository root:

    python tests/benchmarks/sandbox.py [--calls 200] [--creates 30] [--no-jail]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mcp import Client, StdioServerParameters, stdio_client

from nanbeige.tools.sandbox import SandboxConfig, Sandboxes

EXPECTED = "Execution(Results: [], Logs: Logs(stdout: ['1\\n'], stderr: []), Error: None)"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(call: Callable[[], str], expected: str, n: int) -> list[float]:
    """Milliseconds per call."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000)
        assert result.startswith(expected), result
    return times


def created(sandboxes: Sandboxes, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        sandboxes.create()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def through_mcp(root: Path, calls: int, jail: bool) -> list[float]:
    """Milliseconds per `run_python_code("print(1)")` over one stdio session with the server."""
    env = {
        **os.environ,
        "NANBEIGE_SANDBOX_DIR": str(root),
        "NANBEIGE_SANDBOX_BACKEND": "local",
        "NANBEIGE_SANDBOX_JAIL": str(int(jail)),
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "nanbeige.servers.python"], env=env)
    with open(os.devnull, "w") as devnull:
        async with Client(stdio_client(params, errlog=devnull)) as client:
            made = await client.call_tool("create_sandbox", {})
            sandbox_id = made.content[0].text.splitlines()[0].split(": ")[1]  # type: ignore[union-attr]
            arguments = {"code_block": "print(1)", "sandbox_id": sandbox_id}
            await client.call_tool("run_python_code", arguments)  # starts the worker; not timed
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                result = await client.call_tool("run_python_code", arguments)
                times.append((time.perf_counter() - started) * 1000)
                assert result.content[0].text.startswith(EXPECTED), result  # type: ignore[union-attr]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--creates", type=int, default=30)
    parser.add_argument("--no-jail", action="store_true", help="the fallback without bwrap, for comparison")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        sandboxes = Sandboxes(SandboxConfig(root=Path(root) / "sandboxes", jail=not args.no_jail))
        try:
            sandbox_id = sandboxes.create().splitlines()[0].split(": ")[1]
            sandboxes.run_python("print(1)", sandbox_id)  # starts the worker; not timed
            backend = sandboxes.backend
            print(f"isolation: {backend.isolation}")
            print(
                f"jail: {backend.isolation.jail is not None}, cgroup: {backend._cgroups is not None}, "
                f"own file system: {backend._disks}"
            )
            rows = [
                ("create", created(sandboxes, min(args.creates, sandboxes.config.max_sandboxes - 1))),
                (
                    "warm python print(1)",
                    timed(lambda: sandboxes.run_python("print(1)", sandbox_id), EXPECTED, args.calls),
                ),
                (
                    "warm command true",
                    timed(lambda: sandboxes.run_command("true", sandbox_id), "CommandResult(", args.calls // 4),
                ),
            ]
        finally:
            sandboxes.close()
        mcp_times = asyncio.run(through_mcp(Path(root) / "mcp", args.calls, not args.no_jail))
        rows.append(("MCP warm python print(1)", mcp_times))
    for name, times in rows:
        print(f"{name:28s} n={len(times):4d}  p50 {pct(times, 0.5):7.2f} ms  p95 {pct(times, 0.95):7.2f} ms")


if __name__ == "__main__":
    main()
