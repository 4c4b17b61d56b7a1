"""`--grader token-f1`: partial credit for a short answer, SQuAD's word-overlap F1, held against the real
counterpart (torchmetrics' SQuAD metric, which follows the official evaluation script), and what it means
for GRPO: the reward is the F1, a group "passes" only where an answer is fully right, and a group none of
whose answers is fully right still trains with `--min-pass-rate 0`, its rewards compared."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_difficulty_filter import rollout
from test_judge import make, write
from torchmetrics.functional.text.squad import _compute_exact_match_score, _compute_f1_score

from nanbeige.evals.token_f1 import TOKEN_F1, f1, grade_f1
from nanbeige.trainer.batches import GroupRule, samples_from
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.rewards import judge_file
from nanbeige.trainer.rollouts import rollout_summary
from nanbeige.trainer.train_config import TrainConfig

CASES = [
    ("Paris", "Paris"),
    ("The capital of France is Paris.", "Paris"),
    ("Le Jura is the capital of France.", "Paris"),
    ("paris!!", "Paris"),
    ("Paris Paris Paris", "Paris"),
    ("Paris, London, Berlin, Rome", "Paris"),
    ("2 + 2 = 4", "4"),
    ("an apple a day", "The Apple"),
    ("The", "a"),  # both empty once the articles go
    ("", "Paris"),
    ("Ulaanbaatar (Ulan Bator)", "Ulaanbaatar"),
    ("Thé café", "the cafe"),  # accents are words of their own: not folded
    ("New  York\tCity", "new york city"),
    ("1,000", "1000"),
]


@pytest.mark.parametrize(("answer", "reference"), CASES)
def test_f1_and_exact_match_are_torchmetrics_squad(answer: str, reference: str) -> None:
    assert f1(answer, reference) == pytest.approx(float(_compute_f1_score(answer, reference)), abs=1e-6)
    verdict = grade_f1(answer, reference)
    assert verdict.correct is bool(_compute_exact_match_score(answer, reference))
    assert verdict.score == pytest.approx(f1(answer, reference)) and verdict.grader == TOKEN_F1


def test_f1_is_torchmetrics_squad_on_random_answers() -> None:
    words = ["the", "a", "an", "Paris", "paris.", "France", "capital", "of", "is", ",", "4", "2+2", "THE", "Ann"]
    draw = random.Random(7)
    for _ in range(500):
        answer = " ".join(draw.choices(words, k=draw.randint(0, 6)))
        reference = " ".join(draw.choices(words, k=draw.randint(1, 3)))
        expected = float(_compute_f1_score(answer, reference))
        assert f1(answer, reference) == pytest.approx(expected, abs=1e-6), (answer, reference)


def test_no_answer_scores_nothing_and_nothing_beats_the_exact_answer() -> None:
    assert grade_f1(None, "Paris").score == 0.0 and grade_f1(None, "Paris").correct is False
    # a policy that wants the reward without knowing the answer: hedging, repeating, padding all cost
    for hedge in ["Paris Paris", "Paris or Lyon", "It is Paris", "Paris, France", "PARIS is it"]:
        assert grade_f1(hedge, "Paris").score < grade_f1("Paris", "Paris").score == 1.0


def test_what_it_pays_without_the_answer_is_what_its_docs_say() -> None:
    """A hedge and a common word earn partial credit: the documented price of partial credit, pinned so that
    the docs (evals/token_f1.py, docs/index.md) stay true."""
    assert f1("Paris Lyon", "Paris") == pytest.approx(2 / 3) and f1("Paris Lyon Nice", "Paris") == 0.5
    assert f1("of", "Battle of Hastings") == 0.5
    assert grade_f1("Paris Lyon", "Paris").correct is False  # never a pass: the group filter does not count it


@pytest.mark.anyio
async def test_judge_writes_the_f1_as_the_reward_and_the_exact_match_as_correct(tmp_path: Path) -> None:
    src = write(
        tmp_path / "rollouts.jsonl",
        [make("right", answer="Paris"), make("sentence", answer="The capital is Paris."), make("wrong", "Lyon")],
    )
    out = tmp_path / "judged.jsonl"
    await judge_file(src, out, JudgeRunConfig(grader=TOKEN_F1, no_critic=True))
    from nanbeige.agent.trajectory.trajectory_file import load_trajectories

    judged = {t.id: t for t in load_trajectories(out)}
    assert [judged[i].reward for i in ("right", "sentence", "wrong")] == [1.0, pytest.approx(0.5), 0.0]
    assert judged["sentence"].judge["correct"] is False and judged["sentence"].judge["score"] == pytest.approx(0.5)
    assert judged["right"].judge == judged["right"].judge | {"grader": TOKEN_F1, "correct": True, "score": 1.0}


def partial_group(group: str, scores: list[float]) -> list:
    """Rollouts `token-f1` graded: their F1 the reward, correct only at 1.0."""
    return [
        rollout(f"{group}-{i}", group, score, {"grader": TOKEN_F1, "correct": score == 1.0, "score": score})
        for i, score in enumerate(scores)
    ]


def test_partial_credit_is_not_a_pass_but_trains_with_min_pass_rate_0() -> None:
    sentences = partial_group("g", [0.33, 0.2, 0.0, 0.5])
    _, default = samples_from(sentences)
    assert default["groups_too_hard"] == 1 and default["samples"] == 0  # none fully right: no pass
    samples, kept = samples_from(sentences, rule=GroupRule(min_pass_rate=0.0))
    assert kept["groups_kept"] == 1 and kept["samples"] == 4
    advantages = [sample.advantages[-1] for sample in samples]
    assert advantages[3] > advantages[0] > advantages[1] > advantages[2]  # the F1 ordered them
    one_right = partial_group("h", [1.0, 0.33, 0.2, 0.0])
    assert samples_from(one_right)[1]["groups_kept"] == 1 and rollout_summary(one_right)["pass_rate"] == 0.25


def test_nothing_to_train_on_says_the_partial_credit_and_the_flag(tmp_path: Path) -> None:
    from nanbeige.trainer.model import TrainError
    from nanbeige.trainer.rollouts import read_samples

    data = write(tmp_path / "judged.jsonl", partial_group("g", [0.33, 0.2, 0.0, 0.5]))
    config = TrainConfig(data=[data], model=str(tmp_path / "no-model"), out=tmp_path / "out")
    with pytest.raises(TrainError, match=r"partial credit \(mean reward 0.258\): --min-pass-rate 0 keeps"):
        read_samples(config)
