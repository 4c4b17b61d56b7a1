"""The trainer's data path: advantages against hand-computed numbers, the group filter, training samples
from hand-made judged trajectories, and packing/collation into shifted [B, L] tensors."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from nanbeige.agent.run.tokens import TokenTracker, full_prompt
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.trainer.advantages import group_advantages, keep_group, outcome_advantages, turn_advantages
from nanbeige.trainer.batches import GroupRule, Sample, samples_from
from nanbeige.trainer.packing import collate, collate_packed, pack, pack_rows

NAN = float("nan")
SQRT3 = math.sqrt(3)


def population_rule(lam: float) -> GroupRule:
    """The hand-computed numbers below divide by the population std (n), the simpler arithmetic."""
    return GroupRule(lam=lam, std="population")


def close(actual: torch.Tensor | list[float], expected: list[float]) -> bool:
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=1e-5)


# ---------------------------------------------------------------- advantages


def test_outcome_advantages_by_hand() -> None:
    # R = [1, 0, 0, 0]: mean 0.25; population var (0.75² + 3·0.25²) / 4 = 0.1875, std = √3/4 ≈ 0.4330
    # → (0.75, -0.25) / (√3/4) = (√3, -1/√3)
    assert close(
        outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), std="population"),
        [SQRT3, -1 / SQRT3, -1 / SQRT3, -1 / SQRT3],
    )
    # R = [1, 1, 0, 0]: mean 0.5, std 0.5 → ±1
    assert close(outcome_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), std="population"), [1.0, 1.0, -1.0, -1.0])
    # Dr.GRPO: centred only
    assert close(outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), std="none"), [0.75, -0.25, -0.25, -0.25])
    # a uniform group teaches nothing, with or without the std (0 / (0 + eps) = 0, not NaN)
    for rewards in ([1.0, 1.0, 1.0], [0.0, 0.0], [1.0]):
        assert close(outcome_advantages(torch.tensor(rewards)), [0.0] * len(rewards))
        assert close(outcome_advantages(torch.tensor(rewards), std="none"), [0.0] * len(rewards))


def test_turn_advantages_pool_the_groups_unmasked_judged_turns() -> None:
    rewards = [torch.tensor([1.0, NAN, 0.2]), torch.tensor([0.6, 5.0])]
    masks = [torch.tensor([1, 1, 1]), torch.tensor([1, 0])]
    # counted: 1.0, 0.2, 0.6 (NaN = unjudged, 5.0 masked): μ = 0.6, σ² = (0.4² + 0.4² + 0) / 3 = 0.10667,
    # σ = 0.32660 → 0.4 / σ = √1.5 = 1.22474. Were the masked 5.0 counted, μ would be 1.7.
    first, second = turn_advantages(rewards, masks, std="population")
    assert close(first, [math.sqrt(1.5), 0.0, -math.sqrt(1.5)])
    assert close(second, [0.0, 0.0])
    # nothing judged (no critic): no turn term at all
    assert [
        a.tolist()
        for a in turn_advantages(
            [torch.tensor([NAN, NAN]), torch.tensor([NAN])], [torch.tensor([1, 1]), torch.tensor([1])]
        )
    ] == [[0.0, 0.0], [0.0]]
    # every turn equal: μ = r, σ = 0 → 0
    assert close(turn_advantages([torch.tensor([0.5, 0.5])], [torch.tensor([1, 1])])[0], [0.0, 0.0])


def test_group_advantages_add_the_turn_term_and_zero_masked_turns() -> None:
    rewards_G = torch.tensor([1.0, 0.0])  # outcome ±1
    turn_rewards = [torch.tensor([1.0, NAN, 0.2]), torch.tensor([0.6, 5.0])]
    masks = [torch.tensor([1, 1, 1]), torch.tensor([1, 0])]
    first, second = group_advantages(rewards_G, turn_rewards, masks, lam=2.0, std="population")
    t = math.sqrt(1.5)
    assert close(first, [1 + 2 * t, 1.0, 1 - 2 * t])  # the unjudged turn keeps the outcome term
    assert close(second, [-1.0, 0.0])  # the masked turn gets 0
    # λ = 0 is plain GRPO: the outcome advantage on every unmasked turn
    first, second = group_advantages(rewards_G, turn_rewards, masks, lam=0.0, std="population")
    assert close(first, [1.0, 1.0, 1.0]) and close(second, [-1.0, 0.0])
    outcome = outcome_advantages(torch.tensor([1.0, 0.0, 0.0]))
    plain = group_advantages(
        torch.tensor([1.0, 0.0, 0.0]), [torch.rand(4) for _ in range(3)], [torch.ones(4) for _ in range(3)], lam=0.0
    )
    assert all(torch.equal(a, outcome[i].expand(4)) for i, a in enumerate(plain))
    # Dr.GRPO passes through: R = [1, 0] → ±0.5
    assert close(group_advantages(rewards_G, turn_rewards, masks, lam=0.0, std="none")[0], [0.5] * 3)


@pytest.mark.parametrize(
    ("passes", "of", "kept"),
    [
        (0, 8, False),
        (1, 8, True),
        (4, 8, True),
        (7, 8, True),
        (8, 8, False),
        (1, 10, True),
        (9, 10, True),
        (1, 11, False),
    ],
)
def test_group_filter_band_is_inclusive(passes: int, of: int, kept: bool) -> None:
    # 1 of 8 = 12.5% and 7 of 8 = 87.5% are inside 10%-90%; 1 of 11 = 9.1% is not; 1 and 9 of 10 are the bounds
    assert keep_group(passes / of) is kept


def test_group_filter_custom_band() -> None:
    assert keep_group(0.0, min_pass_rate=0.0, max_pass_rate=1.0) and keep_group(1.0, 0.0, 1.0)
    assert not keep_group(0.125, min_pass_rate=0.25) and not keep_group(0.75, max_pass_rate=0.7)


# ---------------------------------------------------------------- samples


def trajectory(
    tid: str, group: str | None, reward: float | None, *turns: tuple, stop: str | None = "answered"
) -> Trajectory:
    """A judged trajectory from (prompt ids, completion ids, turn fields) per turn, token-recorded the way
    the agent loop records them; each completion token's logprob is -(its id) / 100."""
    tracker = TokenTracker()
    result = Trajectory(question="q", id=tid, group_id=group, reward=reward, stop_reason=stop)
    for index, (prompt, completion, fields) in enumerate(turns):
        turn = Turn(index=index, assistant={"content": ""}, logprobs=[-c / 100 for c in completion], **fields)
        tracker.record(turn, prompt, completion)
        result.turns.append(turn)
    return result


