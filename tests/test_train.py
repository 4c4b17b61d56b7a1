"""`nanbeige train` on CPU: real rollouts of the tiny model, judged by hand, trained on with GRPO, SFT
and LoRA; checkpoints that resume and that the in-process backend loads; two gloo processes under
torchrun agree with one. What a run leaves to follow it (its learning rate, TensorBoard's events, `train
report`'s curves) is `tests/test_train_curves.py`."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_model import make_tiny_model

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories
from nanbeige.trainer.checkpoints import latest_checkpoint
from nanbeige.trainer.collect import CollectConfig, collect
from nanbeige.trainer.train import TrainConfig, train

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def judged(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two questions x 4 real rollouts of the tiny model (token-exact, in process), judged by hand:
    rollouts 0 and 1 of each question pass (pass rate 50%), and each rollout's first turn is masked in
    rollout 3 (as a critic-failed turn), the others rewarded 0.5."""
    folder = tmp_path_factory.mktemp("rollouts")
    questions = folder / "questions.jsonl"
    questions.write_text(
        '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'
        '{"id": "b", "question": "Name a colour, and say in a few words where one often sees it.", "answer": "red"}\n'
    )
    settings = RunSettings(
        llm=LLMConfig(model=str(tiny), max_tokens=10, temperature=1.0),
        agent=AgentConfig(max_turns=2, rollback=False),  # every reply is kept: a cut-off one is not sampled again
        backend=BackendConfig(backend="transformers"),
        tools=ToolsConfig(default_servers=False),
    )
    config = CollectConfig(out=folder / "rollouts.jsonl", questions=questions, group_size=4, concurrency=2)
    asyncio.run(collect(config, settings, notice=lambda text: None))
    path = folder / "judged.jsonl"
    writer = TrajectoryWriter(path)
    for trajectory in load_trajectories(config.out):
        trajectory.reward = 1.0 if trajectory.rollout_index < 2 else 0.0
        for turn in trajectory.turns:
            turn.reward, turn.mask = 0.5, 1
        if trajectory.rollout_index == 3:
            trajectory.turns[0].reward, trajectory.turns[0].mask = None, 0
        writer.start(trajectory)
        for turn in trajectory.turns:
            writer.turn(trajectory, turn)
        writer.end(trajectory)
    writer.close()
    return path


def weights(folder: Path) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def config_for(tiny: Path, judged: Path, out: Path, **options: object) -> TrainConfig:
    settings = {"steps": 2, "step_tokens": 200, "micro_tokens": 256, "lr": 1e-3} | options
    return TrainConfig(data=[judged], model=str(tiny), out=out, **settings)  # type: ignore[arg-type]


