"""The trainer's settings: `TrainConfig` (the CLI's `train` flags map onto it) and `GroupRule`, GRPO's rule
for groups. Kept apart from the code that uses them, so that every trainer module can read them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Runs cut before they could answer: with `truncated="mask"` they get no loss (DAPO's overlong filtering),
# since their 0 reward says the run was too long, not that what it did was wrong.
TRUNCATED = ("max_turns", "context_limit", "timeout", "budget")

# What a group's filter counts in each rollout: an outcome reward > 0 (fully right for graders of partial
# credit), or the code grader's record (`trajectory.judge`) saying every test passed, or that and a time
# complexity the judge found optimal.
COUNTS = ("pass", "solved", "complexity")


@dataclass
class GroupRule:
    """How GRPO turns a group's rewards into advantages, and which groups and trajectories train."""

    lam: float = 1.0
    """Weight of the turn-level advantage: A = A_outcome + lam * A_turn (0: plain GRPO)."""
    min_pass_rate: float = 0.1
    """Groups whose fraction of counted rollouts (`counts`) is below this are dropped (every rollout failed:
    nothing to compare). Both bounds are inclusive; unused when `k_of_n` is set."""
    max_pass_rate: float = 0.9
    """Groups whose fraction of counted rollouts is above this are dropped."""
    counts: str = "pass"
    """What the group filter counts in a rollout: `pass` (outcome reward > 0; fully right for code-tests and
    token-f1), `solved` (the code grader's record says every test passed: `judge["solved"] is True`) or
    `complexity` (`judge["complexity_ok"] is True`: solved, and a judge found its time complexity optimal). A
    rollout whose judge record lacks the key counts as not solved, not satisfying. Only which groups train:
    the advantages stay the rewards'."""
    k_of_n: tuple[int, int, int] | None = None
    """(low, high, n): keep a group with low..high of n rollouts counted, both inclusive, replacing the
    pass-rate band (Nanbeige4.1's code RL keeps 1 to 5 of 8 solved: (1, 5, 8)). A group of another size m
    (rollouts left out, or G != n) is kept when low/n <= k/m <= high/n, in exact integers. None: the band."""
    std: str = "sample"
    """The std advantages are divided by: `sample` (GRPO, verl, TRL), `population`, or `none` (Dr.GRPO)."""
    single: str = "zero"
    """A one-rollout group's advantage: `zero` (TRL) or `reward` (verl: R itself)."""
    truncated: str = "train"
    """Trajectories cut at max_turns, the context limit, the timeout or the budget: `train` them with their
    outcome reward, or `mask` them (in the group's statistics, no loss: DAPO's overlong filtering)."""