def judged_group() -> list[Trajectory]:
    """Group q1: rewards [1, 0, 0, 1] (outcome advantage ±1); judged turns 1.0, 0.0, 0.0, 1.0 (turn advantage ±1);
    with λ = 0.5 the trained turns get 1.5, 0.5 | -1.5 | -0.5 | 1.0."""
    return [
        trajectory(
            "t0", "q1", 1.0, ([1, 2, 3], [10, 11], {"reward": 1.0}), ([1, 2, 3, 10, 11, 4, 5], [12], {"reward": 0.0})
        ),  # 4, 5: a tool result
        trajectory(
            "t1", "q1", 0.0, ([1, 2, 3], [20, 21, 22], {"reward": 0.0}), ([1, 2, 3, 20, 21, 22, 6], [23], {"mask": 0})
        ),  # critic failed the turn: masked
        trajectory(
            "t2",
            "q1",
            0.0,
            ([1, 2, 3], [30], {"rolled_back": True}),  # dropped reply; mask left 1
            ([1, 2, 3], [31, 32], {"reward": 1.0}),
        ),  # sampled anew from the same prompt: segment 1
        trajectory("t3", "q1", 1.0, ([1, 2, 3], [40], {})),  # the critic never scored it: reward None
    ]


def other_groups() -> list[Trajectory]:
    one = ([1], [2], {})
    return [
        trajectory("e0", "q2", 1.0, one),
        trajectory("e1", "q2", 1.0, one),  # too easy
        trajectory("h0", "q3", 0.0, one),
        trajectory("h1", "q3", 0.0, one),  # too hard
        trajectory("n0", "q4", None, one),  # not graded
        trajectory("u0", "q1", 1.0, one, stop=None),  # still running
        Trajectory(
            question="q",
            id="x0",
            group_id="q1",
            reward=1.0,
            stop_reason="answered",
            turns=[Turn(index=0, assistant={"content": "text mode"})],
        ),
    ]  # no token records


