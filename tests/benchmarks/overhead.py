"""Benchmark: the agent runtime's own overhead per turn, from turn 1 to turn N.

One `run` of N turns: the real OpenAIChat client talks to the loopback FakeOpenAI server (a plain
OpenAI-compatible server; with --vllm it also returns vLLM's token fields, so token ids are
tracked), the model calls the `echo` tool of a real long-lived
stdio MCP server (tests/mcp_test_server.py) every turn and answers at turn N, and every turn is
written to a trajectory file on disk. A turn's wall time runs from its "model" event to the next
one (to its "turn" event for the last turn); its overhead is that minus the model's HTTP wait
(`turn.latency_s`) and the tool calls' time (`tool_result.latency_s`).

The fake server runs in a child process, so neither its memory nor its request handling (it
shares no GIL with us) counts against the runtime.

Run from the repository root:

    python tests/benchmarks/overhead.py [--turns 600] [--keep 5] [--vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI, mcp_answer, mcp_call  # noqa: E402

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat  # noqa: E402
from nanbeige.agent.run.loop import AgentConfig, run  # noqa: E402
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox  # noqa: E402
from nanbeige.agent.trajectory.trajectory import Trajectory  # noqa: E402
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter  # noqa: E402

SERVER = "tests/mcp_test_server.py"
TARGET_MS = 2.0


def turn_overheads(trajectory: Trajectory, marks: list[tuple[str, float]]) -> list[float]:
    """Per turn: wall time from its "model" event to the next (its "turn" event for the last turn),
    minus the model's HTTP wait and the tool calls' time, in ms."""
    starts = [t for kind, t in marks if kind == "model"]
    logged = [t for kind, t in marks if kind == "turn"]
    overheads = []
    for i, turn in enumerate(trajectory.turns):
        end = starts[i + 1] if i + 1 < len(starts) else logged[i]
        tool_s = sum(r.latency_s for r in turn.tool_results)
        overheads.append((end - starts[i] - turn.latency_s - tool_s) * 1000)
    return overheads


def tokenizer_of(folder: str | None):
    """The tiny test model's real tokenizer, for --token-mode (None otherwise)."""
    if folder is None:
        return None
    from nanbeige.agent.backends.token_mode import load_tokenizer

    return load_tokenizer(folder)[0]


