"""Benchmark: `nanbeige collect` against a pool of 1, 2 and 4 endpoints (`--base-url` given that often).

Each endpoint is a loopback OpenAI-compatible fake in a process of its own that answers at most S requests
at once (default 2), each reply taking D seconds (default 0.2) while it holds its slot; the rest wait, as on
a server whose GPU is busy. So one endpoint ends at S / D replies a second, and N endpoints can give N times
that. The same rollouts each time: Q questions (default 32) times G (default 4), C at once (default 16,
twice the slots of 4 endpoints), the agent calling the test MCP server's `echo` until turn T (default 3),
when it answers; the run's closing summary turn makes T + 1 requests a rollout.

Reported per pool: rollouts/s over the rollouts themselves (first start to last end, as the trajectories
record them; start-up is not counted), the ratio to one endpoint, model requests/s against the pool's
ceiling (endpoints x S / D), the requests each endpoint served (the command's end line), and the CPU the
command used (with its MCP server) per second of wall time: near the machine's core count, the client is what
limits.

    python tests/benchmarks/pool_throughput.py [--questions 32] [--group-size 4] [--concurrency 16]
                                               [--delay 0.2] [--slots 2] [--turns 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

TESTS = Path(__file__).resolve().parents[1]
NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join([sys.executable, str(TESTS / "mcp_test_server.py")])
GOAL = 3.5  # 4 endpoints against one


def serve(delay_s: float, slots: int, turns: int, conn) -> None:
    """Child process: one endpoint. The turn is read off the request: system, user, then an assistant and a
    user message per turn."""

    def reply(request):
        server.requests.clear()
        turn = 1 + (len(request["messages"]) - 2) // 2
        text = mcp_answer("done") if turn >= turns else mcp_call("testkit", "echo", {"text": f"probe {turn}"})
        return Reply(content=text, delay_s=delay_s)

    with FakeOpenAI(reply, max_in_flight=slots) as server:
        conn.send(server.base_url)
        conn.recv()


@contextmanager
def endpoints(count: int, args: argparse.Namespace):
    """`count` endpoints, each in its own process; yields their base URLs."""
    pipes, processes = [], []
    for _ in range(count):
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.Process(target=serve, args=(args.delay, args.slots, args.turns, child), daemon=True)
        process.start()
        pipes.append(parent)
        processes.append(process)
    try:
        yield [pipe.recv() for pipe in pipes]
    finally:
        for pipe, process in zip(pipes, processes):
            pipe.send("stop")
            process.join(5)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def collect(urls: list[str], questions: Path, out: Path, args: argparse.Namespace) -> dict:
    command = [
        NANBEIGE,
        "collect",
        "--questions",
        str(questions),
        "-G",
        str(args.group_size),
        "--out",
        str(out),
        "--no-default-servers",
        "--mcp",
        TESTKIT,
        "--allow-inexact",
        "--concurrency",
        str(args.concurrency),
        *(arg for url in urls for arg in ("--base-url", url)),
    ]
    cpu, started = children_cpu_s(), time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env={**os.environ, "COLUMNS": "400"})
    wall, cpu = time.monotonic() - started, children_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    trajectories = load_trajectories(out)
    first = min(t.started_at for t in trajectories)
    last = max(t.started_at + t.timings["wall_s"] for t in trajectories)
    # a pool's end line names each endpoint's requests; one endpoint served them all
    served = [int(n) for n in re.findall(r" (\d+) requests, ", done.stderr)] or [
        sum(len(t.turns) for t in trajectories)
    ]
    return {
        "rollouts": len(trajectories),
        "rollouts_per_s": len(trajectories) / (last - first),
        "wall_s": wall,
        "requests_per_s": sum(served) / (last - first),
        "cpu_per_s": cpu / wall,
        "served": served,
    }


def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    questions = folder / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"Question {i}?", "answer": "done"}) + "\n"
            for i in range(args.questions)
        )
    )
    results = {}
    for count in args.endpoints:
        with endpoints(count, args) as urls:
            results[count] = collect(urls, questions, folder / f"pool-{count}.jsonl", args)
    ceiling = args.slots / args.delay  # requests/s one endpoint can answer
    print(
        f"{args.questions} questions x {args.group_size} rollouts, {args.concurrency} at once, {args.turns} turns, "
        f"endpoints answering {args.slots} at once in {args.delay:g} s each (at most {ceiling:g} requests/s "
        f"each); {os.cpu_count()} CPUs"
    )
    one = results[args.endpoints[0]]["rollouts_per_s"]
    for count, found in results.items():
        print(
            f"{count} endpoint{'s' * (count > 1)}: {found['rollouts_per_s']:6.2f} rollouts/s "
            f"({found['rollouts_per_s'] / one:4.2f}x), {found['requests_per_s']:5.1f} of {count * ceiling:g} "
            f"requests/s, {found['wall_s']:5.1f} s wall with start-up, "
            f"CPU {found['cpu_per_s']:.2f} s/s; requests per endpoint {found['served']}"
        )
    if 1 in results and 4 in results:
        ratio = results[4]["rollouts_per_s"] / results[1]["rollouts_per_s"]
        print(f"goal: 4 endpoints >= {GOAL}x one: {ratio:.2f}x {'OK' if ratio >= GOAL else 'MISSED'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds a reply takes (default 0.2)")
    parser.add_argument("--slots", type=int, default=2, help="requests an endpoint answers at once (default 2)")
    parser.add_argument("--turns", type=int, default=3, help="model turns per rollout (default 3)")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 2, 4])
    main(parser.parse_args())
