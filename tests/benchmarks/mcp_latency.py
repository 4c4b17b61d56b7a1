"""Benchmark: latency of one MCP `echo` call, long-lived stdio session versus a fresh server per call.

- long-lived: nanbeige's Toolbox starts tests/mcp_test_server.py once and keeps the stdio session;
  each timed call is `Toolbox.call` (one warm-up call is not timed).
- fresh per call (the reference harness's design): every timed call opens
  `mcp.Client(mcp.stdio_client(StdioServerParameters(...)))`, lists the tools, calls `echo` and
  closes, so it pays for a Python process start and the MCP handshake each time.

Run from the repository root:

    python tests/benchmarks/mcp_latency.py [--calls 200] [--fresh-calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from mcp import Client, StdioServerParameters, stdio_client

from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall

SERVER = "tests/mcp_test_server.py"
TARGET_SPEEDUP = 50.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def long_lived(calls: int) -> list[float]:
    """Milliseconds per call over one Toolbox session."""
    times = []
    async with Toolbox([ServerSpec(name="testkit", command=[sys.executable, SERVER])]) as toolbox:
        await toolbox.call(ToolCall("testkit", "echo", {"text": "warm-up"}))
        for i in range(calls):
            text = f"ping {i}"
            started = time.perf_counter()
            result = await toolbox.call(ToolCall("testkit", "echo", {"text": text}))
            times.append((time.perf_counter() - started) * 1000)
            assert result.text == text and not result.is_error, result
    return times


async def fresh_per_call(calls: int) -> list[float]:
    """Milliseconds per call when every call starts, initialises and closes its own server."""
    times = []
    params = StdioServerParameters(command=sys.executable, args=[SERVER])
    with open(os.devnull, "w") as devnull:
        for i in range(calls):
            text = f"ping {i}"
            started = time.perf_counter()
            async with Client(stdio_client(params, errlog=devnull)) as client:
                await client.list_tools()
                result = await client.call_tool("echo", {"text": text})
            times.append((time.perf_counter() - started) * 1000)
            assert result.content[0].text == text and not result.is_error, result
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="timed calls over the long-lived session")
    parser.add_argument("--fresh-calls", type=int, default=20, help="timed calls with a fresh server each")
    args = parser.parse_args()
    warm = asyncio.run(long_lived(args.calls))
    fresh = asyncio.run(fresh_per_call(args.fresh_calls))
    print(f"MCP echo call latency (ms), stdio server {SERVER}")
    print(f"{'':24} {'calls':>6} {'p50':>9} {'p95':>9}")
    print(f"{'long-lived session':24} {len(warm):>6} {pct(warm, 0.5):>9.3f} {pct(warm, 0.95):>9.3f}")
    print(f"{'fresh server per call':24} {len(fresh):>6} {pct(fresh, 0.5):>9.3f} {pct(fresh, 0.95):>9.3f}")
    speedup = pct(fresh, 0.5) / pct(warm, 0.5)
    print(
        f"speed-up (p50 fresh / p50 long-lived): {speedup:.1f}x   (target >= {TARGET_SPEEDUP:g}x: "
        f"{'OK' if speedup >= TARGET_SPEEDUP else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
