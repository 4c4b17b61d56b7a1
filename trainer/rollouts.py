"""The batch of rollouts a `train` call trains on: the judged files read and checked (their sampling
settings must be what the trainer computes), turned into rows by GRPO's group rule (`GroupRule`,
`batches.samples_from`), summarised for the curves, and cut into optimizer steps."""

from __future__ import annotations

import json
import math
import random
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.agent.trajectory.records import record_line
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.model import TrainError

if TYPE_CHECKING:
    from nanbeige.trainer.train_config import TrainConfig


def read_samples(config: TrainConfig) -> tuple[list[Any], dict[str, Any], float]:
    """The training rows of every file, the data summary, and the sampling temperature they share."""
    from nanbeige.trainer.batches import samples_from
    from nanbeige.trainer.train_config import rule_problem

    problem = rule_problem(config.groups)
    if problem is not None:  # before the files: samples_from's ValueError would read as a bad token record
        raise TrainError(problem)
    trajectories = []
    vocabulary = vocabulary_size(config.model)
    for path in config.data:
        if not path.is_file():
            raise TrainError(f"{path}: no such file (pass judged trajectories: `nanbeige judge ... --out FILE`)")
        try:
            read = load_trajectories(path, say_torn=True)
        except (OSError, ValueError) as exc:
            raise TrainError(f"cannot read {path}: {exc}") from None
        if not read:
            raise TrainError(f"{path} holds no trajectory (pass judged trajectories: `nanbeige judge ... --out FILE`)")
        check_token_records(read, path, vocabulary)
        trajectories += read
    check_sampling(trajectories, config)
    temperatures = {t.sampling.get("temperature") for t in trajectories if t.sampling} - {None}
    if len(temperatures) > 1:
        raise TrainError(
            f"the trajectories were sampled at different temperatures {sorted(temperatures)}; the "
            "trainer's logprobs must use the sampler's, so train on one temperature at a time"
        )
    try:
        samples, summary = samples_from(trajectories, objective=config.objective, rule=config.groups)
    except ValueError as exc:  # a token record that does not check out: training on it would be wrong
        raise TrainError(f"a trajectory's token record is inconsistent ({exc}); it cannot be trained on") from None
    summary["rollouts"] = rollout_summary(trajectories)
    if not samples:
        why = no_signal(trajectories, summary["rollouts"], config) or nothing_kept_hint(config)
        raise TrainError(f"nothing to train on: {json.dumps(summary)} ({why})")
    return samples, summary, float(temperatures.pop() or 1.0) if temperatures else 1.0


def no_signal(trajectories: list[Any], rollouts: dict[str, float], config: TrainConfig) -> str | None:
    """Why no band could keep a group, when that is the case: no judged rollout passed. GRPO's advantage is a
    group's rewards against their mean, all 0 here; and a policy that never calls the tools it was given (a
    model too small for the task) cannot pass a question that needs them, however often it is sampled. With
    partial credit (`token-f1`) the rewards may differ though none passed: the pass-rate band then says so."""
    if not rollouts or rollouts["pass_rate"] > 0:
        return None
    judged = sum(t.reward is not None for t in trajectories)
    said = f"every group failed ({judged} rollouts, none passed): GRPO learns only from groups where some pass"
    rule = config.groups
    if rollouts["reward_mean"] > 0 and config.objective == "grpo" and rule.k_of_n is None and rule.min_pass_rate > 0:
        said += (
            f", by the group filter; yet they earned partial credit (mean reward {rollouts['reward_mean']:.3f}): "
            "--min-pass-rate 0 keeps groups where none is fully right"
        )
    if rollouts["tool_use"] == 0 and any(t.tools for t in trajectories):
        said += (
            "; and no rollout called a tool, so a question that needs one is never answered: start from a model "
            "that calls tools, or teach the calls first (`train --objective sft` on passing traces of one that does)"
        )
    return said


def nothing_kept_hint(config: TrainConfig) -> str:
    """What to check when no group trained: the group filter in force, and what it counted."""
    from nanbeige.trainer.batches import describe_band

    if config.objective == "sft":
        return "SFT imitates the rollouts that passed (`--filter-counts`); check the outcome rewards"
    rule = config.groups
    source = (
        "the outcome rewards"
        if rule.counts == "pass"
        else f'the grader\'s records (judge["{"solved" if rule.counts == "solved" else "complexity_ok"}"])'
    )
    return f"GRPO keeps groups with {describe_band(rule)}; check {source}"


def vocabulary_size(model: str) -> int | None:
    """How many token ids the model has, from its config alone; None when it cannot be read here (loading
    the model says why, later)."""
    import transformers

    try:
        return int(transformers.AutoConfig.from_pretrained(model).vocab_size)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def check_token_records(trajectories: list[Any], path: Path, vocabulary: int | None) -> None:
    """Refuse a file whose token records the model cannot read: ids that are not integers, negative or
    past the vocabulary (an embedding lookup would fail deep in training), logprobs that do not line up,
    rewards that are not numbers the group statistics can hold."""
    for trajectory in trajectories:
        why = reward_problem(trajectory.reward)
        if why is not None:
            line = record_line(path, trajectory.id, "end")
            raise TrainError(f"{path}:{line}: trajectory {trajectory.id}: its reward {why}; it cannot be trained on")
        for turn in trajectory.turns:
            problem = token_problem(turn, vocabulary) or reward_problem(turn.reward)
            if problem is not None:
                line = record_line(path, trajectory.id, "turn", turn.index)
                raise TrainError(
                    f"{path}:{line}: trajectory {trajectory.id} turn {turn.index}: {problem}; it cannot be trained on"
                )


