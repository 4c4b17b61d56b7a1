"""The trainer past one machine is torchrun's: two nodes, here two `torchrun --nnodes 2` launches on this
machine (node ranks 0 and 1, one gloo process each, meeting at 127.0.0.1), train as one process does, and
write their checkpoints to one folder both read, as a cluster's shared storage: a run cut short goes on from
there on both nodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port
from test_train import config_for, judged, on_one_thread, tiny, weights  # noqa: F401 (the fixtures: the tiny model and its judged rollouts)

from nanbeige.trainer.checkpoints import latest_checkpoint

BIN = Path(sys.executable).parent


OPTIONS = {"steps": 2, "save_every": 1, "step_tokens": 200, "micro_tokens": 128, "lr": 0.001}
"""The run trained in one process and on two nodes alike."""


def train_args(model: Path, data: Path, out: Path, *more: str) -> list[str]:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in OPTIONS.items()]
    return ["train", "--data", str(data), "--model", str(model), "--out", str(out), *flags, *more]


def two_nodes(args: list[str]) -> list[str]:
    """Run `nanbeige ARGS` as two nodes of one process each; each node's stderr."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--no-python",
                str(BIN / "nanbeige"),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    errors = []
    for node in nodes:
        try:
            _, stderr = node.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            raise
        errors.append(stderr)
        assert node.returncode == 0, stderr[-3000:]
    return errors


@pytest.mark.slow
def test_two_nodes_train_as_one_process_and_resume_from_the_folder_both_read(
    tiny: Path, judged: Path, tmp_path: Path
) -> None:
    on_one_thread(config_for(tiny, judged, tmp_path / "one", **OPTIONS))  # as one node's process runs it
    shared = tmp_path / "shared"
    first, second = two_nodes(train_args(tiny, judged, shared))
    assert "step 2/2" in first and "step" not in second  # one line a step, from the first node's rank 0

    # each checkpoint holds both ranks' optimizer shards, written by each node into the one folder
    for step in (1, 2):
        folder = shared / f"checkpoint-{step}"
        assert json.loads((folder / "checkpoint-complete.json").read_text()) == {"step": step, "world_size": 2}
        assert {p.name for p in folder.glob("trainer-state-rank*.pt")} == {
            "trainer-state-rank0.pt",
            "trainer-state-rank1.pt",
        }
    one = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (shared / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in two] == [1, 2]
    assert all(
        abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 for a, b in zip(one, two)
    )
    alone_weights, nodes_weights = weights(tmp_path / "one" / "checkpoint-2"), weights(shared / "checkpoint-2")
    assert all((alone_weights[n] - nodes_weights[n]).abs().max() < 1e-4 for n in alone_weights)

    # cut short after step 1: both nodes go on from the folder they share, each with its own optimizer shard
    shutil.rmtree(shared / "checkpoint-2")
    first, _ = two_nodes(train_args(tiny, judged, shared, "--resume"))
    assert "resuming after step 1" in first and "step 2/2" in first
    assert latest_checkpoint(shared) == (shared / "checkpoint-2", 2)
    resumed = weights(shared / "checkpoint-2")
    assert all((alone_weights[n] - resumed[n]).abs().max() < 1e-4 for n in alone_weights)


def test_the_loop_refuses_to_run_under_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process torchrun starts would collect, judge and sync the whole loop: one line, before anything."""
    import asyncio

    from nanbeige.agent.run.run_config import RunSettings
    from nanbeige.trainer.judge_config import JudgeRunConfig
    from nanbeige.trainer.loop_config import LoopConfig, LoopError
    from nanbeige.trainer.rl_loop import run_loop
    from nanbeige.trainer.train import TrainConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "loop"
    config = LoopConfig(
        iterations=1,
        out=out,
        questions=tmp_path / "questions.jsonl",
        settings=RunSettings(),
        judge=JudgeRunConfig(no_critic=True),
        train=TrainConfig(data=[], model="m", out=out),
        sync="none",
    )
    with pytest.raises(LoopError, match="run it without torchrun"):
        asyncio.run(run_loop(config, print))
    assert not out.exists()
