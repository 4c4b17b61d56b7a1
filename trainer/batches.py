"""From judged trajectories to training rows: Samples with per-token advantages, which `packing.py` makes
into micro-batches and tensors.

    trajectories --samples_from--> Samples (one per token segment: ids, loss mask, advantages, logprobs)
                 --pack--> micro-batches within a token budget --collate--> [B, L] tensors for the loss

Rows come only from `agent/run/tokens.py`'s `training_rows`: the ids are exactly the ones the model read
and sampled, never a re-tokenization. `samples_from` decides which trajectories train and with what
advantage (see `advantages.py` for the math); everything it leaves out is counted in its summary.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from nanbeige.agent.run.tokens import TrainingRow, training_rows
from nanbeige.agent.trajectory.trajectory import NOT_ENDED_ON_ITS_OWN, Trajectory, Turn
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.token_f1 import TOKEN_F1
from nanbeige.trainer.advantages import group_advantages, keep_group, keep_k_of_n
from nanbeige.trainer.train_config import COUNTS, TRUNCATED, GroupRule, rule_problem

OBJECTIVES = ("grpo", "sft")


@dataclass
class Sample:
    """One training row: a token segment of one trajectory, everything aligned to `ids`."""

    ids: list[int]
    """The segment's token ids: its last prompt followed by that turn's completion (`training_rows`)."""
    loss_mask: list[int]
    """1 on tokens the model sampled in a trained turn; 0 on prompt, tool results, template glue, and
    the completions of masked or rolled-back turns."""
    advantages: list[float]
    """Per token: the advantage of the turn a completion token belongs to, 0.0 wherever loss_mask is 0.
    For SFT, 1.0 on every trained token (the policy loss then reduces to plain masked NLL)."""
    rollout_logprobs: list[float] | None
    """Per token: the sampler's logprob on completion tokens, 0.0 elsewhere; None when a turn of the
    row was recorded without logprobs."""
    group_id: str
    """The question's group (rollouts of one question)."""
    trajectory_id: str
    """The trajectory the row comes from."""
    turns: list[int]
    """Indices of the turns in the row, in order."""
    old_logprobs: list[float] | None = None
    """Per token: π_old, the logprob under the policy the update started from (0.0 at position 0),
    computed by the trainer before its first optimizer step on this batch of rollouts."""


@dataclass
class GroupStats:
    """What `samples_from` read, kept and left out (returned as a dict)."""

    groups_read: int = 0
    groups_kept: int = 0
    """Groups that gave at least one sample."""
    groups_too_easy: int = 0
    """GRPO: above the group filter's band (`group_verdict`): a fraction counted above max_pass_rate, or
    more than high of n."""
    groups_too_hard: int = 0
    """GRPO: below it: a fraction counted below min_pass_rate, or fewer than low of n."""
    groups_no_reward: int = 0
    """No trajectory of the group is left with an outcome reward (the others unfinished or without
    token records)."""
    trajectories_read: int = 0
    trajectories_kept: int = 0
    trajectories_unfinished: int = 0
    """Still running, or cut short from outside (interrupted, crashed, model error)."""
    trajectories_no_tokens: int = 0
    """Some turn (or every turn: none at all) lacks a token record: nothing exact to train on."""
    trajectories_no_reward: int = 0
    """Outcome reward None (no reference answer, or the judge could not decide)."""
    trajectories_failed: int = 0
    """SFT: reward <= 0, so not imitated."""
    trajectories_truncated: int = 0
    """GRPO with truncated "mask": cut at max_turns, the context limit, the timeout or the budget."""
    turns_trained: int = 0
    turns_masked: int = 0
    """Turns of kept trajectories with mask 0 or rolled back: no loss on them."""
    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0


def has_token_records(trajectory: Trajectory) -> bool:
    return bool(trajectory.turns) and all(
        t.completion_ids is not None and t.prompt_delta_ids is not None and t.prompt_keep is not None
        for t in trajectory.turns
    )


def penalised(turn: Turn) -> bool:
    """A rolled-back reply that the judge chose to penalise (`nanbeige judge --failed penalise` records
    `critic.rolled_back`, mask 1 and a negative reward): trained on, so the model learns to avoid it."""
    return (
        turn.rolled_back
        and bool(turn.critic and turn.critic.get("rolled_back"))
        and turn.mask != 0
        and turn.reward is not None
    )


def trained(turn: Turn) -> bool:
    """Whether a turn contributes to the loss. A rolled-back turn does only when penalised: otherwise
    its reply was dropped, the model sampled again, and nothing judged it (its mask is just the default)."""
    return turn.mask != 0 and (not turn.rolled_back or penalised(turn))


