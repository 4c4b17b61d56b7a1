"""Benchmark: `nanbeige loop --max-staleness K` against the synchronous loop (K = 0), side by side in one run.

The real loop (`trainer.rl_loop.run_loop`: collect in token mode, judge, GRPO with LoRA on the tiny test model,
LoRA sync) against a loopback vLLM engine (`tests/fake_vllm_engine.py`) whose rollouts take a heavy-tailed
time: lognormal around `--rollout-s`, and one rollout in ten `--tail`× longer, as the slow rollouts of a
deep-search run are. Every K runs the same iterations on the same questions in a folder of its own. Printed
for each K: wall time, rollouts trained per second, the share of the wall time the engine had no rollout in
flight and the trainer was not training, the largest staleness any iteration sampled with (never above K), and
a two-sample Kolmogorov-Smirnov test of the rollouts' engine times, trained against sampled (a loop that
dropped stale rollouts would train fewer of the slow ones).

    python tests/benchmarks/async_loop.py [--iterations 6] [--staleness 0 1 2] [--rollout-s 0.1] [--tail 10] \\
        [--train-steps 4]

Choose `--rollout-s` and `--train-steps` so that sampling and training take about as long (the case overlap is
for); the table says what each took.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' loopback engine and tiny model

from fake_openai import Reply, mcp_answer  # noqa: E402
from fake_vllm_engine import FakeEngine  # noqa: E402
from scipy.stats import ks_2samp  # noqa: E402
from test_sync_engines import loop_for  # noqa: E402
from tiny_model import make_tiny_model  # noqa: E402

from nanbeige.trainer.loop_config import LoopConfig  # noqa: E402
from nanbeige.trainer.rl_loop import run_loop  # noqa: E402
from nanbeige.trainer.train import TrainConfig  # noqa: E402

QUESTIONS = 4


class Engine:
    """The engine's script: each reply comes after a heavy-tailed wait (served concurrently, as vLLM batches),
    half of each question's rollouts right; it keeps each reply's span to measure the engine's idle time."""

    def __init__(self, tokenizer: Any, rollout_s: float, tail: float, seed: int):
        self.tokenizer, self.rollout_s, self.tail = tokenizer, rollout_s, tail
        self.random = random.Random(seed)
        self.answered: dict[str, int] = {}
        self.spans: list[tuple[float, float]] = []

    def reply(self, request: dict[str, Any]) -> Reply:  # called one at a time, under the fake's lock
        prompt = self.tokenizer.decode(request["prompt"])
        question = next(str(i) for i in range(QUESTIONS) if f"question {i}?" in prompt)
        n = self.answered[question] = self.answered.get(question, 0) + 1
        seconds = self.rollout_s * math.exp(self.random.gauss(0, 0.5))
        seconds *= self.tail if self.random.random() < 0.1 else 1
        now = time.monotonic()
        self.spans.append((now, now + seconds))
        return Reply(content=mcp_answer(question if n % 4 in (1, 2) else "nothing"), delay_s=seconds)

    def busy_s(self) -> float:
        """How long some reply was in flight (the union of the spans)."""
        busy, end = 0.0, 0.0
        for start, stop in sorted(self.spans):
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        return busy


def config_for(model: Path, out: Path, url: str, args: argparse.Namespace, staleness: int) -> LoopConfig:
    """The tests' loop of one-turn rollouts in token mode with LoRA sync (`test_sync_engines.loop_for`), on
    this benchmark's questions and with its optimizer steps an iteration."""
    config = loop_for(model, out, [url], args.iterations, "lora", max_staleness=staleness)
    config.questions.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"What is question {i}?", "answer": str(i)}) + "\n"
            for i in range(QUESTIONS)
        )
    )
    return dataclasses.replace(config, train=dataclasses.replace(config.train, steps=args.train_steps))


def one_run(model: Path, work: Path, args: argparse.Namespace, staleness: int) -> dict[str, Any]:
    from nanbeige.agent.backends.token_mode import load_tokenizer

    engine = Engine(load_tokenizer(str(model))[0], args.rollout_s, args.tail, args.seed)
    tokenize = engine.tokenizer
    out = work / f"k{staleness}" / "loop"
    out.parent.mkdir(parents=True)
    with FakeEngine(
        engine.reply,
        tokenize=lambda text: tokenize(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenize.convert_tokens_to_ids("<|im_end|>"),
    ) as server:
        started = time.monotonic()
        summary = asyncio.run(run_loop(config_for(model, out, server.base_url, args, staleness), lambda line: None))
        wall = time.monotonic() - started
    state = json.loads((out / "loop.json").read_text())
    lag = [
        entry["iteration"] - 1 - int(entry["policy"]["version"].removeprefix("iter-")) for entry in state["iterations"]
    ]
    seconds = [entry["seconds"] for entry in state["iterations"]]
    sampling = sum(s.get("collected", 0) + s.get("judged", 0) for s in seconds)
    training = sum(s.get("trained", 0) for s in seconds)
    trained = sum(item["rollouts"] for item in summary["iterations"] if item["train_steps"])
    sampled_s, trained_s = rollout_times(out, args.iterations)
    return {
        "K": staleness,
        "wall s": round(wall, 1),
        "sampling s": round(sampling, 1),
        "training s": round(training, 1),
        "rollouts/s": round(trained / wall, 2),
        "engine idle": f"{1 - engine.busy_s() / wall:.0%}",
        "trainer idle": f"{1 - training / wall:.0%}",
        "max staleness": max(lag),
        "trained / sampled": f"{len(trained_s)}/{len(sampled_s)}",
        "time KS p": round(float(ks_2samp(sampled_s, trained_s).pvalue), 3),
    }


def rollout_times(out: Path, iterations: int) -> tuple[list[float], list[float]]:
    """Each rollout's time on the engine, of every rollout sampled and of those the trainer trained on (the
    groups its filter keeps): if staleness dropped or delayed the slow ones, the two would differ."""
    from nanbeige.agent.trajectory.trajectory_file import load_trajectories
    from nanbeige.trainer.batches import group_verdict

    rule = TrainConfig(data=[], model="", out=out).groups
    sampled, trained = [], []
    for i in range(1, iterations + 1):
        groups: dict[str, list[Any]] = {}
        for trajectory in load_trajectories(out / f"iter-{i}" / "judged.jsonl"):
            groups.setdefault(trajectory.group_id or trajectory.id, []).append(trajectory)
        for group in groups.values():
            times = [sum(turn.latency_s for turn in t.turns) for t in group]
            sampled += times
            trained += times if group_verdict(group, rule) == "kept" else []
    return sampled, trained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rollout-s", type=float, default=0.1, help="a rollout's typical time on the engine")
    parser.add_argument("--tail", type=float, default=10.0, help="how much longer one rollout in ten takes")
    parser.add_argument("--train-steps", type=int, default=4, help="optimizer steps an iteration (its cost)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        model = make_tiny_model(work / "tiny")
        rows = [one_run(model, work, args, k) for k in args.staleness]
    print(" | ".join(rows[0]))
    for row in rows:
        print(" | ".join(str(value) for value in row.values()))
    base = rows[0]["rollouts/s"]
    for row in rows[1:]:
        print(f"K={row['K']}: {row['rollouts/s'] / base:.2f}x the throughput of K={rows[0]['K']}")


if __name__ == "__main__":
    main()
