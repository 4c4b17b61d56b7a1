"""Benchmark: BFCL through `nanbeige eval` next to BFCL's own generator and runner, on the same replies.

For one category of each BFCL group (non-live `simple_python`, live `live_simple`, multi-turn
`multi_turn_base`), a scripted loopback model (tests/bfcl_oracle.py: right and wrong replies in the
shapes real models give) answers both pipelines. Prints each pipeline's accuracy (they must be equal),
how many verdicts differ, and the wall time per 100 items of each (generation and grading). Run from the
repository root:

    python tests/benchmarks/bfcl_pipeline.py [--items 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bfcl_oracle import official_verdicts, run_official, script_for  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from nanbeige.agent.backends.llm import LLMConfig  # noqa: E402
from nanbeige.agent.run.run_config import AgentConfig, BackendConfig, RunSettings, ToolsConfig  # noqa: E402
from nanbeige.evals import bfcl  # noqa: E402
from nanbeige.evals.benchmarks import BENCHMARKS  # noqa: E402
from nanbeige.evals.runner import EvalConfig, evaluate  # noqa: E402

CATEGORIES = ("simple_python", "live_simple", "multi_turn_base")


class Env:
    """The one monkeypatch method `run_official` uses."""

    def setenv(self, name: str, value: str) -> None:
        os.environ[name] = value


async def ours(server: FakeOpenAI, category: str, items: int, out: Path) -> dict:
    settings = RunSettings(
        llm=LLMConfig(base_url=server.base_url, model="fake"),
        agent=AgentConfig(),
        backend=BackendConfig(backend="openai", base_url_given=True),
        tools=ToolsConfig(),
    )
    config = EvalConfig(
        bench=BENCHMARKS[f"bfcl-{category.replace('_', '-')}"], data=None, out=out, limit=items, concurrency=8
    )
    return await evaluate(config, settings, notice=lambda text: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100, help="items of each category")
    args = parser.parse_args()
    print(
        f"{'category':<18} {'items':>5} {'official':>9} {'ours':>9} {'differ':>6} {'official s/100':>15} "
        f"{'ours s/100':>11}"
    )
    for category in CATEGORIES:
        script = script_for({category: args.items})
        with tempfile.TemporaryDirectory() as folder, FakeOpenAI(script, vllm=True) as server:
            started = time.perf_counter()
            report = asyncio.run(ours(server, category, args.items, Path(folder) / "ours"))
            ours_s = time.perf_counter() - started
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                scores = run_official(server.base_url, {category: args.items}, Path(folder) / "official", Env())
            official_s = time.perf_counter() - started
            verdicts = official_verdicts(scores, list(script.items))
            head = json.loads(next((scores / bfcl.model_dir()).rglob("*_score.json")).read_text().splitlines()[0])
        mine = {item_id: item_id not in report["wrong_ids"] for item_id in script.items}
        differ = sum(mine[i] != verdicts[i] for i in verdicts)
        print(
            f"{category:<18} {len(verdicts):>5} {100 * head['accuracy']:>8.2f}% "
            f"{report['categories'][category]['accuracy']:>8.2f}% {differ:>6} "
            f"{100 * official_s / len(verdicts):>15.2f} {100 * ours_s / len(verdicts):>11.2f}"
        )


if __name__ == "__main__":
    main()