def usable(trajectories: list[Trajectory], stats: GroupStats) -> list[Trajectory]:
    """The trajectories that can train: finished on their own, token-recorded, with an outcome reward."""
    kept = []
    for trajectory in trajectories:
        if trajectory.stop_reason is None or trajectory.stop_reason in NOT_ENDED_ON_ITS_OWN:
            stats.trajectories_unfinished += 1
        elif not has_token_records(trajectory):
            stats.trajectories_no_tokens += 1
        elif trajectory.reward is None:
            stats.trajectories_no_reward += 1
        else:
            kept.append(trajectory)
    return kept


def turn_advantages_of(group: list[Trajectory], rule: GroupRule) -> list[list[float]]:
    """Each trajectory's per-turn advantages [T_i], from its outcome reward and its turns' rewards."""
    rewards_G = torch.tensor([t.reward for t in group], dtype=torch.float32)
    turn_rewards = [
        torch.tensor([float("nan") if turn.reward is None else turn.reward for turn in t.turns], dtype=torch.float32)
        for t in group
    ]
    turn_masks = [torch.tensor([int(trained(turn)) for turn in t.turns]) for t in group]
    return [
        a.tolist()
        for a in group_advantages(rewards_G, turn_rewards, turn_masks, lam=rule.lam, std=rule.std, single=rule.single)
    ]


def completion_spans(row: TrainingRow, turns: dict[int, Turn]) -> dict[int, tuple[int, int]]:
    """Where each turn's completion sits in the row: turn index -> (start, end) into `row.ids`.

    A turn's prompt is the first `prompt_keep` tokens of what came before plus its delta, and
    `training_rows` puts its completion right after that prompt, at prompt_keep + len(prompt_delta_ids)
    (within a segment the row so far is exactly the kept part). Checked against the ids."""
    spans = {}
    for index in row.turns:
        turn = turns[index]
        start = turn.prompt_keep + len(turn.prompt_delta_ids)
        end = start + len(turn.completion_ids)
        if row.ids[start:end] != turn.completion_ids:
            raise ValueError(f"turn {index}: its completion is not at {start}:{end} of segment {row.segment}")
        spans[index] = (start, end)
    return spans


def samples_of(trajectory: Trajectory, turn_advantage: list[float]) -> list[Sample]:
    """The trajectory's rows, each turn's advantage on its completion tokens. Rows with nothing to
    train (only masked turns) are left out: they would cost a forward pass for no gradient."""
    by_index = {turn.index: turn for turn in trajectory.turns}
    position = {turn.index: i for i, turn in enumerate(trajectory.turns)}
    # training_rows masks by turn.mask; an unpenalised rolled-back turn is masked too (on copies: the input stays)
    turns = [dataclasses.replace(t, mask=0) if t.rolled_back and not penalised(t) else t for t in trajectory.turns]
    try:
        rows = training_rows(turns)
    except ValueError as exc:
        raise ValueError(f"trajectory {trajectory.id}: {exc}") from None
    samples = []
    for row in rows:
        advantages = [0.0] * len(row.ids)
        for index, (start, end) in completion_spans(row, by_index).items():
            if trained(by_index[index]):
                advantages[start:end] = [turn_advantage[position[index]]] * (end - start)
        if any(row.loss_mask):
            samples.append(
                Sample(
                    ids=row.ids,
                    loss_mask=row.loss_mask,
                    advantages=advantages,
                    rollout_logprobs=row.logprobs,
                    group_id=trajectory.group_id or trajectory.id,
                    trajectory_id=trajectory.id,
                    turns=row.turns,
                )
            )
    return samples


def counted(trajectory: Trajectory, counts: str) -> bool:
    """Whether a rollout counts toward its group's k for the filter (`GroupRule.counts`): an outcome
    reward > 0 (`pass`; for a rollout the code grader judged, every test passed; for one `token-f1` graded,
    the answer's words are the reference's), or the code grader's record
    saying so (`solved`, `complexity`). A record without
    the key, or no record, is not solved: only a grader that checked says a rollout is."""
    judge = trajectory.judge if isinstance(trajectory.judge, dict) else {}
    if counts == "pass" and judge.get("grader") == CODE_TESTS:
        return judge.get("solved") is True  # code: a half-right program earns its pass rate, yet fails
    if counts == "pass" and judge.get("grader") == TOKEN_F1:
        return judge.get("correct") is True  # a sentence around the right word earns its F1, yet fails
    if counts == "pass":
        return trajectory.reward is not None and trajectory.reward > 0
    return judge.get("solved" if counts == "solved" else "complexity_ok") is True


