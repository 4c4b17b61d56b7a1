"""One optimizer step of the trainer (`train.py`): the step's rows cut into micro-batches (every rank
running as many), forward and backward over each with the loss as its share of the step's token mean, the
metrics gathered from every rank, then one AdamW update."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nanbeige.trainer.metrics import MetricsLog
from nanbeige.trainer.model import World, all_max, all_sum, compute_precision
from nanbeige.trainer.train_config import TrainConfig


@dataclass
class TrainingRun:
    """What every optimizer step of one training call uses."""

    config: TrainConfig
    world: World
    model: Any
    """The policy being trained (FSDP-sharded under torchrun; with LoRA, its adapter trainable)."""
    optimizer: Any
    """AdamW over the model's trainable parameters."""
    pad_id: int
    """The token id micro-batches are padded with."""
    temperature: float = 1.0
    """The rollouts' sampling temperature: logprobs are taken at it, as the sampler took them."""
    tokenizer: Any = None
    """Saved with each checkpoint."""
    data: dict[str, Any] = field(default_factory=dict)
    """The data's summary (`read_samples`): its group counts and its rollouts', logged with each step."""
    metrics_log: MetricsLog | None = None
    """`metrics.jsonl` and its mirrors; None on every rank but the main one."""
    log: Callable[[str], None] = print
    """Where each step's line goes."""


@dataclass
class StepResult:
    """What one optimizer step did, summed over micro-batches and ranks."""

    loss: float
    tokens: int
    """Tokens the step computed (its rows' real tokens, not padding)."""
    loss_tokens: int
    """Tokens the loss counts."""
    grad_norm: float
    """The gradient's norm before clipping."""
    metrics: dict[str, float]
    """The loss's own metrics (clip fractions, KL, entropy, ...), averaged over micro-batches."""
    padding_frac: float
    """Share of the micro-batches' positions that were padding."""


def micro_batches_of(step: list[Any], config: TrainConfig, world: World) -> tuple[list[list[Any]], int]:
    """This rank's micro-batches of a step, and the loss tokens of the whole step (all ranks).

    Every rank runs the same number of forward/backward passes, as FSDP's collectives need: a rank
    short of micro-batches repeats one with its loss weighted 0 (marked by an empty list)."""
    from nanbeige.trainer.packing import micro_batches

    batches = micro_batches(step, config.micro_tokens, config.packing == "on")
    loss_tokens = sum(sum(s.loss_mask) for s in step)
    mine = batches[world.rank :: world.size]
    passes = math.ceil(len(batches) / world.size)
    return mine + [[]] * (passes - len(mine)), loss_tokens


def train_step(run: TrainingRun, step: list[Any]) -> StepResult:
    """Forward and backward over the step's micro-batches, then one AdamW update. The loss of each
    micro-batch is its share of the step's token mean, so the gradients add up to the step's."""
    import torch

    from nanbeige.trainer.loss import token_logprobs
    from nanbeige.trainer.packing import tensors_of

    model, config, world = run.model, run.config, run.world

    mine, loss_tokens = micro_batches_of(step, config, world)
    total, metrics, tokens, padded = 0.0, [], 0, 0
    for batch in mine:
        weight = 1.0 if batch else 0.0
        tensors = {
            k: v.to(world.device) if hasattr(v, "to") else v
            for k, v in tensors_of(batch or step[:1], run.pad_id, config.packing == "on").items()
        }
        positions = tensors["targets"].numel()
        chunks = int(all_max(max(1, -(-positions // config.chunk_tokens)), world))  # the same head calls everywhere
        with compute_precision(world):
            logprobs, entropy = token_logprobs(
                model,
                tensors["input_ids"],
                tensors["attention_mask"],
                tensors["targets"],
                chunk_tokens=config.chunk_tokens,
                temperature=run.temperature,
                chunks=chunks,
                entropy=True,
                position_ids=tensors.get("position_ids"),
            )
        loss, info = micro_batch_loss(logprobs, tensors, loss_tokens, config)
        # FSDP averages gradients over ranks; the loss is already a share of the global mean, so undo it
        (loss * weight * world.size).backward()
        total += float(loss.detach()) * weight
        tokens += int(tensors["attention_mask"].sum()) if batch else 0
        padded += tensors["attention_mask"].numel() if batch else 0
        if batch:
            mask = tensors["loss_mask"]
            metrics.append(info | {"entropy": float((entropy * mask).sum() / mask.sum().clamp(min=1))})
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.max_grad_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    return StepResult(
        loss=all_sum(total, world),
        tokens=int(all_sum(tokens, world)),
        loss_tokens=loss_tokens,
        grad_norm=float(grad_norm),
        metrics=step_metrics(metrics, world),
        padding_frac=1.0 - all_sum(tokens, world) / max(1.0, all_sum(padded, world)),
    )


def micro_batch_loss(
    logprobs: Any, tensors: dict[str, Any], loss_tokens: int, config: TrainConfig
) -> tuple[Any, dict[str, Any]]:
    """The micro-batch's loss, as its share of the step's token mean, and its metrics: SFT's masked NLL, or the
    policy loss with the configured clips and importance-weight cap."""
    from nanbeige.trainer.loss import policy_loss, sft_loss

    if config.objective == "sft":
        loss, info = sft_loss(logprobs, tensors["loss_mask"], loss_tokens)
    else:
        loss, info = policy_loss(
            logprobs,
            tensors["old_logprobs"],
            tensors["rollout_logprobs"],
            tensors["advantages"],
            tensors["loss_mask"],
            loss_tokens,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            clip_dual=config.clip_dual,
            tis_cap=config.tis_cap,
            has_rollout_logprobs=bool(tensors.get("has_rollout_logprobs", True)),
        )
    return loss, info


def step_metrics(metrics: list[dict[str, float]], world: World) -> dict[str, float]:
    """The step's metrics from every rank's micro-batches, the same whatever the number of ranks: counts
    summed, `_max` / `_min` the extreme, the rest averaged weighted by each micro-batch's loss tokens."""
    if world.size > 1:
        import torch.distributed as dist

        everyone: list[Any] = [None] * world.size
        dist.all_gather_object(everyone, metrics)
        metrics = [info for part in everyone for info in part]
    if not metrics:
        return {}
    weights = [m.get("loss_tokens", 1.0) for m in metrics]
    combined = {}
    for key in metrics[0]:
        values = [m.get(key, 0.0) for m in metrics]
        if key == "loss_tokens":
            combined[key] = sum(values)
        elif key.endswith("_max") or key.endswith("_min"):
            combined[key] = (max if key.endswith("_max") else min)(values)
        else:
            combined[key] = sum(v * w for v, w in zip(values, weights)) / max(sum(weights), 1.0)
    return combined
