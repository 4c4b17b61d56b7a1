"""Decoupled PPO, as AReaL trains on rollouts sampled by a policy older than the one a step starts from: three
policies, behaviour (the logprobs the sampler recorded), proximal (the policy at the start of the training
step, one forward pass) and current. The trainer's `policy_loss` is that objective: its clipped ratio is
current / π_old, π_old being computed once per batch before its first optimizer step (the proximal policy),
and its truncated importance weight is π_old / behaviour, capped (TIS). Held term by term against AReaL's own
`ppo_actor_loss_fn` on identical tensors: the loss, its gradient, the clip and dual-clip masks, the capped
importance weight and the masks; and with behaviour = proximal (a synchronous loop: the sampler is the policy
the step starts from) it is AReaL's plain PPO loss, with no importance weight at all."""

from __future__ import annotations

import pytest
import torch
from areal.api.cli_args import RejectionSamplingConfig
from areal.utils.functional.functional import ppo_actor_loss_fn

from nanbeige.trainer.loss import policy_loss

CLIP_LOW, CLIP_HIGH, CLIP_DUAL, TIS_CAP = 0.2, 0.28, 3.0, 2.0
# AReaL takes the importance weight's log ratio in float32 (`apply_rejection_sampling` upcasts to fp32, for
# bf16 inputs); the rest of both losses is float64 here, so the weighted terms agree to float32's precision
FLOAT32 = {"rtol": 1e-6, "atol": 1e-9}


def tensors(seed: int, rows: int = 4, tokens: int = 64) -> dict[str, torch.Tensor]:
    """A batch where every branch is taken: ratios outside the clip on both sides, negative advantages large
    enough for the dual clip, behaviour far enough from proximal for the cap to bind, and masked tokens whose
    logprobs are wild (they must count for nothing)."""
    draw = torch.Generator().manual_seed(seed)
    proximal = -torch.rand(rows, tokens, generator=draw, dtype=torch.float64) * 4
    current = proximal + torch.randn(rows, tokens, generator=draw, dtype=torch.float64) * 0.6
    behaviour = proximal - torch.randn(rows, tokens, generator=draw, dtype=torch.float64) * 1.2
    advantages = torch.randn(rows, tokens, generator=draw, dtype=torch.float64) * 1.5
    mask = torch.rand(rows, tokens, generator=draw) < 0.7
    behaviour = torch.where(mask, behaviour, torch.full_like(behaviour, -30.0))
    return {"current": current, "proximal": proximal, "behaviour": behaviour, "advantages": advantages, "mask": mask}


def ours(t: dict[str, torch.Tensor], current: torch.Tensor, behaviour: torch.Tensor | None = None):
    return policy_loss(
        current,
        t["proximal"],
        t["behaviour"] if behaviour is None else behaviour,
        t["advantages"],
        t["mask"],
        total_tokens=float(t["mask"].sum()),
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        clip_dual=CLIP_DUAL,
        tis_cap=TIS_CAP,
    )


def areal(t: dict[str, torch.Tensor], current: torch.Tensor, behaviour: torch.Tensor, capped: bool = True):
    capping = RejectionSamplingConfig(level="token", action="clamp", metric="ratio", upper=TIS_CAP)
    return ppo_actor_loss_fn(
        logprobs=current,
        proximal_logprobs=t["proximal"],
        old_logprobs=behaviour,
        advantages=t["advantages"],
        eps_clip=CLIP_LOW,
        eps_clip_higher=CLIP_HIGH,
        c_clip=CLIP_DUAL,
        loss_mask=t["mask"],
        rejection_sampling=capping if capped else None,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loss_and_its_gradient_are_areals_decoupled_ppo(seed: int) -> None:
    t = tensors(seed)
    mine, theirs = t["current"].clone().requires_grad_(), t["current"].clone().requires_grad_()
    loss, metrics = ours(t, mine)
    reference, stat = areal(t, theirs, t["behaviour"])
    loss.backward()
    reference.backward()
    torch.testing.assert_close(loss, reference, **FLOAT32)
    torch.testing.assert_close(mine.grad, theirs.grad, **FLOAT32)
    on = t["mask"]
    # every branch was taken, so each term below was compared where it matters
    assert stat["clip_mask"].any() and stat["dual_clip_mask"].any() and (stat["behave_imp_weight"][on] >= TIS_CAP).any()
    assert metrics["clip_frac"] == pytest.approx(float(stat["clip_mask"][on].double().mean()))
    assert metrics["dual_clip_frac"] == pytest.approx(float(stat["dual_clip_mask"][on].double().mean()))
    weight = torch.clamp(torch.exp(t["proximal"] - t["behaviour"]), max=TIS_CAP)
    torch.testing.assert_close(weight[on], stat["behave_imp_weight"][on].double(), **FLOAT32)
    assert metrics["tis_weight_max"] == pytest.approx(float(stat["behave_imp_weight"][on].max()))


def test_masked_tokens_count_for_nothing_however_wild() -> None:
    t = tensors(3)
    wild = torch.where(t["mask"], t["current"], torch.full_like(t["current"], 5.0))  # ratios of e^9 off the mask
    loss, _ = ours(t, wild)
    reference, _ = areal(t, wild, t["behaviour"])
    plain, _ = ours(t, t["current"])
    torch.testing.assert_close(loss, reference, **FLOAT32)
    torch.testing.assert_close(loss, plain, rtol=1e-12, atol=1e-12)


def test_with_behaviour_the_proximal_policy_it_is_plain_ppo() -> None:
    """K = 0, the synchronous loop: the sampler's logprobs are the step's starting policy's (to the CPU's
    precision), the importance weight is 1 and the loss is AReaL's PPO loss without any correction."""
    t = tensors(4)
    loss, metrics = ours(t, t["current"], behaviour=t["proximal"])
    reference, _ = areal(t, t["current"], t["proximal"], capped=False)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    assert metrics["tis_weight_max"] == metrics["tis_weight_min"] == 1.0 and metrics["tis_capped_frac"] == 0.0