def group_verdict(group: list[Trajectory], rule: GroupRule) -> str:
    """Whether GRPO trains on a group (its usable rollouts, at least one): `kept`, `too easy` or `too hard`.
    k counted rollouts (`counted`) of the group's m are held against `rule.k_of_n` when set (`keep_k_of_n`),
    else the fraction k / m against the pass-rate band (`keep_group`). The one decision: `samples_from` and
    the loop's dynamic sampling both ask it."""
    if rule.counts not in COUNTS:
        raise ValueError(rule_problem(rule))
    k, m = sum(counted(t, rule.counts) for t in group), len(group)
    if rule.k_of_n is not None:
        low, high, n = rule.k_of_n
        if keep_k_of_n(k, m, low, high, n):
            return "kept"
        return "too easy" if k * n > high * m else "too hard"
    if keep_group(k / m, rule.min_pass_rate, rule.max_pass_rate):
        return "kept"
    return "too easy" if k / m > rule.max_pass_rate else "too hard"


# What a counted rollout is, in words, for messages: "1 to 5 of 8 solved".
COUNTED_AS = {"pass": "passing", "solved": "solved", "complexity": "solved at optimal complexity"}


def describe_band(rule: GroupRule) -> str:
    """The group filter in force, in words: `1 to 5 of 8 solved`, `a pass rate between 0.1 and 0.9`."""
    if rule.k_of_n is not None:
        low, high, n = rule.k_of_n
        return f"{low} to {high} of {n} {COUNTED_AS.get(rule.counts, rule.counts)}"
    rate = "pass rate" if rule.counts == "pass" else f"rate of rollouts {COUNTED_AS.get(rule.counts, rule.counts)}"
    return f"a {rate} between {rule.min_pass_rate} and {rule.max_pass_rate}"


def group_samples(group: list[Trajectory], objective: str, rule: GroupRule, stats: GroupStats) -> list[Sample]:
    """One group's samples (its usable trajectories), counting what is left out."""
    if objective == "sft":
        passing = [t for t in group if counted(t, rule.counts)]  # code RL: --filter-counts solved
        stats.trajectories_failed += len(group) - len(passing)
        group, advantages = passing, [[1.0] * len(t.turns) for t in passing]
    else:
        verdict = group_verdict(group, rule)
        if verdict != "kept":
            stats.groups_too_easy += verdict == "too easy"
            stats.groups_too_hard += verdict == "too hard"
            return []
        advantages = turn_advantages_of(group, rule)
    samples = []
    for trajectory, turn_advantage in zip(group, advantages):
        if rule.truncated == "mask" and trajectory.stop_reason in TRUNCATED:
            stats.trajectories_truncated += 1  # in the group's statistics above, but no loss on it
            continue
        samples += samples_of(trajectory, turn_advantage)
        stats.trajectories_kept += 1
        stats.turns_masked += sum(not trained(turn) for turn in trajectory.turns)
        stats.turns_trained += sum(trained(turn) for turn in trajectory.turns)
    return samples


def samples_from(
    trajectories: list[Trajectory], objective: str = "grpo", rule: GroupRule | None = None
) -> tuple[list[Sample], dict[str, Any]]:
    """The training samples of judged trajectories, and a summary of what was kept and left out
    (`GroupStats` as a dict).

    Trajectories are grouped by `group_id` (one without is a group of its own). A trajectory is left
    out when it did not finish on its own, lacks token records, or has no outcome reward; a group with
    none left is dropped. A pass is what `counted` counts: an outcome reward > 0 (fully right for code-tests
    and token-f1).
    - `grpo`: a group trains only when `group_verdict` keeps it: its pass rate within [min_pass_rate,
      max_pass_rate] (`keep_group`), or with `k_of_n` low to high of n rollouts counted (`keep_k_of_n`),
      counting passes, solved or complexity-satisfying rollouts (`counts`); each turn's advantage is
      A = Â^O + λ·Â^T (`group_advantages`) over the group's usable trajectories, turn rewards None counting
      as unjudged.
    - `sft`: no group filter; only passing trajectories (reward > 0; with `counts` solved or complexity,
      those the code grader says so of) are kept, with advantage 1.0 on
      every trained token, so the loss is masked NLL. Failed and undecided (None) outcomes are never
      imitated. Turns the critic masked stay masked: SFT trains on the judged trajectories with failed
      turns masked.
    Either way masked (mask 0) and rolled-back turns get loss mask 0 and advantage 0."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    problem = rule_problem(rule or GroupRule())
    if problem is not None:
        raise ValueError(problem)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id or trajectory.id].append(trajectory)
    stats = GroupStats(groups_read=len(groups), trajectories_read=len(trajectories))
    samples: list[Sample] = []
    for group in groups.values():
        group = usable(group, stats)
        if not group:
            stats.groups_no_reward += 1
            continue
        kept = group_samples(group, objective, rule or GroupRule(), stats)
        stats.groups_kept += bool(kept)
        samples += kept
    stats.samples = len(samples)
    stats.tokens = sum(len(s.ids) for s in samples)
    stats.loss_tokens = sum(sum(s.loss_mask) for s in samples)
    return samples, dataclasses.asdict(stats)
