"""The trainer's losses: per-token log-probabilities without full logits, the RL policy loss and the SFT loss.

Shapes: B rows, L tokens per row, H hidden size, V vocabulary (166,144 for Nanbeige). Position t of a
`[B, L-1]` tensor is about predicting token t+1 from the prefix up to token t:

    targets          [B, L-1]  input_ids[:, 1:]
    loss_mask        [B, L-1]  1 on sampled completion tokens (prompt, tool results and padding are 0)
    advantages       [B, L-1]  the advantage of each token (its turn's or trajectory's)
    rollout_logprobs [B, L-1]  the sampler's log-probability of each target token (0 where masked)
    old_logprobs     [B, L-1]  π_old: the same tokens under the policy this update started from (fixed)

The policy loss is one algorithm (settings in the reference notes on RL, section 6): clip-higher PPO surrogate
with dual clip, no KL, a truncated importance weight for the sampler/trainer mismatch and token-mean over the
global batch. π_old is computed once per batch of rollouts, before its first optimizer step, and held fixed
over all of that batch's mini-batches and epochs (verl's `old_log_prob`), so the clip bounds how far the
update moves from where it started.

It is also decoupled PPO (AReaL's objective for rollouts sampled by an older policy): π_old is the proximal
policy, the rollout logprobs the behaviour policy, the clipped ratio current/proximal and the capped weight
proximal/behaviour; `tests/test_decoupled_loss_oracle.py` holds it against AReaL's `ppo_actor_loss_fn`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, entropy: list[Tensor] | None = None
) -> Tensor:
    """log p(target) for one chunk of n positions: hidden [n, H], targets [n] -> [n]. With an empty `entropy`
    list, the entropy of p [n] is appended to it: once, so that checkpointing's recompute in backward (which
    calls this again with the same list) does not compute it a second time."""
    logits = head(hidden).float() / temperature  # (n, V), the only vocabulary-sized tensor
    # log_softmax gathered at the target = logit[target] - logsumexp(logits); computing it this way never
    # materialises a second (n, V) tensor of log-probabilities
    normaliser = torch.logsumexp(logits, dim=-1)  # (n,)
    if entropy is not None and not entropy:
        with torch.no_grad():  # a metric: H(p) = logsumexp - Σ p·logit, no gradient
            entropy.append(normaliser - (torch.exp(logits - normaliser[:, None]) * logits).sum(-1))  # (n,)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    targets: Tensor,
    chunk_tokens: int = 4096,
    temperature: float = 1.0,
    chunks: int | None = None,
    entropy: bool = False,
    position_ids: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The model's log-probability of each target token, [B, L-1] in float32, without full logits.

    The full logits would be B·L·V floats: 32k tokens × 166k vocabulary × 4 bytes ≈ 22 GB. Instead:

    1. the backbone (embeddings, layers, final norm) gives hidden states h [B, L, H]; the last position predicts
       nothing in the batch, so h[:, :-1] is flattened to [N, H] with N = B·(L-1);
    2. the LM head W [V, H] is applied to `chunk_tokens` rows at a time: logits [n, V], then
       log p = logits[target] - logsumexp(logits) per row, so at most one [n, V] tensor lives at once;
    3. each chunk runs under activation checkpointing, so backward keeps only h and recomputes the chunk's
       logits when its turn comes, instead of holding every chunk's [n, V] logits for the whole backward.

    `temperature` must be the sampling temperature: vLLM's logprobs are taken after dividing the logits by it.
    `chunks` forces the number of head calls (pieces may then be empty): under FSDP every rank must call the
    sharded head the same number of times, since each call gathers its weights.
    Padding is whatever `attention_mask` says; positions over padding get a value that the loss mask drops.
    With `position_ids` (packed rows, `packing.collate_packed`) the attention mask is not passed: transformers
    then reads each row's extent from where its positions restart at 0 and keeps the rows from attending to
    each other. With `entropy`, also the entropy of each position's (temperature-scaled) distribution,
    [B, L-1], detached.

    The backbone is `model.get_decoder()` and the head `model.get_output_embeddings()`. Both work unchanged on
    a peft `PeftModel` (it forwards attributes to the wrapped model, whose modules carry the LoRA layers), and
    a LoRA on `lm_head` is the returned head. Models that post-process logits (soft-capping, logit scales) are
    not covered; Llama-style models such as Nanbeige have none.
    """
    backbone, head = model.get_decoder(), model.get_output_embeddings()
    if position_ids is not None:
        hidden = backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
    else:
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    B, L, H = hidden.shape
    hidden = hidden[:, :-1].reshape(-1, H)  # (N, H), N = B·(L-1)
    flat_targets = targets.reshape(-1)  # (N,)
    pieces, entropies = [], []
    count = chunks or max(1, -(-hidden.shape[0] // chunk_tokens))
    for h, t in zip(torch.tensor_split(hidden, count), torch.tensor_split(flat_targets, count)):  # (n, H), (n,)
        box: list[Tensor] | None = [] if entropy else None
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logprobs, head, h, t, temperature, box, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(head, h, t, temperature, box))
        entropies += box or []
    logprobs = torch.cat(pieces).view(B, L - 1)
    return (logprobs, torch.cat(entropies).view(B, L - 1)) if entropy else logprobs


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _tis_weight(
    logprobs: Tensor, old: Tensor, rollout_logprobs: Tensor, mask: Tensor, tis_cap: float
) -> tuple[Tensor, dict[str, float]]:
    """The truncated importance weight w = min(exp(old - rollout), C) of each token, [B, L-1] (TIS: the sampler
    is not exactly the trainer), and its metrics over the loss tokens."""
    log_w = torch.clamp(old - rollout_logprobs, -20.0, 20.0)  # (B, L-1): log π_old / π_rollout
    weight = torch.clamp(torch.exp(log_w), max=tis_cap)  # (B, L-1), constant: old is
    on = mask.bool()
    metrics = {
        "tis_weight_mean": _masked_mean(weight, mask),
        "tis_weight_max": float(weight[on].max()) if on.any() else 0.0,
        "tis_weight_min": float(weight[on].min()) if on.any() else 0.0,
        "tis_capped_frac": _masked_mean((torch.exp(log_w) > tis_cap).float(), mask),
        "start_drift_from_rollout": _masked_mean(log_w.abs(), mask),
        "drift_from_rollout": _masked_mean((logprobs.detach() - rollout_logprobs).abs(), mask),
    }
    return weight, metrics


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    total_tokens: float,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_dual: float = 3.0,
    tis_cap: float = 2.0,
    has_rollout_logprobs: bool = True,
) -> tuple[Tensor, dict]:
    """Clip-higher, dual-clip PPO loss with a truncated importance weight; all inputs [B, L-1].

    With r = exp(logp - old), old the fixed π_old of this batch of rollouts, the surrogate per token is

        ℓ = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))      clip-higher (DAPO): ε_high > ε_low
        ℓ = min(ℓ, -A·c)                 when A < 0       dual clip: a bounded loss for very large r

    At the batch's first optimizer step r = 1 and nothing clips; from the second on, tokens whose ratio
    left [1-ε_low, 1+ε_high] in the direction the advantage pushes get no gradient. The sampler (vLLM,
    bf16, other kernels) is not exactly the trainer, so each token is weighted by the truncated importance
    weight w = min(exp(old - rollout), C) (TIS, detached): π_old over the sampler's probability, capped.

    Aggregation is token-mean over the global batch: Σ(w·ℓ·mask) / total_tokens, where total_tokens counts the
    loss tokens of the whole optimizer step (all micro-batches and ranks), so micro-batch gradients simply add
    up to the full batch's gradient. The metrics are this micro-batch's, as floats: `clip_frac` (the clip
    binds), `dual_clip_frac`, and the drifts as mean |log ratio|: `drift_from_start` (current vs π_old) and
    `drift_from_rollout` (current vs the sampler).
    """
    mask = loss_mask.to(logprobs.dtype)
    old = old_logprobs.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - old, -20.0, 20.0)  # (B, L-1)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.maximum(unclipped, clipped)
    dual_binds = (advantages < 0) & (-advantages * clip_dual < surrogate)
    per_token = torch.where(dual_binds, -advantages * clip_dual, surrogate)  # (B, L-1)

    metrics = {
        "loss_tokens": float(mask.sum()),
        "clip_frac": _masked_mean((clipped > unclipped).float(), mask),
        "dual_clip_frac": _masked_mean(dual_binds.float(), mask),
        "drift_from_start": _masked_mean(log_ratio.detach().abs(), mask),
    }
    if has_rollout_logprobs:
        weight, tis_metrics = _tis_weight(logprobs, old, rollout_logprobs, mask, tis_cap)
        per_token = per_token * weight
        metrics |= tis_metrics
    adv_mean = _masked_mean(advantages, mask)
    metrics |= {"advantage_mean": adv_mean, "advantage_std": _masked_mean((advantages - adv_mean) ** 2, mask) ** 0.5}
    loss = (per_token * mask).sum() / total_tokens
    return loss, metrics


def sft_loss(logprobs: Tensor, loss_mask: Tensor, total_tokens: float) -> tuple[Tensor, dict]:
    """Negative log-likelihood of the loss tokens, token-mean over the global batch: -Σ(logp·mask) / total_tokens.

    logprobs and loss_mask are [B, L-1]; total_tokens counts the loss tokens of the whole optimizer step, as in
    `policy_loss`. The metric `nll` is this micro-batch's own mean.
    """
    mask = loss_mask.to(logprobs.dtype)
    nll = -(logprobs * mask).sum()
    return nll / total_tokens, {"nll": float(nll.detach() / mask.sum().clamp(min=1)), "loss_tokens": float(mask.sum())}