def on_one_thread(config: TrainConfig, log: Any = None) -> dict:
    """`train(config)` in this process on one torch thread, as each torchrun process runs: with more, the sums
    behind a matmul are split in another order by the batch's shape, and weights drift apart by about 1e-5."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(config, log=log or (lambda text: None))
    finally:
        torch.set_num_threads(threads)


def test_two_grpo_steps_change_every_parameter_and_the_checkpoint_answers(
    tiny: Path, judged: Path, tmp_path: Path
) -> None:
    summary = train(config_for(tiny, judged, tmp_path / "out"), log=lambda text: None)
    assert summary["data"]["groups_kept"] == 2 and summary["rows"] > 0
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["loss"] == line["loss"] and abs(line["loss"]) < 1e3 for line in lines)  # finite
    assert all(line["tokens_per_s"] > 0 and line["loss_tokens"] > 0 for line in lines)
    before, after = weights(tiny), weights(tmp_path / "out" / "checkpoint-2")
    unchanged = [name for name in before if (before[name] == after[name]).all()]
    assert unchanged == []  # every trainable parameter moved

    from nanbeige.agent.backends.in_process import TransformersLLM

    llm = TransformersLLM(LLMConfig(model=str(tmp_path / "out" / "checkpoint-2"), max_tokens=5, temperature=0.0))
    completion = asyncio.run(
        llm.complete([{"role": "user", "content": "What is 2+2?"}], conversation=llm.new_conversation())
    )
    assert completion.completion_ids and completion.message["role"] == "assistant"


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tiny: Path, judged: Path, tmp_path: Path) -> None:
    whole = train(config_for(tiny, judged, tmp_path / "whole", save_every=1), log=lambda text: None)
    assert whole["saved_at_step"] == 2
    broken = tmp_path / "broken"
    train(config_for(tiny, judged, broken, save_every=1), log=lambda text: None)
    import shutil

    shutil.rmtree(broken / "checkpoint-2")  # as if killed before its second checkpoint
    assert latest_checkpoint(broken) == (broken / "checkpoint-1", 1)
    resumed = train(config_for(tiny, judged, broken, save_every=1), resume=True, log=lambda text: None)
    assert resumed["started_at_step"] == 1
    a, b = weights(tmp_path / "whole" / "checkpoint-2"), weights(broken / "checkpoint-2")
    assert all((a[name] - b[name]).abs().max() < 1e-6 for name in a)


@pytest.mark.filterwarnings("error::FutureWarning")  # none on the user's stderr from wrapping with peft
def test_lora_trains_only_the_adapter_and_saves_it_with_a_merged_model(
    tiny: Path, judged: Path, tmp_path: Path
) -> None:
    train(config_for(tiny, judged, tmp_path / "out", lora_rank=4, steps=1), log=lambda text: None)
    folder = tmp_path / "out" / "checkpoint-1"
    assert (folder / "adapter" / "adapter_config.json").exists()
    before, merged = weights(tiny), weights(folder)
    assert set(merged) == set(before)  # a plain Hugging Face model: the adapter merged in
    assert any(not (before[n] == merged[n]).all() for n in before if "proj" in n)  # LoRA changed the projections
    assert all((before[n] == merged[n]).all() for n in before if "norm" in n or "embed" in n)  # nothing else


def test_sft_trains_on_the_passing_rollouts(tiny: Path, judged: Path, tmp_path: Path) -> None:
    summary = train(config_for(tiny, judged, tmp_path / "out", objective="sft", steps=1), log=lambda text: None)
    line = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert summary["rows"] > 0 and line["loss"] > 0  # a masked NLL


def one_and_two_processes(tiny: Path, judged: Path, tmp_path: Path, lora_rank: int = 0) -> tuple[dict, dict]:
    """One step trained in this process (one thread, as each torchrun process has) and in two gloo processes
    under torchrun, with the same options; each one's metrics line."""
    # small logit chunks over rows of unequal length: the ranks' micro-batches need different numbers of
    # chunks, which must not leave one rank waiting in a collective the other never starts
    options = {"steps": 1, "step_tokens": 200, "micro_tokens": 128, "lr": 0.001, "chunk_tokens": 8}
    on_one_thread(config_for(tiny, judged, tmp_path / "one", lora_rank=lora_rank, **options))
    args = ["train", "--data", str(judged), "--model", str(tiny), "--lora-rank", str(lora_rank)]
    args += [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--nproc-per-node",
            "2",
            "--no-python",
            str(BIN / "nanbeige"),
            *args,
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    [single] = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    [sharded] = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    return single, sharded


@pytest.mark.slow
def test_two_gloo_processes_under_torchrun_give_the_loss_gradients_and_metrics_of_one(
    tiny: Path, judged: Path, tmp_path: Path
) -> None:
    single, sharded = one_and_two_processes(tiny, judged, tmp_path)
    assert abs(single["loss"] - sharded["loss"]) < 1e-5 and single["loss_tokens"] == sharded["loss_tokens"]
    assert abs(single["grad_norm"] - sharded["grad_norm"]) < 1e-4 * max(1.0, single["grad_norm"])  # summed right
    # the step's metrics come from both ranks' micro-batches, not rank 0's alone
    assert set(single["metrics"]) == set(sharded["metrics"]) and "clip_frac" in single["metrics"]
    assert all(abs(single["metrics"][k] - sharded["metrics"][k]) < 1e-5 for k in single["metrics"])
    a, b = weights(tmp_path / "one" / "checkpoint-1"), weights(tmp_path / "two" / "checkpoint-1")
    assert all((a[name] - b[name]).abs().max() < 1e-4 for name in a)  # the same update, gathered from shards


@pytest.mark.slow
def test_lora_under_torchrun_trains_the_adapter_of_one_process(tiny: Path, judged: Path, tmp_path: Path) -> None:
    single, sharded = one_and_two_processes(tiny, judged, tmp_path, lora_rank=4)
    assert abs(single["loss"] - sharded["loss"]) < 1e-5
    import safetensors.torch

    adapters = [
        safetensors.torch.load_file(tmp_path / run / "checkpoint-1" / "adapter" / "adapter_model.safetensors")
        for run in ("one", "two")
    ]
    assert set(adapters[0]) == set(adapters[1]) and any("lora_B" in name for name in adapters[0])
    assert all((adapters[0][n] - adapters[1][n]).abs().max() < 1e-4 for n in adapters[0])  # gathered from shards
    assert any(adapters[1][n].abs().max() > 0 for n in adapters[1] if "lora_B" in n)  # B starts at 0: it trained
    a, b = weights(tmp_path / "one" / "checkpoint-1"), weights(tmp_path / "two" / "checkpoint-1")
    assert set(a) == set(weights(tiny)) and all((a[n] - b[n]).abs().max() < 1e-4 for n in a)  # merged alike


def test_an_inconsistent_token_record_is_a_clear_error(tiny: Path, judged: Path, tmp_path: Path) -> None:
    from nanbeige.trainer.train import TrainError

    lines = judged.read_text().splitlines()
    broken = [json.loads(line) for line in lines]
    turn = next(r for r in broken if r["type"] == "turn" and r.get("prefix_hash"))
    turn["prefix_hash"] = "0" * 64  # as a file edited by hand, or a tokenizer that changed
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in broken))
    with pytest.raises(TrainError, match="token record is inconsistent"):
        train(config_for(tiny, path, tmp_path / "out"), log=lambda text: None)


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_pi_old_is_held_over_the_batch_of_rollouts_so_the_clip_binds(tiny: Path, judged: Path, tmp_path: Path) -> None:
    logs: list[str] = []
    train(config_for(tiny, judged, tmp_path / "out", steps=4, step_tokens=100, lr=0.05), log=logs.append)
    lines = metrics_of(tmp_path / "out")
    assert [line["metrics"]["staleness"] for line in lines] == [0, 1, 2, 3]  # updates since the sampling policy
    first = lines[0]["metrics"]
    assert first["drift_from_start"] < 1e-6 and first["clip_frac"] == 0  # the first step starts at π_old
    # rollouts sampled in process with the temperature alone (collect's default): the trainer's policy exactly
    assert first["start_drift_from_rollout"] < 1e-5 and abs(first["tis_weight_mean"] - 1) < 1e-4
    assert lines[-1]["metrics"]["drift_from_start"] > 0.01  # π moved away from π_old, which stayed put ...
    assert max(line["metrics"]["clip_frac"] for line in lines[1:]) > 0  # ... so the trust region binds
    assert (tmp_path / "out" / "start-logprobs.pt").exists()
    assert any("sampler vs the starting policy: mean |log ratio|" in line for line in logs)


