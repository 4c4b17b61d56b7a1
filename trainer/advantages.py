"""Advantages for one group of rollouts of the same question: an outcome term plus a turn term.

For a group g of G trajectories of one question, trajectory i with outcome reward R_i and turns t with
turn rewards r_{i,t} (set by the critic) and masks m_{i,t}:

    Â^O_i     = (R_i - mean_j R_j) / (std_j R_j + eps)             outcome term, one per trajectory (GRPO)
    Â^T_{i,t} = (r_{i,t} - μ_g) / (σ_g + eps)                      turn term, μ_g, σ_g over the group's
                                                                   unmasked turns that have a reward
    A_{i,t}   = Â^O_i + λ·Â^T_{i,t}   (0 on masked turns)          what the turn's completion tokens get

The standard deviation is the sample one (divide by n - 1) by default, as in the GRPO paper, verl and TRL;
`std="population"` divides by n (advantages sqrt(G / (G - 1)) larger, by a factor that varies with the
group's size), and `std="none"` does not divide (Dr.GRPO). A group of one rollout has no spread: its
advantage is 0 (`single="zero"`, TRL) or its reward R (`single="reward"`, verl: mean 0, std 1). The turn
term uses the same std over the group's pooled turns. With λ = 0 this is plain GRPO: every turn of
trajectory i gets Â^O_i. Pure functions on CPU tensors; the shape suffixes are _G (trajectories of the
group) and _T (turns of one trajectory, T_i of them for trajectory i).
"""

from __future__ import annotations

import torch
from torch import Tensor

STDS = ("sample", "population", "none")
SINGLES = ("zero", "reward")


def spread(values: Tensor, std: str) -> Tensor:
    """The std `values` are divided by: sample (n - 1), population (n), or none (1: Dr.GRPO)."""
    if std == "none":
        return torch.tensor(1.0)
    return values.std(correction=1 if std == "sample" else 0)


def outcome_advantages(rewards_G: Tensor, std: str = "sample", single: str = "zero", eps: float = 1e-6) -> Tensor:
    """Each trajectory's outcome advantage within its group.

    rewards_G: float [G], the outcome rewards R (1.0 right, 0.0 wrong). Returns float [G]:
    (R - mean(R)) / (std(R) + eps), or with `std="none"` (Dr.GRPO) just R - mean(R), so that
    low-variance groups (1 pass of 8) are not scaled up; Dr.GRPO has no eps either. A uniform group
    (all R equal) gives 0 for everyone: nothing to learn from it. A group of one gets 0 or, with
    `single="reward"`, R / (1 + eps) (R without std)."""
    if rewards_G.numel() == 1:
        if single == "zero":
            return torch.zeros_like(rewards_G)
        return rewards_G.clone() if std == "none" else rewards_G / (1.0 + eps)
    centred_G = rewards_G - rewards_G.mean()
    if std == "none":
        return centred_G
    return centred_G / (spread(rewards_G, std) + eps)


def turn_advantages(
    turn_rewards: list[Tensor], turn_masks: list[Tensor], std: str = "sample", eps: float = 1e-6
) -> list[Tensor]:
    """Each turn's turn-level advantage, normalised over the whole group's turns.

    turn_rewards[i]: float [T_i], trajectory i's turn rewards r, NaN where a turn has none (not judged);
    turn_masks[i]: [T_i], 1 = trained on, 0 = masked. A turn counts when it is unmasked and has a reward;
    μ_g and σ_g (`spread`'s std; 0 for one turn) are taken over the counted turns of all G trajectories
    pooled, with no per-position buckets: turns of an open web search rarely line up across rollouts. Returns a float
    [T_i] per trajectory: (r - μ_g) / (σ_g + eps) on counted turns, 0 on the others, so a turn without
    a reward moves nothing and a masked turn neither shapes the statistics nor gets an advantage."""
    counted = [(mask_T != 0) & ~torch.isnan(rewards_T) for rewards_T, mask_T in zip(turn_rewards, turn_masks)]
    pooled = torch.cat([rewards_T[ok_T] for rewards_T, ok_T in zip(turn_rewards, counted)])  # [N counted turns]
    if pooled.numel() == 0:
        return [torch.zeros_like(rewards_T) for rewards_T in turn_rewards]
    mu = pooled.mean()
    sigma = spread(pooled, std) if pooled.numel() > 1 else torch.tensor(0.0 if std != "none" else 1.0)
    return [
        torch.where(ok_T, (torch.nan_to_num(rewards_T) - mu) / (sigma + (eps if std != "none" else 0.0)), 0.0)
        for rewards_T, ok_T in zip(turn_rewards, counted)
    ]


def group_advantages(
    rewards_G: Tensor,
    turn_rewards: list[Tensor],
    turn_masks: list[Tensor],
    lam: float = 1.0,
    std: str = "sample",
    single: str = "zero",
    eps: float = 1e-6,
) -> list[Tensor]:
    """Each turn's final advantage A_{i,t} = Â^O_i + λ·Â^T_{i,t}, and 0 on masked turns.

    rewards_G: float [G], the outcome rewards (not yet normalised); turn_rewards, turn_masks: G tensors
    of [T_i] as for `turn_advantages`. Returns G float tensors [T_i]; the trainer puts A_{i,t} on every
    completion token of turn t. Masked turns get 0 because they get no gradient anyway (loss mask 0),
    and a 0 keeps them out of any advantage statistics a caller logs. With λ = 0 this is plain GRPO:
    Â^O_i broadcast to every unmasked turn of trajectory i."""
    outcome_G = outcome_advantages(rewards_G, std=std, single=single, eps=eps)
    turn = turn_advantages(turn_rewards, turn_masks, std=std, eps=eps)
    return [
        torch.where(mask_T != 0, outcome_G[i] + lam * turn_T, 0.0)
        for i, (turn_T, mask_T) in enumerate(zip(turn, turn_masks))
    ]


def keep_group(pass_rate: float, min_pass_rate: float = 0.1, max_pass_rate: float = 0.9) -> bool:
    """Whether a group is worth training on: min_pass_rate <= pass_rate <= max_pass_rate, both inclusive.

    A group all right or all wrong has outcome advantage 0 everywhere, and one nearly so teaches little.
    With G = 8 and the default 10%-90% band: 0 of 8 (0%) is dropped as too hard, 1 of 8 (12.5%) and 7 of
    8 (87.5%) are kept, 8 of 8 (100%) is dropped as too easy; so the band keeps 1 to 7 passes of 8. With
    G = 10 the bounds themselves (1 and 9 of 10) are kept. The pass rate may count solved rollouts or
    complexity-satisfying ones instead of passes (`GroupRule.counts`); `keep_k_of_n` replaces the band."""
    return min_pass_rate <= pass_rate <= max_pass_rate


def keep_k_of_n(k: int, m: int, low: int, high: int, n: int) -> bool:
    """Whether a group of m rollouts, k of them counted (passing, solved or complexity-satisfying), is kept
    by the band "low to high of n", both inclusive: low <= k <= high when m == n, else low/n <= k/m <= high/n.

    Nanbeige4.1's code RL samples n = 8 and keeps 1 to 5 of 8 solved (stage 1), then 1 to 5 of 8 solved at
    optimal complexity (stage 2): 0 is too hard, 6 to 8 too easy, a skew toward problems the model mostly
    fails. A group with rollouts left out (m = 7) keeps the same fractions: 1 to 4 of 7 (5/7 > 5/8).
    Compared as k·n against low·m and high·m, integers, so a bound is never lost to float rounding."""
    return low * m <= k * n <= high * m
