"""Benchmark: many runs at once in one process, over one model client and one toolbox.

For each mode and each N, N runs of T turns (default 100) are started together with
`asyncio.gather`. They share one model client and one toolbox: the client talks to the loopback
FakeOpenAI server (in a child process, so it shares no GIL with us), and the toolbox holds one
long-lived stdio MCP server (tests/mcp_test_server.py) whose `echo` tool the model calls every
turn until it answers at turn T. The fake picks each reply from the request itself (how many
assistant turns it already holds), so interleaved runs each get their own sequence. Each run
writes its trajectory to a file of its own in a temporary folder.

Modes: `chat` is OpenAIChat against a plain OpenAI-compatible server; `token` is TokenModeChat
(prompts rendered and tokenized here, token ids sent to /v1/completions) with the tiny test
model's tokenizer.

Reported per (mode, N):
- answered: runs that answered at turn T with every echo result their own;
- turns/s: all turns of all runs over the wall time of the gather;
- overhead p50/p99: a turn's wall time (from its "model" event to the next, as in overhead.py)
  minus the model's HTTP wait and the tool call's time;
- loop lag p99: how late a task that sleeps 1 ms in a loop wakes up, during the gather;
- CPU ms per turn of this process, the model server's process and the tool server's process.

Run from the repository root:

    python tests/benchmarks/concurrent_runs.py [--runs 1 16 64] [--mode chat token] [--turns 100] [--keep 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from overhead import pct, tokenizer_of, turn_overheads

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
QUESTION = "What does echo say?"
TARGET_TURNS_S = 1000.0  # chat mode, N=64
TARGET_P50_MS = 1.0  # chat mode, N=64
TOKEN_FACTOR = 3.0  # token mode within this factor of chat mode


def serve(turns: int, tokenizer_folder: str | None, conn) -> None:
    """Child process: a FakeOpenAI whose model calls echo until turn `turns` of each run, then answers.
    The turn is read off the request: assistant messages in chat mode, `<|im_start|>` ids in token
    mode (system, user, then an assistant and a user message per turn, then the generation prompt)."""
    tokenizer = tokenizer_of(tokenizer_folder)
    start_id = tokenizer.convert_tokens_to_ids("<|im_start|>") if tokenizer else None

    def reply(request):
        server.requests.clear()  # the fake keeps every request otherwise
        if "messages" in request:
            turn = 1 + sum(1 for m in request["messages"] if m["role"] == "assistant")
        else:
            turn = 1 + (request["prompt"].count(start_id) - 3) // 2
        if turn >= turns:
            return mcp_answer("done")
        return mcp_call("testkit", "echo", {"text": f"probe number {turn}"}, thought=f"Step {turn}: check again.")

    options = (
        {}
        if tokenizer is None
        else {
            "tokenize": lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            "stop_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        }
    )
    with FakeOpenAI(reply, **options) as server:
        conn.send((server.base_url, os.getpid()))
        conn.recv()  # until the parent says stop


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def tick(lags_ms: list[float]) -> None:
    """Sleep 1 ms at a time and record how late each wake-up is."""
    while True:
        due = time.perf_counter() + 0.001
        await asyncio.sleep(0.001)
        lags_ms.append((time.perf_counter() - due) * 1000)


def measured_row(
    mode: str,
    runs: int,
    turns: int,
    trajectories: list,
    marks: list[list[tuple[str, float]]],
    lags_ms: list[float],
    wall: float,
    cpu_before: tuple,
    cpu_after: tuple,
) -> dict:
    """The report's row of one (mode, N): the runs that answered after every probe, the turns per second, the
    overhead per turn, the ticker's lag and the CPU each process spent per turn; the runs that did not answer
    are printed."""
    answered = [
        k
        for k, t in enumerate(trajectories)
        if t.stop_reason == "answered"
        and len(t.turns) == turns
        and [r.text for u in t.turns for r in u.tool_results] == [f"probe number {i}" for i in range(1, turns)]
    ]
    for k, trajectory in enumerate(trajectories):
        if k not in answered:
            print(
                f"  {mode} N={runs} run {k}: {trajectory.stop_reason} after {len(trajectory.turns)} turns "
                f"{trajectory.error or ''}"
            )
    overheads = [ms for k in answered for ms in turn_overheads(trajectories[k], marks[k])]
    done = sum(len(t.turns) for t in trajectories)
    cpu_ms = [(after - before) * 1000 / done for before, after in zip(cpu_before, cpu_after)]
    return {
        "mode": mode,
        "runs": runs,
        "answered": len(answered),
        "turns": done,
        "wall": wall,
        "turns_s": done / wall,
        "p50": statistics.median(overheads),
        "p99": pct(overheads, 0.99),
        "lag_p99": pct(lags_ms, 0.99),
        "cpu_ms": cpu_ms,
        "model_ms": statistics.median(u.latency_s * 1000 for t in trajectories for u in t.turns),
        "tool_ms": statistics.median(r.latency_s * 1000 for t in trajectories for u in t.turns for r in u.tool_results),
    }


async def measure(
    mode: str,
    runs: int,
    turns: int,
    keep: int,
    base_url: str,
    server_pid: int,
    tokenizer_folder: str | None,
    folder: Path,
) -> dict:
    config = LLMConfig(base_url=base_url, model="fake-model")
    if mode == "token":
        from nanbeige.agent.backends.token_mode import TokenModeChat

        llm = TokenModeChat(config, tokenizer_of(tokenizer_folder))
    else:
        llm = OpenAIChat(config)
    marks: list[list[tuple[str, float]]] = [[] for _ in range(runs)]

    def recorder(k: int):
        def on_event(kind: str, data) -> None:
            if kind in ("model", "turn"):
                marks[k].append((kind, time.perf_counter()))

        return on_event

    writers = [TrajectoryWriter(folder / f"{mode}-{runs}-{k}.jsonl") for k in range(runs)]
    # no summary turn: every turn measured is a tool-calling one, comparable across runs
    # results kept in memory: the check below reads every run's results back from its trajectory object
    agent_config = AgentConfig(
        max_turns=turns + 1, max_context=10**9, keep_tool_results=keep, summary_turn=False, release_results=False
    )
    lags_ms: list[float] = []
    async with Toolbox([ServerSpec(name="testkit", command=[sys.executable, SERVER])]) as toolbox:
        tool_pid = int((await toolbox.call(ToolCall("testkit", "pid", {}))).text)
        ticker = asyncio.create_task(tick(lags_ms))
        cpu_before = (time.process_time(), cpu_s(server_pid), cpu_s(tool_pid))
        started = time.perf_counter()
        trajectories = await asyncio.gather(
            *(run(QUESTION, llm, toolbox, agent_config, writers[k], recorder(k)) for k in range(runs))
        )
        wall = time.perf_counter() - started
        cpu_after = (time.process_time(), cpu_s(server_pid), cpu_s(tool_pid))
        ticker.cancel()
    for writer in writers:
        writer.close()
    await llm.aclose()
    return measured_row(mode, runs, turns, trajectories, marks, lags_ms, wall, cpu_before, cpu_after)


def measure_mode(mode: str, counts: list[int], turns: int, keep: int, tmp: Path) -> list[dict]:
    folder = None
    if mode == "token":
        from tiny_model import make_tiny_model

        folder = str(make_tiny_model(tmp / "tiny"))
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=serve, args=(turns, folder, child), daemon=True)
    process.start()
    try:
        base_url, server_pid = parent.recv()
        return [asyncio.run(measure(mode, runs, turns, keep, base_url, server_pid, folder, tmp)) for runs in counts]
    finally:
        parent.send("stop")
        process.join(5)


def report(rows: list[dict], turns: int, keep: int) -> None:
    print(f"{turns} turns per run, keep_tool_results={keep}, every turn calls echo; one client, one toolbox")
    print(
        f"{'mode':<6}{'N':>4}{'answered':>9}{'turns':>7}{'wall s':>8}{'turns/s':>9}{'ovh p50':>9}{'ovh p99':>9}"
        f"{'lag p99':>9}{'model p50':>10}{'echo p50':>9}   CPU ms/turn: ours / model server / tool server"
    )
    for r in rows:
        ours, server, tool = r["cpu_ms"]
        print(
            f"{r['mode']:<6}{r['runs']:>4}{r['answered']:>9}{r['turns']:>7}{r['wall']:>8.2f}{r['turns_s']:>9.0f}"
            f"{r['p50']:>9.3f}{r['p99']:>9.3f}{r['lag_p99']:>9.3f}{r['model_ms']:>10.3f}{r['tool_ms']:>9.3f}"
            f"   {ours:.3f} / {server:.3f} / {tool:.3f}"
        )
    print("(ms unless marked; ovh = runtime overhead per turn; lag = event-loop lag of a 1 ms ticker)")
    rows_by = {(r["mode"], r["runs"]): r for r in rows}
    chat = rows_by.get(("chat", 64))
    if chat:
        print(
            f"target chat N=64: >= {TARGET_TURNS_S:,.0f} turns/s: {chat['turns_s']:.0f} "
            f"{'OK' if chat['turns_s'] >= TARGET_TURNS_S else 'MISSED'}"
        )
        print(
            f"target chat N=64: overhead p50 <= {TARGET_P50_MS:g} ms: {chat['p50']:.3f} "
            f"{'OK' if chat['p50'] <= TARGET_P50_MS else 'MISSED'}"
        )
    for (mode, runs), token in rows_by.items():
        chat = rows_by.get(("chat", runs))
        if mode != "token" or not chat:
            continue
        slower, costlier = chat["turns_s"] / token["turns_s"], token["p50"] / chat["p50"]
        print(
            f"target token N={runs} within {TOKEN_FACTOR:g}x of chat: turns/s {slower:.2f}x lower "
            f"{'OK' if slower <= TOKEN_FACTOR else 'MISSED'}, overhead p50 {costlier:.2f}x higher "
            f"{'OK' if costlier <= TOKEN_FACTOR else 'MISSED'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 16, 64], help="concurrent runs (default 1 16 64)")
    parser.add_argument(
        "--mode",
        nargs="+",
        choices=["chat", "token"],
        default=["chat", "token"],
        help="chat: OpenAIChat on a plain server; token: TokenModeChat (default both)",
    )
    parser.add_argument("--turns", type=int, default=100, help="turns per run (default 100)")
    parser.add_argument(
        "--keep",
        type=int,
        default=AgentConfig.keep_tool_results,
        help="keep_tool_results of every run (default: AgentConfig's; -1 = all)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for mode in args.mode for row in measure_mode(mode, args.runs, args.turns, args.keep, Path(tmp))]
    report(rows, args.turns, args.keep)


if __name__ == "__main__":
    main()
