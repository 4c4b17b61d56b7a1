"""Benchmark: `nanbeige collect` in one process, and with `--ray` on a local cluster of 1 and of 2 nodes.

The same rollouts each time: Q questions (default 16) times G (default 4), C rollouts at once (default 8)
in one process or on each node, against a loopback OpenAI-compatible fake (in a process of its own) that
takes D seconds a reply (default 0.2, a model generating) and makes the agent call the test MCP server's
`echo` until turn T (default 3), when it answers. Each node's shard starts its own MCP server.

Reported per setup: rollouts/s over the rollouts themselves (first start to last end, as the trajectories
record them; setting up the cluster and the shards is not counted), and the command's whole wall time.
Ray binds the machine's own address: the benchmark runs itself in a network namespace of its own (as the
tests do), where Ray binds 127.0.0.1.

    python tests/benchmarks/ray_throughput.py [--questions 16] [--group-size 4] [--concurrency 8] [--delay 0.2]
                                              [--turns 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai and ray_cluster

from pool_throughput import serve  # the same fake model, with no limit on replies at once
from ray_cluster import NANBEIGE, TESTS, command_env, in_own_network, local_cluster

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

TESTKIT = "testkit=" + shlex.join([sys.executable, str(TESTS / "mcp_test_server.py")])


def collect(
    base_url: str, questions: Path, out: Path, concurrency: int, group_size: int, ray: str | None
) -> dict[str, float]:
    command = [
        NANBEIGE,
        "collect",
        "--questions",
        str(questions),
        "-G",
        str(group_size),
        "--out",
        str(out),
        "--base-url",
        base_url,
        "--no-default-servers",
        "--mcp",
        TESTKIT,
        "--allow-inexact",
        "--concurrency",
        str(concurrency),
        *(["--ray", ray] if ray else []),
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=command_env(), timeout=1200)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    trajectories = load_trajectories(out)
    first = min(t.started_at for t in trajectories)
    last = max(t.started_at + t.timings["wall_s"] for t in trajectories)
    return {"rollouts": len(trajectories), "rollouts_per_s": len(trajectories) / (last - first), "wall_s": wall}


def main(args: argparse.Namespace) -> None:
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve, args=(args.delay, None, args.turns, child), daemon=True)
    server.start()
    base_url = parent.recv()
    folder = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    questions = folder / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"Question {i}?", "answer": "done"}) + "\n"
            for i in range(args.questions)
        )
    )
    results = {"no Ray": collect(base_url, questions, folder / "plain.jsonl", args.concurrency, args.group_size, None)}
    for nodes in (1, 2):
        with local_cluster(nodes) as (cluster, _):
            results[f"Ray, {nodes} node{'s' * (nodes > 1)}"] = collect(
                base_url, questions, folder / f"ray-{nodes}.jsonl", args.concurrency, args.group_size, cluster.address
            )
    parent.send("stop")
    print(
        f"{args.questions} questions x {args.group_size} rollouts, {args.concurrency} at once per node, "
        f"{args.turns} turns, {args.delay:g} s a reply; {os.cpu_count()} CPUs"
    )
    plain = results["no Ray"]["rollouts_per_s"]
    for name, found in results.items():
        print(
            f"{name:12} {found['rollouts_per_s']:6.2f} rollouts/s ({found['rollouts_per_s'] / plain:4.2f}x), "
            f"{found['wall_s']:5.1f} s wall with start-up"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--turns", type=int, default=3)
    if os.environ.get("NANBEIGE_BENCH_NETNS") != "1":  # run again in a network namespace of its own
        os.environ["NANBEIGE_BENCH_NETNS"] = "1"
        raise SystemExit(subprocess.run(in_own_network([sys.executable, *sys.argv])).returncode)
    main(parser.parse_args())