def test_samples_carry_each_turns_advantage_on_its_completion_tokens() -> None:
    group = judged_group()
    samples, summary = samples_from(group + other_groups(), rule=population_rule(lam=0.5))
    by_id = {s.trajectory_id: s for s in samples}
    assert [s.trajectory_id for s in samples] == ["t0", "t1", "t2", "t3"]  # t2's rolled-back row trains nothing
    t0, t1, t2, t3 = (by_id[t] for t in ("t0", "t1", "t2", "t3"))
    assert t0.ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert t0.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]  # prompt and tool result 0
    assert close(t0.advantages, [0, 0, 0, 1.5, 1.5, 0, 0, 0.5])
    assert t0.rollout_logprobs == [0.0, 0.0, 0.0, -0.10, -0.11, 0.0, 0.0, -0.12]
    assert t1.ids == [1, 2, 3, 20, 21, 22, 6, 23]
    assert t1.loss_mask == [0, 0, 0, 1, 1, 1, 0, 0]  # the masked turn is read, not trained
    assert close(t1.advantages, [0, 0, 0, -1.5, -1.5, -1.5, 0, 0])
    assert (t2.ids, t2.loss_mask, t2.turns) == ([1, 2, 3, 31, 32], [0, 0, 0, 1, 1], [1])
    assert close(t2.advantages, [0, 0, 0, -0.5, -0.5])
    assert (t3.ids, t3.loss_mask) == ([1, 2, 3, 40], [0, 0, 0, 1]) and close(t3.advantages, [0, 0, 0, 1.0])
    for sample in samples:  # the ids are the recorded ones: the last turn's exact prompt + its completion
        trajectory_ = next(t for t in group if t.id == sample.trajectory_id)
        last = trajectory_.turns[sample.turns[-1]]
        assert sample.ids == full_prompt(trajectory_.turns, last.index) + last.completion_ids
        assert all(a == 0.0 for a, m in zip(sample.advantages, sample.loss_mask) if not m)
        assert sample.group_id == "q1"
    assert group[2].turns[0].mask == 1  # the input is left as it was
    assert summary == {
        "groups_read": 4,
        "groups_kept": 1,
        "groups_too_easy": 1,
        "groups_too_hard": 1,
        "groups_no_reward": 1,
        "trajectories_read": 11,
        "trajectories_kept": 4,
        "trajectories_unfinished": 1,
        "trajectories_no_tokens": 1,
        "trajectories_no_reward": 1,
        "trajectories_failed": 0,
        "trajectories_truncated": 0,
        "turns_trained": 5,
        "turns_masked": 2,
        "samples": 4,
        "tokens": 25,
        "loss_tokens": 9,
    }


def test_a_merged_row_carries_a_different_advantage_per_turn() -> None:
    turns = ([1], [2, 3], {"reward": 1.0}), ([1, 2, 3, 4], [5], {"reward": 0.5}), ([1, 2, 3, 4, 5, 6, 7], [8], {})
    group = [trajectory("a", "g", 1.0, *turns), trajectory("b", "g", 0.0, ([1], [9], {"reward": 0.0}))]
    # outcome ±1; judged 1.0, 0.5, 0.0: μ = 0.5, σ = √(1/6) = 0.40825 → turn terms √1.5, 0, -√1.5
    [a, b], _ = samples_from(group, rule=population_rule(lam=1.0))
    assert a.ids == [1, 2, 3, 4, 5, 6, 7, 8] and a.turns == [0, 1, 2]
    t = math.sqrt(1.5)
    assert close(a.advantages, [0, 1 + t, 1 + t, 0, 1.0, 0, 0, 1.0])
    assert close(b.advantages, [0, -1 - t])


def test_a_group_outside_the_band_gives_nothing_and_is_counted() -> None:
    group = judged_group()
    samples, summary = samples_from(group, rule=GroupRule(min_pass_rate=0.6))  # 2 of 4 = 50% < 60%
    assert samples == [] and summary["groups_too_hard"] == 1 and summary["groups_kept"] == 0
    samples, summary = samples_from(group, rule=GroupRule(max_pass_rate=0.4))
    assert samples == [] and summary["groups_too_easy"] == 1


