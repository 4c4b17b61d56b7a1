"""Samples into micro-batches and micro-batches into tensors: padded [B, L] batches (`pack`, `collate`) or
packed rows without padding (`pack_rows`, `collate_packed`), each within a token budget. The tensors are
shifted by one for the loss (`collate` says how), so nothing downstream re-aligns them. `packing_works` checks
that a model keeps packed rows apart before a run packs them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nanbeige.trainer.batches import Sample
from nanbeige.trainer.model import World, compute_precision


def pack(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Samples cut into micro-batches for padded [B, L] batches, with B * L <= max_tokens in each
    (L = the batch's longest sample); a sample longer than the budget goes alone.

    Longest first, so each batch's first sample sets its L and similar lengths share a batch (little
    padding); ties keep the input order, so the result is deterministic."""
    order = sorted(samples, key=lambda s: -len(s.ids))  # stable: equal lengths keep their input order
    batches: list[list[Sample]] = []
    for sample in order:
        if batches and (len(batches[-1]) + 1) * len(batches[-1][0].ids) <= max_tokens:
            batches[-1].append(sample)  # not longer than the batch's first, so L stays
        else:
            batches.append([sample])
    return batches


def micro_batches(samples: list[Sample], max_tokens: int, packing: bool) -> list[list[Sample]]:
    """The micro-batches of these samples: packed rows (`pack_rows`) or padded batches (`pack`)."""
    return pack_rows(samples, max_tokens) if packing else pack(samples, max_tokens)


def tensors_of(batch: list[Sample], pad_id: int, packing: bool) -> dict[str, Tensor]:
    """A micro-batch's tensors: one packed row (`collate_packed`) or a padded batch (`collate`)."""
    return collate_packed(batch, pad_id) if packing else collate(batch, pad_id)


def sample_spans(batch: list[Sample], packing: bool) -> list[tuple[int, int]]:
    """Where each sample's positions are in the micro-batch's [B, L-1] tensors: (row, first column)."""
    if not packing:
        return [(b, 0) for b in range(len(batch))]
    starts = [0]
    for sample in batch[:-1]:
        starts.append(starts[-1] + len(sample.ids))
    return [(0, start) for start in starts]


def pack_rows(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Samples put end to end into packed rows of at most max_tokens tokens (a longer sample alone), each
    packed row one micro-batch without padding: first fit, longest first, deterministic."""
    rows: list[list[Sample]] = []
    sizes: list[int] = []
    for sample in sorted(samples, key=lambda s: -len(s.ids)):
        fits = next((i for i, size in enumerate(sizes) if size + len(sample.ids) <= max_tokens), None)
        if fits is None:
            rows.append([sample])
            sizes.append(len(sample.ids))
        else:
            rows[fits].append(sample)
            sizes[fits] += len(sample.ids)
    return rows


def collate_packed(batch: list[Sample], pad_id: int) -> dict[str, Tensor]:
    """One packed row, B = 1, L = the samples' lengths added up: their lists end to end, shifted as in
    `collate`, and `position_ids` [1, L] restarting at 0 where each sample starts (so the model keeps the
    samples apart). The position at a sample's last token predicts the next sample's first token, which
    is prompt: loss mask 0 there, as every sample's token 0 is."""
    joined = Sample(
        ids=[i for s in batch for i in s.ids],
        loss_mask=[m for s in batch for m in s.loss_mask],
        advantages=[a for s in batch for a in s.advantages],
        rollout_logprobs=None
        if any(s.rollout_logprobs is None for s in batch)
        else [v for s in batch for v in s.rollout_logprobs],
        group_id="packed",
        trajectory_id="packed",
        turns=[],
        old_logprobs=None if any(s.old_logprobs is None for s in batch) else [v for s in batch for v in s.old_logprobs],
    )
    tensors = collate([joined], pad_id)
    tensors["position_ids"] = torch.tensor([[p for s in batch for p in range(len(s.ids))]], dtype=torch.long)
    return tensors


def collate(batch: list[Sample], pad_id: int) -> dict[str, Tensor]:
    """Right-padded tensors for one micro-batch, B = len(batch), L = its longest sample.

    The model reads input_ids and its logits at position t predict the token at t + 1, so everything
    the loss needs is shifted by one and has L - 1 columns: column t of targets / loss_mask /
    advantages / rollout_logprobs describes token t + 1 of the sample, predicted from tokens 0..t.
    (Token 0 is never predicted; it is always prompt.)

        input_ids         long [B, L]      the ids, pad_id after each sample's end
        attention_mask    long [B, L]      1 on the sample's tokens, 0 on padding
        targets           long [B, L-1]    input_ids[:, 1:]: targets[b, t] == input_ids[b, t + 1]
        loss_mask         float [B, L-1]   sample loss_mask[1:], 0 on padding
        advantages        float [B, L-1]   sample advantages[1:], 0 on padding
        rollout_logprobs  float [B, L-1]   sample rollout_logprobs[1:], 0 on padding and where missing
        old_logprobs      float [B, L-1]   sample old_logprobs[1:], 0 on padding and before they are computed
        has_rollout_logprobs  bool []      True when every sample of the batch has rollout logprobs"""
    length = max(len(s.ids) for s in batch)
    input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
    loss_mask, advantages, rollout_logprobs, old_logprobs = (torch.zeros((len(batch), length)) for _ in range(4))
    for b, sample in enumerate(batch):
        n = len(sample.ids)
        input_ids[b, :n] = torch.tensor(sample.ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        advantages[b, :n] = torch.tensor(sample.advantages, dtype=torch.float32)
        if sample.rollout_logprobs is not None:
            rollout_logprobs[b, :n] = torch.tensor(sample.rollout_logprobs, dtype=torch.float32)
        if sample.old_logprobs is not None:
            old_logprobs[b, :n] = torch.tensor(sample.old_logprobs, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "targets": input_ids[:, 1:].clone(),  # [B, L-1]: token t + 1 is what position t predicts
        "loss_mask": loss_mask[:, 1:].contiguous(),
        "advantages": advantages[:, 1:].contiguous(),
        "rollout_logprobs": rollout_logprobs[:, 1:].contiguous(),
        "old_logprobs": old_logprobs[:, 1:].contiguous(),
        "has_rollout_logprobs": torch.tensor(all(s.rollout_logprobs is not None for s in batch)),
    }


def packing_works(model: Any, world: World, pad_id: int) -> bool:
    """Whether this model keeps packed rows apart: two short rows must get the same logprobs packed and alone
    (an attention that ignored the restarting positions would let the second row read the first)."""
    from nanbeige.trainer.loss import token_logprobs

    rows = [
        Sample(
            ids=[(7 * i + 3 * k) % 100 + 1 for i in range(12)],
            loss_mask=[1] * 12,
            advantages=[0.0] * 12,
            rollout_logprobs=None,
            group_id="g",
            trajectory_id=str(k),
            turns=[],
        )
        for k in (1, 2)
    ]
    with torch.no_grad(), compute_precision(world):
        packed, alone = (
            {k: v.to(world.device) for k, v in tensors.items()}
            for tensors in (collate_packed(rows, pad_id), collate(rows[1:], pad_id))
        )
        together = token_logprobs(
            model, packed["input_ids"], None, packed["targets"], position_ids=packed["position_ids"]
        )
        second = token_logprobs(model, alone["input_ids"], alone["attention_mask"], alone["targets"])
    return bool(torch.allclose(together[0, 12:].float(), second[0].float(), atol=1e-2))