def rewritten(judged: Path, path: Path, change: Any) -> Path:
    rows = [json.loads(line) for line in judged.read_text().splitlines()]
    for row in rows:
        change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rollouts_sampled_with_top_p_or_by_another_policy_are_refused_unless_off_policy(
    tiny: Path, judged: Path, tmp_path: Path
) -> None:
    from nanbeige.trainer.train import TrainError

    def top_p(row: dict) -> None:
        if row["type"] == "start":
            row["sampling"]["top_p"] = 0.95

    nucleus = rewritten(judged, tmp_path / "top_p.jsonl", top_p)
    with pytest.raises(TrainError, match="sampled with top_p 0.95, which the trainer does not apply"):
        train(config_for(tiny, nucleus, tmp_path / "a"), log=lambda text: None)

    def older_policy(row: dict) -> None:
        if row["type"] == "turn" and row.get("logprobs"):
            row["logprobs"] = [value - 0.5 for value in row["logprobs"]]

    stale = rewritten(judged, tmp_path / "stale.jsonl", older_policy)
    with pytest.raises(TrainError, match=r"mean \|log π_old - log π_rollout\| is 0.500, above --max-rollout-drift"):
        train(config_for(tiny, stale, tmp_path / "b"), log=lambda text: None)
    train(config_for(tiny, stale, tmp_path / "c", steps=1, off_policy=True), log=lambda text: None)
    weights_of_step = metrics_of(tmp_path / "c")[0]["metrics"]
    assert weights_of_step["tis_weight_min"] == pytest.approx(math.exp(0.5), rel=1e-3)  # π_old / π_rollout
    assert weights_of_step["start_drift_from_rollout"] == pytest.approx(0.5, rel=1e-3)


def test_activation_checkpointing_keeps_fewer_activations(tiny: Path, tmp_path: Path) -> None:
    import torch

    from nanbeige.trainer.model import join_world, load_model

    def saved_bytes(checkpointing: bool) -> int:
        config = TrainConfig(data=[], model=str(tiny), out=tmp_path, gradient_checkpointing=checkpointing)
        model, _ = load_model(config, join_world())
        kept = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            kept.append(tensor.numel() * tensor.element_size())
            return tensor

        ids = torch.randint(0, model.config.vocab_size, (2, 64))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(input_ids=ids).logits.sum().backward()
        return sum(kept)

    with_it, without = saved_bytes(True), saved_bytes(False)
    assert with_it < 0.6 * without


def test_packed_rows_train_as_padded_batches_do_without_the_padding(tiny: Path, judged: Path, tmp_path: Path) -> None:
    logs: list[str] = []
    # one step of every row (four of each question's length), all in one micro-batch: the padded batch then
    # holds rows of both lengths
    options = {"steps": 1, "step_tokens": 100_000, "micro_tokens": 12_000}
    on_one_thread(config_for(tiny, judged, tmp_path / "packed", packing="on", **options), log=logs.append)
    on_one_thread(config_for(tiny, judged, tmp_path / "padded", packing="off", **options))
    assert not any("packing off" in line for line in logs)  # the tiny Llama keeps packed rows apart
    packed, padded = metrics_of(tmp_path / "packed"), metrics_of(tmp_path / "padded")
    for a, b in zip(packed, padded):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
        assert a["tokens"] == b["tokens"]  # the same real tokens ...
        assert a["metrics"]["padding_frac"] == 0 < b["metrics"]["padding_frac"]  # ... and no padding computed
    a, b = weights(tmp_path / "packed" / "checkpoint-1"), weights(tmp_path / "padded" / "checkpoint-1")
    # Adam's first step moves each weight by about lr (1e-3) whatever its gradient's size, so a gradient near
    # zero whose last bits differ moves its weight a little otherwise (seen: 2e-5 on some CPUs); a row that
    # leaked into its neighbour would flip whole steps (2e-3)
    assert all((a[name] - b[name]).abs().max() < 1e-4 for name in a)
