"""The trainer's objective against verl's own functions (verl 0.9.1, installed with `tests/oracles.txt`) on
identical tensors: the clipped policy loss over a multi-step update with one fixed π_old, where the clip
binds, with the truncated importance weights; and GRPO's outcome advantages, each std option and the
one-rollout rule. TRL's trainer needs `datasets` to import, so TRL's rules are quoted where they apply."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from nanbeige.trainer.advantages import outcome_advantages
from nanbeige.trainer.loss import policy_loss, token_logprobs

B, L = 3, 16


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_oracles"))


def verl_loss(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    total: float,
    clip_low: float,
    clip_high: float,
    clip_dual: float,
    tis_cap: float,
) -> tuple[torch.Tensor, dict]:
    """verl's decoupled PPO loss: token-level TIS weights π_old / π_rollout capped at tis_cap, then the
    vanilla (clip-higher, dual-clip) policy loss, token-mean over `total` tokens."""
    # imported here: verl brings Ray and tensordict, which only the worker running these tests needs
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    weights, _ = compute_rollout_correction_weights(
        old - rollout, mask, rollout_is="token", rollout_is_threshold=tis_cap
    )
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": clip_low,
            "clip_ratio_high": clip_high,
            "clip_ratio_c": clip_dual,
            "global_batch_info": {"batch_num_tokens": total},
        }
    )
    return compute_policy_loss_vanilla(
        old, logprobs, advantages, mask, loss_agg_mode="token-mean", config=config, rollout_is_weights=weights
    )


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


# groups of unequal size, as after unusable rollouts are dropped: 8, 4, 2 and one rollout
GROUPS = [[1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0], [1.0]]


def verl_advantages(groups: list[list[float]], norm_by_std: bool) -> list[list[float]]:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = [r for group in groups for r in group]
    index = np.array([g for g, group in enumerate(groups) for _ in group])
    token_rewards = torch.zeros(len(rewards), 3)
    token_rewards[:, -1] = torch.tensor(rewards)  # the outcome on the last response token, as verl's reward does
    advantages, _ = compute_grpo_outcome_advantage(
        token_rewards, torch.ones(len(rewards), 3), index, norm_adv_by_std_in_grpo=norm_by_std
    )
    flat = advantages[:, 0].tolist()
    return [[flat.pop(0) for _ in group] for group in groups]


@pytest.mark.parametrize(("std", "norm_by_std"), [("sample", True), ("none", False)])
def test_grpo_advantages_are_verls(std: str, norm_by_std: bool) -> None:
    theirs = verl_advantages(GROUPS, norm_by_std)
    for group, expected in zip(GROUPS, theirs):
        ours = outcome_advantages(torch.tensor(group), std=std, single="reward").tolist()
        assert ours == pytest.approx(expected, abs=1e-6)
    # a group of one: verl gives R (mean 0, std 1); the default gives 0, as TRL does (its std of one value is
    # NaN, and NaN advantages become 0)
    assert outcome_advantages(torch.tensor([1.0]), std=std).tolist() == [0.0]


def test_the_population_std_scales_advantages_by_a_factor_that_varies_with_the_group_size() -> None:
    theirs = verl_advantages(GROUPS, norm_by_std=True)
    for group, expected in zip(GROUPS[:3], theirs):
        ours = outcome_advantages(torch.tensor(group), std="population")
        n = len(group)
        assert ours.tolist() == pytest.approx([math.sqrt(n / (n - 1)) * a for a in expected], rel=1e-5)
