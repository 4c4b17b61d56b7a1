"""Benchmark: `nanbeige collect` in token mode against an instant loopback vLLM-like server.

G rollouts (default 8) of Q questions (default 16) go through `trainer.collect.collect`: the setup
layer, token mode (prompts rendered and tokenized here with the tiny test model's tokenizer, token
ids sent to /v1/completions), C rollouts at once (default 64), one stdio MCP server whose `echo` the
model calls every turn until it answers at turn T (default 20), each rollout written whole to the
out file. The fake server runs in a child process, so it shares no GIL with us.

Reported: rollouts per minute, turns/s over the whole collection, and CPU ms per turn of this
process and of the fake server.

    python tests/benchmarks/collect_throughput.py [--group-size 8] [--questions 16] [--concurrency 64] [--turns 20]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai and tiny_model

from fake_openai import FakeOpenAI, mcp_answer, mcp_call

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.collect import CollectConfig, collect

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
TARGET_TURNS_S = 500.0


def serve(turns: int, tokenizer_folder: str, conn) -> None:
    """Child process: a vLLM-like fake whose model echoes until turn `turns`, then answers. The turn is
    read off the prompt ids: system, user, then an assistant and a user message per turn."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    start_id = tokenizer.convert_tokens_to_ids("<|im_start|>")

    def reply(request):
        server.requests.clear()
        turn = 1 + (request["prompt"].count(start_id) - 3) // 2
        if turn >= turns:
            return mcp_answer("done")
        return mcp_call("testkit", "echo", {"text": f"probe number {turn}"}, thought=f"Step {turn}.")

    with FakeOpenAI(
        reply,
        vllm=True,
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        max_model_len=10**6,
    ) as server:
        conn.send((server.base_url, os.getpid()))
        conn.recv()


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(base_url: str, tiny: Path, args: argparse.Namespace, folder: Path) -> dict:
    questions = folder / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"Question {i}?", "answer": "done"}) + "\n"
            for i in range(args.questions)
        )
    )
    settings = RunSettings(
        llm=LLMConfig(base_url=base_url, model=str(tiny)),
        agent=AgentConfig(max_turns=args.turns + 1, max_context=10**6, summary_turn=False),
        backend=BackendConfig(backend="openai", base_url_given=True, token_mode=True),
        tools=ToolsConfig(mcp=[f"testkit={sys.executable} {SERVER}"], default_servers=False),
    )
    config = CollectConfig(
        out=folder / "rollouts.jsonl", questions=questions, group_size=args.group_size, concurrency=args.concurrency
    )
    started = time.perf_counter()
    summary = await collect(config, settings, notice=lambda text: None)
    wall = time.perf_counter() - started
    trajectories = load_trajectories(config.out)
    turns = sum(len(t.turns) for t in trajectories)
    # the rollouts alone, without the setup (importing transformers, loading the tokenizer, the MCP server)
    sampling = max(t.started_at + t.timings["wall_s"] for t in trajectories) - min(t.started_at for t in trajectories)
    return {
        "rollouts": summary["rollouts"],
        "wall": wall,
        "sampling": sampling,
        "turns": turns,
        "pass_rate": summary["pass_rate"],
        "exact": all(u.completion_ids is not None for t in trajectories for u in t.turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20, help="model turns per rollout (default 20)")
    args = parser.parse_args()
    from tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_tiny_model(Path(tmp) / "tiny")
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.Process(target=serve, args=(args.turns, str(tiny), child), daemon=True)
        process.start()
        try:
            base_url, server_pid = parent.recv()
            before = (time.process_time(), cpu_s(server_pid))
            row = asyncio.run(measure(base_url, tiny, args, Path(tmp)))
            after = (time.process_time(), cpu_s(server_pid))
        finally:
            parent.send("stop")
            process.join(5)
    ours, server = (1000 * (a - b) / row["turns"] for a, b in zip(after, before))
    print(
        f"collect: G={args.group_size} x {args.questions} questions, {args.concurrency} at once, token mode, "
        f"{args.turns} turns a rollout (echo every turn); {os.cpu_count()} CPUs"
    )
    print(f"rollouts {row['rollouts']}, all token-exact: {row['exact']}, pass rate {row['pass_rate']}")
    print(
        f"wall {row['wall']:.2f} s, {60 * row['rollouts'] / row['wall']:.0f} rollouts/min, "
        f"{row['turns'] / row['wall']:.0f} turns/s; CPU ms per turn: this process {ours:.2f}, model server "
        f"{server:.2f}"
    )
    turns_s = row["turns"] / row["sampling"]
    print(
        f"sampling alone (setup left out): {row['sampling']:.2f} s, {60 * row['rollouts'] / row['sampling']:.0f} "
        f"rollouts/min, {turns_s:.0f} turns/s"
    )
    print(f"target >= {TARGET_TURNS_S:.0f} turns/s: {turns_s:.0f} {'OK' if turns_s >= TARGET_TURNS_S else 'MISSED'}")


if __name__ == "__main__":
    main()
