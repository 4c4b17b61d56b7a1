"""Benchmark: `nanbeige eval`'s machinery with an instant model and a loopback tool server.

For each concurrency C, an eval of max(16, 2C) GAIA-format tasks (our own, k=1) runs through
`evals.runner.evaluate`: the setup layer, C runs at once over one model client and one toolbox,
grading with the GAIA scorer, results and trajectories written to an out folder. The model is the
loopback FakeOpenAI (in a child process, so it shares no GIL with us); it calls the testkit MCP
server's `echo` tool for T turns (default 20), then answers, and the summary turn answers again.

Reported per C: tasks/min, turns/s (all model turns over the eval's wall time), and the runtime
overhead per turn: each run's wall time minus its model and tool time, summed over runs and
divided by their turns (an upper bound: it includes waiting for the event loop behind other runs).

    python tests/benchmarks/eval_throughput.py [--concurrency 1 16 64] [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI, mcp_answer, mcp_call

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.benchmarks import BENCHMARKS
from nanbeige.evals.runner import EvalConfig, evaluate

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
TARGET_TURNS_S = 500.0


def serve(turns: int, conn) -> None:
    """Child process: the model echoes until turn `turns` of each run, then answers `done`."""

    def reply(request):
        server.requests.clear()
        turn = 1 + sum(1 for m in request["messages"] if m["role"] == "assistant")
        if turn >= turns:
            return mcp_answer("done")
        return mcp_call("testkit", "echo", {"text": f"probe number {turn}"}, thought=f"Step {turn}.")

    with FakeOpenAI(reply) as server:
        conn.send((server.base_url, os.getpid()))
        conn.recv()


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_tasks(path: Path, count: int) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": f"b{i}",
                    "Question": f"Benchmark question {i}?",
                    "Level": 1,
                    "Final answer": "done",
                    "file_name": "",
                }
            )
            + "\n"
            for i in range(count)
        )
    )
    return path


async def measure(base_url: str, concurrency: int, turns: int, folder: Path) -> dict:
    count = max(16, 2 * concurrency)
    data = write_tasks(folder / f"tasks-{concurrency}.jsonl", count)
    out = folder / f"out-{concurrency}"
    settings = RunSettings(
        llm=LLMConfig(base_url=base_url, model="fake"),
        agent=AgentConfig(max_turns=turns + 1, max_context=10**9),
        tools=ToolsConfig(mcp=[f"testkit={sys.executable} {SERVER}"], default_servers=False),
    )
    config = EvalConfig(
        bench=BENCHMARKS["gaia"], data=data, out=out, k=1, concurrency=concurrency, grader="gaia-exact"
    )  # GAIA's own scorer: no judge to call
    started = time.perf_counter()
    report = await evaluate(config, settings, notice=lambda text: None)
    wall = time.perf_counter() - started
    trajectories = load_trajectories(out / "trajectories.jsonl")
    model_turns = sum(len(t.turns) for t in trajectories)
    overhead = sum(t.timings["wall_s"] - t.timings["model_s"] - t.timings["tool_s"] for t in trajectories)
    return {
        "concurrency": concurrency,
        "tasks": count,
        "correct": report["avg_at_k"],
        "wall": wall,
        "tasks_min": 60 * count / wall,
        "turns": model_turns,
        "turns_s": model_turns / wall,
        "overhead_ms": 1000 * overhead / model_turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--turns", type=int, default=20, help="model turns per run before it answers (default 20)")
    args = parser.parse_args()
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=serve, args=(args.turns, child), daemon=True)
    process.start()
    rows = []
    try:
        base_url, server_pid = parent.recv()
        with tempfile.TemporaryDirectory() as tmp:
            for concurrency in args.concurrency:
                before = (time.process_time(), cpu_s(server_pid))
                row = asyncio.run(measure(base_url, concurrency, args.turns, Path(tmp)))
                after = (time.process_time(), cpu_s(server_pid))
                row["cpu_ms"] = [1000 * (a - b) / row["turns"] for a, b in zip(after, before)]
                rows.append(row)
    finally:
        parent.send("stop")
        process.join(5)
    print(f"eval of GAIA-format tasks, k=1, {args.turns} echo turns + a summary turn per run; {os.cpu_count()} CPUs")
    print(
        f"{'conc':>5}{'tasks':>7}{'avg@1':>8}{'wall s':>8}{'tasks/min':>11}{'turns':>7}{'turns/s':>9}"
        f"{'overhead ms/turn':>18}   CPU ms/turn: ours / model server"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5}{r['tasks']:>7}{r['correct']:>8.1f}{r['wall']:>8.2f}{r['tasks_min']:>11.0f}"
            f"{r['turns']:>7}{r['turns_s']:>9.0f}{r['overhead_ms']:>18.3f}   "
            f"{r['cpu_ms'][0]:.3f} / {r['cpu_ms'][1]:.3f}"
        )
    best = max(rows, key=lambda r: r["turns_s"])
    print(
        f"target >= {TARGET_TURNS_S:.0f} turns/s aggregate: {best['turns_s']:.0f} at concurrency "
        f"{best['concurrency']} {'OK' if best['turns_s'] >= TARGET_TURNS_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