MAX_REWARD = 1e9
"""Past this size a reward's square overflows float32 in the group statistics, and every advantage of the
group (then the loss and the weights) would be NaN."""


def reward_problem(reward: Any) -> str | None:
    if reward is None or (isinstance(reward, (int, float)) and math.isfinite(reward) and abs(reward) <= MAX_REWARD):
        return None
    return f"is {reward!r}, not a number within ±{MAX_REWARD:g}"


def token_problem(turn: Any, vocabulary: int | None) -> str | None:
    """Why a turn's token record cannot be trained on, or None (also for a turn without one)."""
    if turn.prompt_keep is not None and turn.prompt_keep < 0:
        return "'prompt_keep' is negative"
    for name in ("prompt_delta_ids", "completion_ids"):
        ids = getattr(turn, name) or []
        try:
            array("q", ids)  # C speed: every id an integer of 64 bits
        except (TypeError, OverflowError):
            return f"{name} holds a token id that is not an integer id"
        if ids and min(ids) < 0:
            return f"{name} holds token id {min(ids)}, which is negative"
        if ids and vocabulary is not None and max(ids) >= vocabulary:
            return f"{name} holds token id {max(ids)}, past the model's vocabulary of {vocabulary} ids"
    if turn.logprobs is None:
        return None
    if len(turn.logprobs) != len(turn.completion_ids or []):
        return f"{len(turn.logprobs)} logprobs for {len(turn.completion_ids or [])} completion ids"
    try:
        finite = all(map(math.isfinite, array("d", turn.logprobs)))
    except TypeError:
        return "a logprob is not a number"
    return None if finite else "a logprob is not finite"


# What the trainer computes is softmax(logits / temperature): a sampler that also cut or reweighted the
# distribution recorded logprobs of another policy. Each setting and the value at which it does nothing.
NEUTRAL_SAMPLING = {
    "top_p": (1.0,),
    "top_k": (0, -1),
    "min_p": (0.0,),
    "repetition_penalty": (1.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
}


def check_sampling(trajectories: list[Any], config: TrainConfig) -> None:
    """Refuses rollouts sampled with a setting the trainer does not apply (unless `off_policy`)."""
    if config.off_policy:
        return
    for trajectory in trajectories:
        for name, neutral in NEUTRAL_SAMPLING.items():
            value = (trajectory.sampling or {}).get(name)
            if value is not None and value not in neutral:
                raise TrainError(
                    f"trajectory {trajectory.id} was sampled with {name} {value}, which the trainer does not apply, "
                    "so its logprobs are another policy's; collect with --top-p 1 --repetition-penalty 1 (collect's "
                    "default), or pass --off-policy to train on it with truncated importance weights correcting it"
                )


def plan_steps(samples: list[Any], config: TrainConfig) -> list[list[Any]]:
    """The rows in a seeded order, cut into optimizer steps of about `step_tokens` tokens; `epochs` passes,
    each reshuffled, or as many as `steps` asks for."""
    rng = random.Random(config.seed)
    steps: list[list[Any]] = []
    passes = 0
    while True:
        order = list(samples)
        rng.shuffle(order)
        current: list[Any] = []
        for sample in order:
            current.append(sample)
            if sum(len(s.ids) for s in current) >= config.step_tokens:
                steps.append(current)
                current = []
        if current:
            steps.append(current)
        passes += 1
        if passes >= config.epochs if config.steps is None else len(steps) >= config.steps:
            return steps if config.steps is None else steps[: config.steps]


def rollout_summary(trajectories: list[Any]) -> dict[str, float]:
    """What the batch of rollouts looked like, for the curves: over the trajectories with an outcome reward (the
    pass rate counts what the group filter counts as passing: `batches.counted`)."""
    from nanbeige.trainer.batches import counted  # torch, lazily

    judged = [t for t in trajectories if t.reward is not None]
    turns = [turn for t in judged for turn in t.turns]
    if not judged:
        return {}
    return {
        "reward_mean": sum(t.reward for t in judged) / len(judged),
        "pass_rate": sum(counted(t, "pass") for t in judged) / len(judged),
        "response_tokens_mean": sum(len(turn.completion_ids or []) for turn in turns) / max(1, len(turns)),
        "turns_mean": len(turns) / len(judged),
        # what a search task's curve must show rising: the share of rollouts that called a tool at all
        "tool_use": sum(any(turn.tool_calls for turn in t.turns) for t in judged) / len(judged),
        "tool_calls_mean": sum(len(turn.tool_calls) for turn in turns) / len(judged),
    }
