"""Benchmark: what streaming the model's reply costs the runtime per turn, side by side with the same
run not streamed.

Each mode is one `run` of N turns against the loopback FakeOpenAI server in a child process (so its
work is not ours): the model calls a real stdio MCP server's `echo` every turn and answers at turn N,
every turn written to a trajectory file, the `text` events handed to a collector as the live view takes
them. The fake sends a streamed reply one character per chunk (real vLLM sends about a token, some
four characters, per chunk), so the streamed runs here parse about four times the chunks a real reply
of the same length would bring.

Per turn: the overhead (wall time from one "model" event to the next, less the model's HTTP wait and
the tool call, as in overhead.py: for a streamed turn the wait ends when the stream has been read, so
reading the stream counts as waiting there), and this process's CPU time (everything it did for the
turn, reading the stream included: the number to compare). Modes alternate, several rounds each.

    python tests/benchmarks/streaming.py [--turns 200] [--rounds 3] [--vllm]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import serve, turn_overheads  # noqa: E402

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat  # noqa: E402
from nanbeige.agent.run.loop import AgentConfig, run  # noqa: E402
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox  # noqa: E402
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter  # noqa: E402

SERVER = "tests/mcp_test_server.py"
TARGET = 1.05  # streamed CPU per turn within 5% of not streamed


async def one_run(base_url: str, turns: int, stream: bool, path: Path) -> dict[str, float]:
    marks: list[tuple[str, float]] = []
    pieces: list[str] = []

    def on_event(kind: str, data: object) -> None:
        if kind == "text":
            pieces.append(data)  # type: ignore[arg-type]
        elif kind in ("model", "turn"):
            marks.append((kind, time.perf_counter()))

    llm = OpenAIChat(LLMConfig(base_url=base_url, model="fake-model"))
    writer = TrajectoryWriter(path)
    config = AgentConfig(max_turns=turns + 1, max_context=10**9, summary_turn=False, stream=stream)
    async with Toolbox([ServerSpec(name="testkit", command=[sys.executable, SERVER])]) as toolbox:
        cpu = time.process_time()
        trajectory = await run("What does echo say?", llm, toolbox, config, writer, on_event)
        cpu = time.process_time() - cpu
    writer.close()
    await llm.aclose()
    assert trajectory.stop_reason == "answered" and len(trajectory.turns) == turns, trajectory.error
    assert bool(pieces) == stream
    overhead = turn_overheads(trajectory, marks)
    return {
        "overhead_ms": statistics.median(overhead),
        "cpu_ms": cpu / turns * 1000,
        "model_ms": statistics.median(t.latency_s * 1000 for t in trajectory.turns),
        "pieces": len(pieces) / turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="the server also sends vLLM's token ids and logprobs")
    args = parser.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_number in range(args.rounds):
            for stream in (False, True):
                parent, child = multiprocessing.Pipe()
                server = multiprocessing.Process(target=serve, args=(args.turns, args.vllm, None, child), daemon=True)
                server.start()
                try:
                    base_url = parent.recv()
                    path = Path(tmp) / f"run-{round_number}-{stream}.jsonl"
                    results[stream].append(asyncio.run(one_run(base_url, args.turns, stream, path)))
                finally:
                    parent.send("stop")
                    server.join(5)
    mode = "vLLM token fields" if args.vllm else "plain OpenAI server"
    print(f"streaming vs not, {args.turns} turns x {args.rounds} rounds each, {mode}; medians over rounds")
    print(f"{'':>14} {'overhead ms/turn':>17} {'CPU ms/turn':>12} {'model wait ms':>14} {'pieces/turn':>12}")
    summary = {}
    for stream in (False, True):
        rows = results[stream]
        summary[stream] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        s = summary[stream]
        print(
            f"{'streamed' if stream else 'not streamed':>14} {s['overhead_ms']:>17.3f} {s['cpu_ms']:>12.3f} "
            f"{s['model_ms']:>14.3f} {s['pieces']:>12.0f}"
        )
    ratio = summary[True]["cpu_ms"] / summary[False]["cpu_ms"]
    verdict = "OK" if ratio <= TARGET else "MISSED"
    print(f"CPU per turn, streamed / not: {ratio:.3f}   (target <= {TARGET:.2f}: {verdict})")


if __name__ == "__main__":
    main()
