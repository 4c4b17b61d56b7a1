"""The trainer: GRPO with turn-level advantages (or SFT) on judged trajectories, one process or many.

    judged trajectories --samples_from--> rows (ids, loss mask, per-token advantages, rollout logprobs)
        --steps--> optimizer steps of about `step_tokens` tokens --pack--> padded micro-batches
        --token_logprobs / policy_loss--> gradients, summed over micro-batches (and ranks) --AdamW-->

The token ids are the recorded ones (`agent.tokens.training_rows`): nothing is re-tokenized. Under
`torchrun` every rank reads the same rows and takes every world-size-th micro-batch of each step; the
model is sharded with FSDP2 (`fully_shard`), gloo on CPU and NCCL on GPUs.

The data of one `train` call is one batch of rollouts. Before its first optimizer step the trainer computes
π_old, every row's logprobs under the starting policy, and holds them fixed over all of the batch's
optimizer steps (mini-batches of `step_tokens` × `epochs`), as verl and TRL do: the PPO clip then bounds how
far the whole update moves. The sampler's own logprobs only weight tokens (truncated importance sampling).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nanbeige.trainer.checkpoints import (
    drop_metrics_after,
    latest_checkpoint,
    read_trainer_state,
    refuse_links,
    save_checkpoint,
)
from nanbeige.trainer.metrics import MetricsLog
from nanbeige.trainer.model import (
    TrainError,
    World,
    join_world,
    load_model,
    mfu,
    parameter_count,
    trainable_model,
)
from nanbeige.trainer.rollouts import plan_steps, read_samples
from nanbeige.trainer.start_policy import start_policy
from nanbeige.trainer.step import TrainingRun, train_step
from nanbeige.trainer.train_config import TrainConfig


@dataclass
class StepLog:
    """One line of `metrics.jsonl`."""

    step: int
    loss: float
    tokens: int
    loss_tokens: int
    seconds: float
    tokens_per_s: float
    grad_norm: float
    lr: float
    metrics: dict[str, float] = field(default_factory=dict)
    mfu: float | None = None
    groups: dict[str, int] = field(default_factory=dict)
    """The data's group counts (read, kept, filtered as too easy / too hard / without reward)."""
    rollouts: dict[str, float] = field(default_factory=dict)
    """The batch of rollouts: mean reward, pass rate, completion tokens per turn, turns per trajectory."""


# ---------------------------------------------------------------- the learning rate