@pytest.mark.parametrize("cut", ["max_turns", "context_limit", "timeout", "budget"])
def test_truncated_rollouts_can_be_masked_but_still_count_in_their_group(cut: str) -> None:
    one = ([1], [2], {})
    group = [trajectory("a", "g", 1.0, one), trajectory("b", "g", 0.0, one), trajectory("c", "g", 0.0, one, stop=cut)]
    trained, summary = samples_from(group, rule=GroupRule(lam=0.0))
    assert [s.trajectory_id for s in trained] == ["a", "b", "c"] and summary["trajectories_truncated"] == 0
    masked, summary = samples_from(group, rule=GroupRule(lam=0.0, truncated="mask"))
    assert [s.trajectory_id for s in masked] == ["a", "b"] and summary["trajectories_truncated"] == 1
    # the group's mean and std still include the cut rollout: a's advantage is the same either way
    assert masked[0].advantages == trained[0].advantages and masked[1].advantages == trained[1].advantages


def test_sft_imitates_passing_trajectories_with_failed_turns_masked() -> None:
    group = judged_group()
    group[0].turns[1].mask = 0  # a failed turn inside a passing trajectory
    samples, summary = samples_from(group + other_groups(), objective="sft")
    assert [s.trajectory_id for s in samples] == ["t0", "t3", "e0", "e1"]  # no pass-rate filter for SFT
    t0 = samples[0]
    assert t0.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0]
    assert t0.advantages == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert all(a == float(m) for s in samples for a, m in zip(s.advantages, s.loss_mask))
    assert (summary["trajectories_failed"], summary["groups_kept"], summary["turns_masked"]) == (4, 2, 1)
    with pytest.raises(ValueError, match="objective must be one of grpo, sft"):
        samples_from(group, objective="ppo")


# ---------------------------------------------------------------- pack and collate


def sample(ids: list[int], logprobs: bool = True) -> Sample:
    n = len(ids)
    return Sample(
        ids=ids,
        loss_mask=[0] + [1] * (n - 1),
        advantages=[0.0] + [0.5] * (n - 1),
        rollout_logprobs=[0.0] + [-0.1] * (n - 1) if logprobs else None,
        group_id="g",
        trajectory_id=str(ids[0]),
        turns=[0],
    )


def test_pack_keeps_each_padded_batch_within_the_budget() -> None:
    samples = [sample(list(range(1, n + 1))) for n in (5, 3, 8, 2, 7, 20, 3)]
    batches = pack(samples, max_tokens=16)
    # longest first: [20] alone (over budget), [8, 7] (2·8 = 16), [5, 3, 3] (3·5 = 15), then 2 (4·5 = 20 > 16)
    assert [[len(s.ids) for s in b] for b in batches] == [[20], [8, 7], [5, 3, 3], [2]]
    assert all(len(b) * max(len(s.ids) for s in b) <= 16 for b in batches if len(b) > 1)
    assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)
    assert batches == pack(samples, max_tokens=16)
    assert [s is samples[1] for s in batches[2][1:]] == [True, False]  # equal lengths keep their input order


