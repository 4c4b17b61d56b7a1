"""Benchmark: what the tool-result cache costs per call.

- `lookup` (a hit) and `record` (a write) through `ToolCache`, one at a time and from 64 concurrent callers, each
  going through the cache's own thread as the runs use it;
- the same SQLite statements run directly in that thread, to show what the thread hop adds;
- the event loop's longest stall while writes are in flight;
- `Toolbox.call` served from the cache, next to the same call answered by a real stdio MCP server
  (tests/mcp_test_server.py `echo`) without a cache.

Results are a search result's size (about 4 KB). Run from the repository root:

    python tests/benchmarks/cache.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nanbeige.agent.toolbox.cache import ToolCache, canonical_arguments
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall

SERVER = [sys.executable, "tests/mcp_test_server.py"]
HIT = (
    '{"title": "A page", "link": "https://example.com/page", '
    '"snippet": "Some words about the query, as a search engine gives them."}'
)
TEXT = '{"organic": [' + ", ".join([HIT] * 30) + "]}"


def args(i: int) -> dict[str, object]:
    return {"q": f"query number {i}", "num": 10, "gl": "us"}


async def per_call_us(work, n: int) -> float:
    """Median of 5 rounds of n sequential awaits, in µs per call."""
    rounds = []
    for r in range(5):
        started = time.perf_counter()
        for i in range(n):
            await work(r * n + i)
        rounds.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(rounds)


async def concurrent_us(work, n: int, runs: int = 64) -> float:
    """n calls made by `runs` concurrent callers, each one call at a time (as runs make them), in µs per call."""

    async def caller(first: int) -> None:
        for i in range(first, n, runs):
            await work(i)

    started = time.perf_counter()
    await asyncio.gather(*(caller(first) for first in range(runs)))
    return (time.perf_counter() - started) / n * 1e6


async def longest_stall_ms(work) -> float:
    """The longest the event loop went without running a 1 ms ticker while `work` ran, in ms."""
    gaps, done = [0.0], asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last - 0.001)
            last = now

    ticker = asyncio.create_task(tick())
    await work
    done.set()
    await ticker
    return max(gaps) * 1e3


async def main(calls: int) -> None:
    folder = Path(tempfile.mkdtemp())
    cache = await ToolCache.open(folder / "cache.sqlite")

    write = await per_call_us(lambda i: cache.record("search", "google_search", args(i), TEXT, False), calls)
    hit = await per_call_us(lambda i: cache.lookup("search", "google_search", args(i % (5 * calls))), calls)
    write64 = await concurrent_us(
        lambda i: cache.record("search", "google_search", args(10**6 + i), TEXT, False), calls
    )
    hit64 = await concurrent_us(lambda i: cache.lookup("search", "google_search", args(i)), calls)
    stall = await longest_stall_ms(
        concurrent_us(lambda i: cache.record("search", "google_search", args(3 * 10**6 + i), TEXT, False), calls)
    )
    idle = await longest_stall_ms(asyncio.sleep(0.5))  # the same ticker with nothing else to do, for scale

    def raw(n: int) -> tuple[float, float]:  # in the cache's thread: its connection is used there only
        started = time.perf_counter()
        for i in range(n):
            cache.put("search", "google_search", canonical_arguments(args(2 * 10**6 + i)), TEXT, False, "")
        middle = time.perf_counter()
        for i in range(n):
            cache.get("search", "google_search", canonical_arguments(args(i)))
        return (middle - started) / n * 1e6, (time.perf_counter() - middle) / n * 1e6

    raw_write, raw_hit = await cache._run(raw, calls)

    async with Toolbox([ServerSpec(name="testkit", command=SERVER)]) as live:
        mcp = await per_call_us(lambda i: live.call(ToolCall("testkit", "echo", {"text": TEXT})), calls // 10)
    async with Toolbox([ServerSpec(name="testkit", command=SERVER)], cache=cache) as cached:
        await cached.call(ToolCall("testkit", "echo", {"text": TEXT}))
        served = await per_call_us(lambda i: cached.call(ToolCall("testkit", "echo", {"text": TEXT})), calls)
    await cache.aclose()
    size = (folder / "cache.sqlite").stat().st_size

    print(f"{calls} calls, results of {len(TEXT)} chars; cache file {size / 1e6:.1f} MB")
    print(
        f"cache hit (lookup)          {hit:7.1f} µs   64 callers: {hit64:6.1f} µs/call   SQLite alone {raw_hit:5.1f} µs"
    )
    print(
        f"cache write (record)        {write:7.1f} µs   64 callers: {write64:6.1f} µs/call   SQLite alone "
        f"{raw_write:5.1f} µs"
    )
    print(
        f"while 64 callers wrote {calls} results, the event loop's longest stall: {stall:.2f} ms (idle: {idle:.2f} ms)"
    )
    print(f"Toolbox.call from the cache {served:7.1f} µs   a stdio MCP echo call without cache: {mcp:7.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