def lr_at(index: int, total: int, config: TrainConfig, peak: float) -> float:
    """The learning rate of optimizer step `index` (0-based) of `total`: linear warmup, then constant or cosine."""
    if index < config.warmup_steps:
        return peak * (index + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return peak
    progress = (index - config.warmup_steps) / max(1, total - 1 - config.warmup_steps)  # 0 → 1 at the last step
    floor = peak * config.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------- the run


RESUME_KEYS = ("objective", "seed", "step_tokens", "micro_tokens", "lora_rank", "steps", "epochs", "data", "groups")


def saved_state(checkpoint: Path, config: TrainConfig, world: World) -> dict[str, Any]:
    """This rank's trainer state in `checkpoint`, once it is checked to fit this run: as many processes
    (the optimizer state is sharded) and the options that decide the steps."""
    state = checkpoint / f"trainer-state-rank{world.rank}.pt"
    if not state.exists():
        raise TrainError(f"{checkpoint} was saved by fewer processes than this run has; resume with as many")
    saved = read_trainer_state(state)
    if saved.get("world_size", 1) != world.size:
        raise TrainError(
            f"{checkpoint} was saved by {saved.get('world_size', 1)} processes; resume with as many "
            "(the optimizer state is sharded)"
        )
    now = json.loads(json.dumps(asdict(config), default=str))  # as saved: paths as text
    changed = [k for k in RESUME_KEYS if saved["config"].get(k) != now.get(k)]
    if changed:
        raise TrainError(f"{checkpoint} was trained with other {', '.join(changed)}; resume with the same options")
    return saved


def seeded_state(config: TrainConfig, world: World) -> dict[str, Any] | None:
    """The trainer state of the checkpoint a run starts from (`init_from`, the loop's previous iteration with
    LoRA), if it has one: its optimizer state goes on."""
    state = config.init_from / f"trainer-state-rank{world.rank}.pt" if config.init_from is not None else None
    return read_trainer_state(state) if state is not None and state.exists() else None


def resolve_packing(config: TrainConfig, model: Any, world: World, pad_id: int, log: Any) -> str:
    """`on` or `off` for this run: `auto` packs with flash attention only; packing needs the check to pass."""
    from nanbeige.trainer.packing import packing_works

    attention = str(getattr(getattr(model, "config", None), "_attn_implementation", ""))
    if config.packing == "off" or config.packing == "auto" and "flash" not in attention:
        return "off"
    if not packing_works(model, world, pad_id):
        log("packing off: this model's attention does not keep rows packed together apart; padding instead")
        return "off"
    return "on"


def peak_lr(config: TrainConfig) -> float:
    return config.lr or (3e-5 if config.lora_rank else 1e-6)


def run_steps(run: TrainingRun, steps: list[list[Any]], start: int) -> int:
    """The optimizer steps from `start` on, each logged and checkpointed as asked; the last step saved."""
    config, params, saved_at = run.config, parameter_count(run.model), start
    for index in range(start, len(steps)):
        lr = lr_at(index, len(steps), config, peak_lr(config))
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        began = time.perf_counter()
        result = train_step(run, steps[index])
        seconds = time.perf_counter() - began
        entry = StepLog(
            step=index + 1,
            loss=result.loss,
            tokens=result.tokens,
            loss_tokens=result.loss_tokens,
            seconds=seconds,
            tokens_per_s=result.tokens / seconds,
            grad_norm=result.grad_norm,
            lr=lr,
            # staleness: policy versions between the rollouts' sampler and the policy this step updates (the
            # drift check at the start refuses data whose sampler was not the starting policy)
            metrics=result.metrics | {"staleness": float(index), "padding_frac": result.padding_frac},
            mfu=mfu(params, result.tokens, seconds, run.world),
            groups={k: v for k, v in run.data.items() if k.startswith("groups_")},
            rollouts=run.data.get("rollouts", {}),
        )
        if run.metrics_log is not None:
            run.metrics_log.write(asdict(entry))
            run.log(
                f"step {entry.step}/{len(steps)} loss {entry.loss:.5f} · {entry.tokens_per_s:,.0f} tokens/s · "
                f"grad norm {entry.grad_norm:.4f}" + (f" · MFU {entry.mfu:.1%}" if entry.mfu else "")
            )
        if config.save_every and entry.step % config.save_every == 0 or entry.step == len(steps):
            save_checkpoint(run.model, run.tokenizer, run.optimizer, entry.step, config, run.world)
            saved_at = entry.step
    return saved_at


def train(config: TrainConfig, resume: bool = False, log: Any = None) -> dict[str, Any]:
    """Train, writing `metrics.jsonl` and checkpoints to `config.out`; with `resume`, go on from the
    newest checkpoint there (the same options give the same steps). Returns a summary."""
    import torch

    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    config = replace(config, model=trainable_model(config.model, log))
    world = join_world()
    samples, data, temperature = read_samples(config)
    steps = plan_steps(samples, config)
    if resume:
        refuse_links(config.out)
    found = latest_checkpoint(config.out) if resume else None
    start = found[1] if found else 0
    saved = saved_state(found[0], config, world) if found else seeded_state(config, world)
    origin = found[0] if found else config.init_from
    model, tokenizer = load_model(config, world, origin)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=peak_lr(config), weight_decay=config.weight_decay
    )
    if saved:
        optimizer.load_state_dict(saved["optimizer"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    metrics_log = None
    if world.main:
        config.out.mkdir(parents=True, exist_ok=True)
        drop_metrics_after(config.out / "metrics.jsonl", start)  # steps past the checkpoint are done again
        metrics_log = MetricsLog(
            config.out,
            start,
            config.tensorboard,
            config.wandb_project,
            json.loads(json.dumps(asdict(config), default=str)),
        )
        per_pass = len(plan_steps(samples, replace(config, steps=None, epochs=1)))
        log(
            f"training on {len(samples)} rows ({json.dumps(data)}); {len(steps)} optimizer steps on this batch of "
            f"rollouts ({per_pass} mini-batches of about {config.step_tokens} tokens a pass, "
            f"{len(steps) / per_pass:g} passes)" + (f", resuming after step {start}" if found else "")
        )
    config = replace(config, packing=resolve_packing(config, model, world, pad_id, log))
    try:
        if config.objective == "grpo":
            start_policy(model, samples, config, world, temperature, pad_id, resumed=found is not None, log=log)
        run = TrainingRun(
            config, world, model, optimizer, pad_id, temperature, tokenizer, data=data, metrics_log=metrics_log, log=log
        )
        saved_at = run_steps(run, steps, start)
    finally:
        if metrics_log is not None:
            metrics_log.close()
    return {
        "steps": len(steps),
        "started_at_step": start,
        "saved_at_step": saved_at,
        "rows": len(samples),
        "data": data,
        "checkpoint": str(config.out / f"checkpoint-{saved_at}") if saved_at else None,
    }