def test_collate_shifts_targets_and_masks_padding() -> None:
    batch = [sample([5, 6, 7, 8]), sample([9, 10], logprobs=False)]
    batch[0].loss_mask = [0, 0, 1, 1]
    batch[0].old_logprobs = [0.0, -0.2, -0.3, -0.4]  # π_old, as the trainer sets it before the first step
    tensors = collate(batch, pad_id=0)
    assert tensors["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert tensors["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert tensors["targets"].tolist() == [[6, 7, 8], [10, 0, 0]]  # targets[b, t] == input_ids[b, t + 1]
    assert torch.equal(tensors["targets"], tensors["input_ids"][:, 1:])
    assert tensors["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]  # token t + 1's mask; padding 0
    assert close(tensors["advantages"], [[0.5, 0.5, 0.5], [0.5, 0, 0]])
    assert close(tensors["rollout_logprobs"], [[-0.1, -0.1, -0.1], [0, 0, 0]])  # missing: 0
    assert close(tensors["old_logprobs"], [[-0.2, -0.3, -0.4], [0, 0, 0]])  # not computed yet: 0
    assert tensors["has_rollout_logprobs"].item() is False
    assert collate(batch[:1], pad_id=0)["has_rollout_logprobs"].item() is True
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        "input_ids": (2, 4),
        "attention_mask": (2, 4),
        "targets": (2, 3),
        "loss_mask": (2, 3),
        "advantages": (2, 3),
        "rollout_logprobs": (2, 3),
        "old_logprobs": (2, 3),
        "has_rollout_logprobs": (),
    }
    assert tensors["input_ids"].dtype == tensors["targets"].dtype == torch.long
    assert tensors["loss_mask"].dtype == tensors["advantages"].dtype == torch.float32


def test_collated_samples_train_exactly_the_completion_tokens() -> None:
    samples, _ = samples_from(judged_group(), rule=population_rule(lam=0.5))
    tensors = collate(samples, pad_id=-1)
    trained = tensors["targets"][tensors["loss_mask"].bool()].tolist()
    assert trained == [10, 11, 12, 20, 21, 22, 31, 32, 40]
    assert close(tensors["advantages"][tensors["loss_mask"].bool()], [1.5, 1.5, 0.5, -1.5, -1.5, -1.5, -0.5, -0.5, 1])
    assert close(tensors["rollout_logprobs"][tensors["loss_mask"].bool()], [-t / 100 for t in trained])


def test_a_rolled_back_reply_is_trained_only_when_the_judge_penalised_it() -> None:
    dropped = {"rolled_back": True}
    penalised = {"rolled_back": True, "critic": {"rolled_back": True}, "reward": -1.0}
    group = [
        trajectory("p0", "q", 1.0, ([1, 2], [30], penalised), ([1, 2], [31], {"reward": 1.0})),
        trajectory("p1", "q", 0.0, ([1, 2], [40], dropped), ([1, 2], [41], {"reward": 1.0})),
    ]
    samples, summary = samples_from(group, rule=GroupRule(lam=1.0))
    rows = {(s.trajectory_id, s.ids[-1]): s for s in samples}
    # p0's penalised reply is trained, below its rollout's other turn; p1's plain rollback trains nothing
    assert rows[("p0", 30)].loss_mask == [0, 0, 1] and rows[("p0", 30)].advantages[-1] < rows[("p0", 31)].advantages[-1]
    assert ("p1", 40) not in rows and rows[("p1", 41)].loss_mask == [0, 0, 1]
    assert summary["turns_masked"] == 1 and summary["turns_trained"] == 3


def test_packed_rows_hold_samples_end_to_end_with_positions_restarting() -> None:
    rows = [sample([1, 2, 3, 4, 5]), sample([6, 7, 8]), sample([9, 10]), sample([11, 12, 13, 14, 15, 16, 17])]
    for row in rows:
        row.loss_mask = [0] + [1] * (len(row.ids) - 1)
        row.old_logprobs = [0.0] + [-0.5] * (len(row.ids) - 1)
    packed = pack_rows(rows, max_tokens=8)
    assert [[len(s.ids) for s in row] for row in packed] == [[7], [5, 3], [2]]  # longest first, first fit
    tensors = collate_packed(packed[1], pad_id=0)
    assert tensors["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert tensors["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert tensors["attention_mask"].tolist() == [[1] * 8]  # no padding
    # position 4 (token 5, the first sample's last) would predict token 6, the second sample's prompt: mask 0
    assert tensors["loss_mask"].tolist() == [[1, 1, 1, 1, 0, 1, 1]]
    assert close(tensors["old_logprobs"], [[-0.5, -0.5, -0.5, -0.5, 0.0, -0.5, -0.5]])
    assert close(tensors["advantages"], [[0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5]])
    assert pack_rows([sample(list(range(1, 12)))], max_tokens=8)[0][0].ids == list(range(1, 12))  # too long: alone


def test_epochs_are_reshuffled_passes_over_the_batch_of_rollouts(tmp_path: Any) -> None:
    from nanbeige.trainer.rollouts import plan_steps
    from nanbeige.trainer.train import TrainConfig

    rows = [sample(list(range(k, k + 10))) for k in range(1, 7)]  # 10 tokens each
    config = TrainConfig(data=[], model="m", out=tmp_path, step_tokens=20)
    one = plan_steps(rows, config)
    assert [len(step) for step in one] == [2, 2, 2]  # mini-batches of 20 tokens
    two = plan_steps(rows, replace(config, epochs=2))
    assert len(two) == 6 and two[:3] == one and two[3:] != one  # the second pass is another order
    assert sorted(id(s) for step in two[3:] for s in step) == sorted(id(s) for s in rows)
    assert len(plan_steps(rows, replace(config, epochs=2, steps=4))) == 4  # --steps caps (or extends) them
