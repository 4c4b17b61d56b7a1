"""Benchmark: a long research run with large tool results, from turn 1 to turn N.

One `run` of N turns (600 by default, the research limit): the real OpenAIChat client talks to the
loopback FakeOpenAI server (in a child process, answering at once with a tool call every turn), the
model calls the `big` tool of a real long-lived stdio MCP server (tests/mcp_test_server.py) for a
100 kB result every turn, keep-5, and every turn is written to a trajectory file on disk.

It prints the runtime's own overhead per turn (a turn's wall time minus the model's HTTP wait and
the tool call's time; see overhead.py) for turns 1-100 and the last 100, resident memory (RSS) at
turns 10, 100 and N, the trajectory file's bytes per turn, and the largest prompt sent against the
context budget (the fake server counts one token per byte).

Run from the repository root:

    python tests/benchmarks/research_run.py [--turns 600] [--result-bytes 100000] [--keep 5] [--keep-results]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai
sys.path.insert(0, str(Path(__file__).resolve().parent))  # overhead.py's measures

from fake_openai import FakeOpenAI, mcp_answer, mcp_call  # noqa: E402
from overhead import pct, rss_kib, turn_overheads  # noqa: E402

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat  # noqa: E402
from nanbeige.agent.run.loop import AgentConfig, run  # noqa: E402
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox  # noqa: E402
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter  # noqa: E402

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
TARGET_MS = 1.0
CONTEXT = 1_000_000  # tokens (bytes, for the fake server): keep-5 of 100 kB results fits, keep-all does not
RSS_AT = (10, 100)


def serve(turns: int, result_bytes: int, conn) -> None:
    """Child process: a FakeOpenAI whose model calls `big` until turn `turns`, then answers, and
    reports the largest prompt it was sent."""
    count = iter(range(1, 10**9))
    largest = [0]

    def reply(request):
        server.requests.clear()  # the fake keeps every request otherwise
        largest[0] = max(largest[0], sum(len(m.get("content") or "") for m in request["messages"]))
        turn = next(count)
        if turn >= turns:
            return mcp_answer("done")
        return mcp_call("testkit", "big", {"n": result_bytes}, thought=f"Step {turn}: read more.")

    with FakeOpenAI(reply) as server:
        conn.send(server.base_url)
        conn.recv()  # until the parent says stop
        conn.send(largest[0])


async def measure(base_url: str, turns: int, keep: int, result_bytes: int, path: Path, release: bool) -> dict:
    marks: list[tuple[str, float]] = []
    rss: dict[int, int] = {}
    sizes: dict[int, int] = {}

    def on_event(kind: str, data) -> None:
        if kind in ("model", "turn"):
            marks.append((kind, time.perf_counter()))
        if kind == "turn" and data.index + 1 in RSS_AT:
            rss[data.index + 1], sizes[data.index + 1] = rss_kib(), path.stat().st_size

    llm = OpenAIChat(LLMConfig(base_url=base_url, model="fake-model"))
    writer = TrajectoryWriter(path)
    config = AgentConfig(
        max_turns=turns + 1, max_context=CONTEXT, keep_tool_results=keep, summary_turn=False, release_results=release
    )
    async with Toolbox(
        [ServerSpec(name="testkit", command=[sys.executable, SERVER])], max_result_chars=result_bytes
    ) as toolbox:
        rss["start"] = rss_kib()
        started = time.perf_counter()
        trajectory = await run("Research this.", llm, toolbox, config, writer, on_event)
        wall = time.perf_counter() - started
        rss[turns], sizes[turns] = rss_kib(), path.stat().st_size
    writer.close()
    await llm.aclose()
    assert trajectory.stop_reason == "answered" and len(trajectory.turns) == turns, (
        f"run ended with {trajectory.stop_reason} after {len(trajectory.turns)} turns: {trajectory.error}"
    )
    kept = [len(r.text) == result_bytes for t in trajectory.turns for r in t.tool_results]
    assert all(kept) if not release else sum(kept) == keep
    return {
        "overhead": turn_overheads(trajectory, marks),
        "rss": rss,
        "sizes": sizes,
        "wall": wall,
        "model_ms": statistics.median(t.latency_s * 1000 for t in trajectory.turns),
        "tool_ms": statistics.median(r.latency_s * 1000 for t in trajectory.turns for r in t.tool_results),
    }


def report(result: dict, turns: int, largest_prompt: int) -> None:
    overhead = result["overhead"]
    print(f"{'turns':>10} {'median ms':>10} {'p95 ms':>8}   (target: median <= {TARGET_MS:g} ms/turn, flat)")
    for start, end in ((0, min(100, turns)), (max(0, turns - 100), turns)):
        part = overhead[start:end]
        print(f"{start + 1:>4}-{end:<5} {statistics.median(part):>10.3f} {pct(part, 0.95):>8.3f}")
    print(f"{'all':>10} {statistics.median(overhead):>10.3f} {pct(overhead, 0.95):>8.3f}")
    print(
        f"median model HTTP wait {result['model_ms']:.2f} ms, median tool call {result['tool_ms']:.2f} ms, "
        f"run wall time {result['wall']:.1f} s"
    )
    rss, sizes = result["rss"], result["sizes"]
    print(
        "RSS: "
        + ", ".join(f"turn {t} {rss[t] / 1024:,.1f} MiB" for t in (*RSS_AT, turns) if t in rss)
        + f" (before the run {rss['start'] / 1024:,.1f} MiB)"
    )
    if 100 in rss:
        grew = (rss[turns] - rss[100]) / 1024
        print(f"RSS growth turn 100 -> {turns}: {grew:,.1f} MiB ({grew * 1024 / (turns - 100):,.1f} KiB/turn)")
    print(f"trajectory log: {sizes[turns] / 1024 / 1024:,.1f} MiB, {sizes[turns] / turns / 1024:,.1f} KiB/turn")
    print(f"largest prompt sent: {largest_prompt / 1000:,.0f} k tokens (budget {CONTEXT / 1000:,.0f} k)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=600, help="turns in the run (default 600)")
    parser.add_argument("--result-bytes", type=int, default=100_000, help="size of every tool result (100 kB)")
    parser.add_argument(
        "--keep",
        type=int,
        default=AgentConfig.keep_tool_results,
        help="keep_tool_results of the run (default: AgentConfig's)",
    )
    parser.add_argument(
        "--keep-results",
        action="store_true",
        help="release_results off: every result stays in memory (by default results out of the "
        "model's view are dropped from memory once written)",
    )
    args = parser.parse_args()
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=serve, args=(args.turns, args.result_bytes, child), daemon=True)
    process.start()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            base_url = parent.recv()
            result = asyncio.run(
                measure(
                    base_url, args.turns, args.keep, args.result_bytes, Path(tmp) / "run.jsonl", not args.keep_results
                )
            )
        finally:
            parent.send("stop")
            largest = parent.recv() if parent.poll(10) else 0
            process.join(5)
    print(
        f"research run: {args.turns} turns, a {args.result_bytes:,}-byte tool result each, "
        f"keep_tool_results={args.keep}, release_results={not args.keep_results}"
    )
    report(result, args.turns, largest)


if __name__ == "__main__":
    main()
