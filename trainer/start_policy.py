"""π_old: every row's logprobs under the policy an update starts from, computed once per batch of rollouts.

The PPO ratio r = π / π_old needs π_old fixed over all of a batch's optimizer steps; were it recomputed at
each step (the current policy, detached) r would always be 1 and the clip would never bind. So before the
first step every row goes through the model once without gradients, and the result is kept on each
`Sample` (`old_logprobs`, aligned to its ids, 0.0 at position 0) and in `start-logprobs.pt` in the run's
folder: a resumed run must use the starting policy's values, not its checkpoint's.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.tools import handed_over
from nanbeige.trainer.model import TrainError, World, all_max, compute_precision

if TYPE_CHECKING:
    from nanbeige.trainer.train_config import TrainConfig

FILE = "start-logprobs.pt"


def compute_start_logprobs(
    model: Any,
    samples: list[Any],
    micro_tokens: int,
    chunk_tokens: int,
    world: World,
    temperature: float,
    pad_id: int,
    packing: bool = False,
) -> None:
    """Sets `old_logprobs` on every sample. Each rank computes every world-size-th micro-batch (all ranks
    make the same number of forward passes, as FSDP's collectives need) and then every rank gets all rows."""
    import torch

    from nanbeige.trainer.loss import token_logprobs
    from nanbeige.trainer.packing import micro_batches, sample_spans, tensors_of

    batches = micro_batches(samples, micro_tokens, packing)
    position = {id(sample): i for i, sample in enumerate(samples)}
    mine = batches[world.rank :: world.size]
    found: dict[int, list[float]] = {}
    with torch.no_grad():
        for batch in mine + [[]] * (math.ceil(len(batches) / world.size) - len(mine)):
            tensors = {k: v.to(world.device) for k, v in tensors_of(batch or samples[:1], pad_id, packing).items()}
            chunks = int(all_max(max(1, -(-tensors["targets"].numel() // chunk_tokens)), world))
            with compute_precision(world):
                logprobs = token_logprobs(
                    model,
                    tensors["input_ids"],
                    tensors["attention_mask"],
                    tensors["targets"],
                    chunk_tokens=chunk_tokens,
                    temperature=temperature,
                    chunks=chunks,
                    position_ids=tensors.get("position_ids"),
                )
            for sample, (b, start) in zip(batch, sample_spans(batch, packing)):  # [B, L-1] -> aligned to its ids
                values = logprobs[b, start : start + len(sample.ids) - 1]
                found[position[id(sample)]] = [0.0] + values.float().cpu().tolist()
    if world.size > 1:
        import torch.distributed as dist

        everyone: list[Any] = [None] * world.size
        dist.all_gather_object(everyone, found)
        found = {i: values for part in everyone for i, values in part.items()}
    for i, sample in enumerate(samples):
        sample.old_logprobs = found[i]


def save_start_logprobs(out: Path, samples: list[Any]) -> None:
    """Written once (atomically) before the first optimizer step: one flat float32 tensor and the lengths."""
    import torch

    lengths = torch.tensor([len(s.old_logprobs) for s in samples], dtype=torch.long)
    values = torch.tensor([v for s in samples for v in s.old_logprobs], dtype=torch.float32)
    partial = out / (FILE + ".partial")
    torch.save({"lengths": lengths, "values": values}, partial)
    os.replace(partial, out / FILE)


def load_start_logprobs(out: Path, samples: list[Any]) -> None:
    """The values `save_start_logprobs` wrote, checked to fit these rows; a file that does not is a clear error."""
    import torch

    path = out / FILE
    fix = "start again in a new --out folder"
    if not path.exists():
        raise TrainError(f"{path} is missing, so the policy this run started from is unknown; {fix}")
    # The out folder may be handed over: no link, no FIFO, and no more than this run's rows could fill
    # (float32 values and int64 lengths, with room for the file's own framing).
    cap = 4 * sum(len(s.ids) for s in samples) + 8 * len(samples) + handed_over.MIB
    try:
        with handed_over.open_file(path, cap, inside=out) as file:
            saved = torch.load(file, map_location="cpu", weights_only=True)
        lengths, values = saved["lengths"].tolist(), saved["values"]
    except handed_over.HandedOverError as exc:
        raise TrainError(f"{exc}; {fix}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: any error of the unpickler
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainError(f"cannot read {path}: {said}; {fix}") from None
    if lengths != [len(s.ids) for s in samples] or values.numel() != sum(lengths):
        raise TrainError(f"{path} does not fit this run's rows (other data or options?); {fix}")
    offset = 0
    for sample, n in zip(samples, lengths):
        sample.old_logprobs = values[offset : offset + n].tolist()
        offset += n


def rollout_drift(samples: list[Any]) -> float | None:
    """Mean |log π_old − log π_rollout| over the trained tokens of rows with rollout logprobs (None: no such row).
    With on-policy data this is the sampler/trainer mismatch alone."""
    total, count = 0.0, 0
    for sample in samples:
        if sample.rollout_logprobs is None or sample.old_logprobs is None:
            continue
        for on, old, rollout in zip(sample.loss_mask, sample.old_logprobs, sample.rollout_logprobs):
            if on:
                total, count = total + abs(old - rollout), count + 1
    return total / count if count else None


def start_policy(
    model: Any,
    samples: list[Any],
    config: TrainConfig,
    world: World,
    temperature: float,
    pad_id: int,
    resumed: bool,
    log: Any,
) -> None:
    """π_old for every row (`start_policy.py`): computed and saved before the first step, read back on resume;
    then the rollouts' distance from it, refused beyond `max_rollout_drift`."""
    if resumed:
        load_start_logprobs(config.out, samples)
    else:
        began = time.perf_counter()
        compute_start_logprobs(
            model, samples, config.micro_tokens, config.chunk_tokens, world, temperature, pad_id, config.packing == "on"
        )
        if world.main:
            save_start_logprobs(config.out, samples)
            log(f"π_old: the starting policy's logprobs of {len(samples)} rows in {time.perf_counter() - began:.1f} s")
    drift = rollout_drift(samples)
    if drift is not None and world.main:
        log(f"the rollouts' sampler vs the starting policy: mean |log ratio| {drift:.2e}")
    if drift is not None and drift > config.max_rollout_drift and not config.off_policy:
        raise TrainError(
            f"the rollouts were not sampled by the policy training starts from: mean |log π_old - "
            f"log π_rollout| is {drift:.3f}, above --max-rollout-drift {config.max_rollout_drift} "
            "(rollouts of an older checkpoint, or sampled with top-p or penalties the trainer does not "
            "apply); collect them again from this model, or pass --off-policy to train on them anyway"
        )
