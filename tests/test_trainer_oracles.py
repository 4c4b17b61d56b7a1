"""The trainer's objective against verl's own functions (verl 0.9.1, installed with `tests/oracles.txt`) on
identical tensors: the clipped policy loss over a multi-step update with one fixed π_old, where the clip
binds, and the truncated importance weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

from nanbeige.trainer.loss import policy_loss, token_logprobs

B, L = 3, 16


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tiny_model import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny_oracles"))


def verl_loss(logprobs: torch.Tensor, old: torch.Tensor, rollout: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, total: float, clip_low: float, clip_high: float, clip_dual: float,
              tis_cap: float) -> tuple[torch.Tensor, dict]:
    """verl's decoupled PPO loss: token-level TIS weights π_old / π_rollout capped at tis_cap, then the
    vanilla (clip-higher, dual-clip) policy loss, token-mean over `total` tokens."""
    weights, _ = compute_rollout_correction_weights(old - rollout, mask, rollout_is="token",
                                                    rollout_is_threshold=tis_cap)
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": clip_low, "clip_ratio_high": clip_high,
                               "clip_ratio_c": clip_dual, "global_batch_info": {"batch_num_tokens": total}})
    return compute_policy_loss_vanilla(old, logprobs, advantages, mask, loss_agg_mode="token-mean", config=config,
                                       rollout_is_weights=weights)


def test_a_multi_step_update_clips_where_verl_clips(tiny_folder: Any) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32)
    generator = torch.Generator().manual_seed(5)
    input_ids = torch.randint(0, model.config.vocab_size, (B, L), generator=generator)
    attention_mask, targets = torch.ones(B, L, dtype=torch.long), input_ids[:, 1:]
    advantages = torch.randn(B, L - 1, generator=generator)
    mask = (torch.rand(B, L - 1, generator=generator) > 0.3).float()
    total = float(mask.sum())
    settings = {"clip_low": 0.2, "clip_high": 0.28, "clip_dual": 3.0, "tis_cap": 2.0}
    with torch.no_grad():  # π_old: computed once, before the first step, and never again
        old = token_logprobs(model, input_ids, attention_mask, targets)
    rollout = old + 0.3 * torch.randn(B, L - 1, generator=generator)  # a sampler a little off the trainer
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)
    clip_fracs = []
    for _ in range(4):
        logprobs = token_logprobs(model, input_ids, attention_mask, targets)
        ours, metrics = policy_loss(logprobs, old, rollout, advantages, mask, total, **settings)
        theirs, their_metrics = verl_loss(logprobs, old, rollout, advantages, mask, total, **settings)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        assert metrics["clip_frac"] == pytest.approx(their_metrics["actor/pg_clipfrac"], abs=1e-7)
        our_grads = torch.autograd.grad(ours, logprobs, retain_graph=True)[0]
        their_grads = torch.autograd.grad(theirs, logprobs, retain_graph=True)[0]
        torch.testing.assert_close(our_grads, their_grads, rtol=1e-6, atol=1e-9)
        clip_fracs.append(metrics["clip_frac"])
        ratio = torch.exp(logprobs.detach() - old)
        binds = mask.bool() & (((advantages > 0) & (ratio > 1.28)) | ((advantages < 0) & ((ratio < 0.8) | (ratio > 3))))
        assert (our_grads[binds] == 0).all()  # a clipped token gets no gradient (dual clip: ratio above 3)
        assert (our_grads[mask.bool() & ~binds] != 0).all()
        optimizer.zero_grad()
        ours.backward()
        optimizer.step()
    assert clip_fracs[0] == 0.0  # at the first step the policy is π_old: nothing to clip
    assert max(clip_fracs[1:]) > 0.05  # later steps moved far enough that the trust region binds