@dataclass
class TrainConfig:
    """What to train on, and how."""

    data: list[Path]
    """Judged trajectory files (`nanbeige judge --out`)."""
    model: str
    """The model to start from: a Hugging Face id or folder (a checkpoint of an earlier run too)."""
    out: Path
    """Folder for checkpoints (`checkpoint-N/`, each a Hugging Face model) and `metrics.jsonl`."""
    objective: str = "grpo"
    """`grpo` (clipped policy loss with turn-level advantages) or `sft` (masked NLL on passing rollouts)."""
    steps: int | None = None
    """Optimizer steps; None: `epochs` passes over the data. More steps than one pass repeat it, reshuffled."""
    epochs: int = 1
    """Passes over the batch of rollouts (with `steps` None): optimizer steps = mini-batches × epochs."""
    step_tokens: int = 65_536
    """Tokens (rows' ids) per optimizer step: the mini-batch."""
    micro_tokens: int = 16_384
    """Padded tokens per micro-batch (batch size x longest row); a longer row goes alone."""
    lr: float | None = None
    """AdamW learning rate; None: 1e-6 for full fine-tuning, 3e-5 with LoRA."""
    warmup_steps: int = 0
    """The learning rate rises linearly from lr / warmup_steps to lr over the first warmup_steps steps."""
    lr_schedule: str = "constant"
    """After the warmup: `constant`, or `cosine` down to min_lr_ratio × lr at the last step."""
    min_lr_ratio: float = 0.0
    """Where the cosine schedule ends, as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    groups: GroupRule = field(default_factory=GroupRule)
    """GRPO's groups: which train (the pass-rate band or k of n, counting passes, solved or complexity-satisfying
    rollouts), how their rewards become advantages (λ, the std, a one-rollout group) and whether truncated
    rollouts train."""
    clip_low: float = 0.2
    """Lower clip of the ratio: 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip of the ratio (clip-higher): 1 + clip_high."""
    clip_dual: float = 3.0
    """Dual clip: a token with a negative advantage loses at most clip_dual × |A| (above 1)."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight π_old / π_rollout."""
    off_policy: bool = False
    """Train on rollouts sampled with top-p, top-k or penalties the trainer does not apply, the truncated
    importance weights correcting what they can; lifts `max_rollout_drift`."""
    max_rollout_drift: float = 0.25
    """Refuse rollouts whose sampler is further than this from the starting policy, as the mean
    |log π_old − log π_rollout| over trained tokens: data from an older policy, or sampled with settings
    the trainer does not apply. On-policy data measures about 1e-5 in float32, a few 1e-2 from vLLM in bf16."""
    lora_rank: int = 0
    """LoRA rank; 0 trains every parameter."""
    lora_alpha: int = 32
    """LoRA scaling numerator."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward (less memory, about a third more compute)."""
    dtype: str = "auto"
    """Weights in `float32` (`auto`: with bfloat16 compute on a GPU, so small updates are not rounded
    away) or `bfloat16` (half the memory of weights, gradients and AdamW state; updates below bfloat16's
    resolution are lost)."""
    packing: str = "auto"
    """`on`: rows end to end in micro-batches of one packed row, without padding (the model keeps them apart
    by their positions); `off`: right-padded batches of rows of similar length; `auto`: packed where the
    model's attention runs each packed row at its own cost (flash attention's variable-length kernels),
    padded with sdpa or eager attention, which would attend over the whole packed length."""
    chunk_tokens: int = 4096
    """Positions whose logits are computed at once (the vocabulary is large)."""
    save_every: int = 0
    """Save a checkpoint every N steps; 0: at the end only."""
    seed: int = 0
    """Seed of the row order."""
    tensorboard: bool = True
    """Write TensorBoard event files to `out/tensorboard/` besides `metrics.jsonl`."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (needs `wandb` installed)."""
    init_from: Path | None = None
    """A checkpoint of an earlier run to start from, with its optimizer state: with LoRA, its adapter
    on the base `model` (the loop's next iteration goes on training the adapter the server has)."""


def band_problem(k_of_n: tuple[int, int, int]) -> str | None:
    """Why a k-of-n band cannot select anything sensible, or None."""
    low, high, n = k_of_n
    if n < 1:
        return f"n is {n}: it must be at least 1 (the rollouts per group)"
    if not 0 <= low <= high:
        return f"{low} to {high} is not a range: 0 <= low <= high"
    if high > n:
        return f"{high} is more than the {n} rollouts of a group"
    return None


def parse_keep(text: str) -> tuple[int, int, int]:
    """`K-M/N` (`1-5/8`: keep groups with 1 to 5 of 8 rollouts counted) as (K, M, N); ValueError saying
    what is wrong."""
    match = re.fullmatch(r"(\d+)-(\d+)/(\d+)", text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not K-M/N (e.g. 1-5/8: keep groups with 1 to 5 of 8 rollouts counted)")
    k_of_n = (int(match[1]), int(match[2]), int(match[3]))
    problem = band_problem(k_of_n)
    if problem is not None:
        raise ValueError(f"{text!r}: {problem}")
    return k_of_n


def rule_problem(rule: GroupRule) -> str | None:
    """Why the group rule's filter cannot run, or None (the CLI checks its flags; this, a rule built in code)."""
    if rule.counts not in COUNTS:
        return f"the group filter counts {', '.join(COUNTS[:-1])} or {COUNTS[-1]}, not {rule.counts!r}"
    if rule.k_of_n is not None:
        problem = band_problem(rule.k_of_n)
        return None if problem is None else f"the group filter's k of n {rule.k_of_n}: {problem}"
    return None