def serve(turns: int, vllm: bool, tokenizer_folder: str | None, conn) -> None:
    """Child process: a FakeOpenAI whose model calls echo until turn `turns`, then answers."""
    count = iter(range(1, 10**9))

    def reply(request):
        server.requests.clear()  # the fake keeps every request otherwise: O(turns^2) memory
        turn = next(count)  # one request per turn (token-mode requests carry ids, not messages)
        if turn >= turns:
            return mcp_answer("done")
        return mcp_call("testkit", "echo", {"text": f"probe number {turn}"}, thought=f"Step {turn}: check again.")

    tokenizer = tokenizer_of(tokenizer_folder)
    options = (
        {}
        if tokenizer is None
        else {
            "tokenize": lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            "stop_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        }
    )
    with FakeOpenAI(reply, vllm=vllm, **options) as server:
        conn.send(server.base_url)
        conn.recv()  # until the parent says stop


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(
    base_url: str, turns: int, keep: int, path: Path, tokenizer_folder: str | None = None
) -> tuple[list[float], dict]:
    marks: list[tuple[str, float]] = []
    steady: dict[str, int] = {}  # RSS and file size once the run has warmed up (turn 100)

    def on_event(kind: str, data) -> None:
        if kind in ("model", "turn"):
            marks.append((kind, time.perf_counter()))
        if kind == "turn" and data.index == min(99, turns // 6):
            steady.update(rss=rss_kib(), file=path.stat().st_size, turn=data.index + 1)

    config = LLMConfig(base_url=base_url, model="fake-model")
    if tokenizer_folder:
        from nanbeige.agent.backends.token_mode import TokenModeChat

        llm = TokenModeChat(config, tokenizer_of(tokenizer_folder))
    else:
        llm = OpenAIChat(config)
    writer = TrajectoryWriter(path)
    spec = ServerSpec(name="testkit", command=[sys.executable, SERVER])
    # no summary turn: every turn measured is a tool-calling one, comparable across runs
    config = AgentConfig(max_turns=turns + 1, max_context=10**9, keep_tool_results=keep, summary_turn=False)
    async with Toolbox([spec]) as toolbox:
        rss_before, hwm_before, maxrss_before = (
            rss_kib(),
            rss_kib("VmHWM"),
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        )
        started = time.perf_counter()
        trajectory = await run("What does echo say?", llm, toolbox, config, writer, on_event)
        wall = time.perf_counter() - started
        memory = {
            "rss": rss_kib() - rss_before,
            "steady_rss": rss_kib() - steady["rss"],
            "steady_file": path.stat().st_size - steady["file"],
            "steady_turn": steady["turn"],
            "hwm": rss_kib("VmHWM") - hwm_before,
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before,
        }
    writer.close()
    await llm.aclose()
    assert trajectory.stop_reason == "answered" and len(trajectory.turns) == turns, (
        f"run ended with {trajectory.stop_reason} after {len(trajectory.turns)} turns: {trajectory.error}"
    )
    overhead = turn_overheads(trajectory, marks)
    extra = {
        "wall": wall,
        "memory": memory,
        "file": path.stat().st_size,
        "model_ms": statistics.median(t.latency_s * 1000 for t in trajectory.turns),
        "tool_ms": statistics.median(r.latency_s * 1000 for t in trajectory.turns for r in t.tool_results),
        "segments": len({t.segment for t in trajectory.turns if t.segment is not None}),
    }
    return overhead, extra


def report(overhead: list[float], extra: dict, block: int = 100) -> None:
    print(f"{'turns':>10} {'median ms':>10} {'p95 ms':>8}   (target: median <= {TARGET_MS:g} ms/turn, flat)")
    for start in range(0, len(overhead), block):
        part = overhead[start : start + block]
        print(f"{start + 1:>4}-{start + len(part):<5} {statistics.median(part):>10.3f} {pct(part, 0.95):>8.3f}")
    median = statistics.median(overhead)
    print(f"{'overall':>10} {median:>10.3f} {pct(overhead, 0.95):>8.3f}   {'OK' if median <= TARGET_MS else 'MISSED'}")
    k = min(block, len(overhead))
    first, last = statistics.median(overhead[:k]), statistics.median(overhead[-k:])
    print(f"median of last {k} / first {k} turns: {last / first:.2f}   (target ~1.0: flat)")
    print(
        f"median model HTTP wait {extra['model_ms']:.3f} ms, median echo call {extra['tool_ms']:.3f} ms, "
        f"token segments {extra['segments']}"
    )
    memory, size_kib = extra["memory"], extra["file"] / 1024
    print(f"trajectory file: {size_kib:,.0f} KiB")
    print(
        f"RSS growth: VmRSS {memory['rss']:,} KiB, peak VmHWM {memory['hwm']:,} KiB, ru_maxrss "
        f"{memory['maxrss']:,} KiB   (target: bounded by the trajectory size; peak/file = "
        f"{memory['hwm'] / max(size_kib, 1):.2f})"
    )
    ratio = memory["steady_rss"] * 1024 / max(memory["steady_file"], 1)
    print(
        f"after turn {memory['steady_turn']}: RSS grew {memory['steady_rss']:,} KiB while the trajectory grew "
        f"{memory['steady_file'] / 1024:,.0f} KiB (ratio {ratio:.2f})"
    )
    print(f"total wall time of the run: {extra['wall']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=600, help="turns in the run (default 600)")
    parser.add_argument(
        "--keep",
        type=int,
        default=AgentConfig.keep_tool_results,
        help="keep_tool_results of the run (default: AgentConfig's; -1 = all)",
    )
    parser.add_argument("--vllm", action="store_true", help="the server returns vLLM's token ids and logprobs")
    parser.add_argument(
        "--token-mode",
        action="store_true",
        help="token-exact mode (/v1/completions with token ids), with a tiny model's real tokenizer",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = None
        if args.token_mode:
            from tiny_model import make_tiny_model

            folder = str(make_tiny_model(Path(tmp) / "tiny"))
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.Process(target=serve, args=(args.turns, args.vllm, folder, child), daemon=True)
        process.start()
        try:
            base_url = parent.recv()
            overhead, extra = asyncio.run(measure(base_url, args.turns, args.keep, Path(tmp) / "run.jsonl", folder))
        finally:
            parent.send("stop")
            process.join(5)
    mode = (
        "token mode (tiny model's tokenizer)"
        if args.token_mode
        else "vLLM token fields"
        if args.vllm
        else "plain OpenAI server"
    )
    print(f"runtime overhead per turn, {args.turns} turns, keep_tool_results={args.keep}, {mode}")
    report(overhead, extra)


if __name__ == "__main__":
    main()
