"""On-policy difficulty filtering, as Nanbeige4.1 does it for code RL: n = 8 rollouts per problem, and GRPO
trains only on the problems the current policy solves sometimes but not mostly. Stage 1 keeps problems
solved by 1 to 5 of the 8 rollouts; stage 2 keeps those with 1 to 5 of 8 rollouts that are solved and of
optimal time complexity. `GroupRule.counts` says what is counted (`pass`: outcome reward > 0, `solved`,
`complexity`: the code grader's record in `trajectory.judge`), `GroupRule.k_of_n` the band; on the command
line `nanbeige train --filter-counts solved --keep 1-5/8`. The trainer and the loop's dynamic sampling
decide with one function, `batches.group_verdict`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from test_judge import write
from typer.testing import CliRunner

from nanbeige.agent.cli.program import app
from nanbeige.agent.run.tokens import TokenTracker
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.trainer.advantages import keep_k_of_n
from nanbeige.trainer.batches import GroupRule, counted, describe_band, group_verdict, samples_from
from nanbeige.trainer.loop_config import LoopConfig
from nanbeige.trainer.train_config import TrainConfig

STAGE_1 = GroupRule(counts="solved", k_of_n=(1, 5, 8))
STAGE_2 = GroupRule(counts="complexity", k_of_n=(1, 5, 8))


def rollout(
    tid: str, group: str, reward: float, judge: dict[str, Any] | None = None, stop: str | None = "answered"
) -> Trajectory:
    """A judged one-turn rollout with a token record (so it can train), its grader's record in `judge`."""
    result = Trajectory(question="q", id=tid, group_id=group, reward=reward, judge=judge, stop_reason=stop)
    turn = Turn(index=0, assistant={"content": ""}, logprobs=[-0.1, -0.2])
    TokenTracker().record(turn, [1, 2, 3], [4, 5])
    result.turns.append(turn)
    return result


def problem(group: str, solved: int, n: int = 8, optimal: int = 0) -> list[Trajectory]:
    """n rollouts of one problem: the first `solved` pass every test (reward 1), `optimal` of those also at
    the optimal time complexity; the rest fail (reward 0)."""
    return [
        rollout(
            f"{group}-{i}",
            group,
            1.0 if i < solved else 0.0,
            {"solved": i < solved, **({"complexity_ok": True} if i < optimal else {})},
        )
        for i in range(n)
    ]


def kept_groups(trajectories: list[Trajectory], rule: GroupRule) -> tuple[int, int, int]:
    """(kept, too easy, too hard) as `samples_from` counts them."""
    _, summary = samples_from(trajectories, rule=rule)
    return summary["groups_kept"], summary["groups_too_easy"], summary["groups_too_hard"]


# ---------------------------------------------------------------- what is kept


@pytest.mark.parametrize(
    ("solved", "verdict"),
    [(0, "too hard"), (1, "kept"), (3, "kept"), (5, "kept"), (6, "too easy"), (7, "too easy"), (8, "too easy")],
)
def test_stage_one_keeps_problems_solved_by_1_to_5_of_8(solved: int, verdict: str) -> None:
    group = problem("p", solved)
    assert group_verdict(group, STAGE_1) == verdict
    assert kept_groups(group, STAGE_1) == (verdict == "kept", verdict == "too easy", verdict == "too hard")


def test_the_paper_band_drops_6_and_7_of_8_that_the_default_band_keeps() -> None:
    # the default 10%-90% pass-rate band keeps 1 to 7 of 8: the paper's band is narrower at the top
    for solved in (6, 7):
        assert group_verdict(problem("p", solved), GroupRule()) == "kept"
        assert group_verdict(problem("p", solved), GroupRule(counts="solved")) == "kept"
        assert group_verdict(problem("p", solved), STAGE_1) == "too easy"


def test_stage_two_counts_rollouts_solved_at_optimal_complexity() -> None:
    # every rollout solves it (stage 1 calls it too easy), 3 at the optimal complexity: stage 2 trains on it
    all_solved = problem("p", solved=8, optimal=3)
    assert group_verdict(all_solved, STAGE_1) == "too easy"
    assert group_verdict(all_solved, STAGE_2) == "kept"
    assert group_verdict(problem("p", solved=8, optimal=0), STAGE_2) == "too hard"
    assert group_verdict(problem("p", solved=8, optimal=6), STAGE_2) == "too easy"
    assert kept_groups(
        problem("a", 8, optimal=3) + problem("b", 8, optimal=0) + problem("c", 8, optimal=7), STAGE_2
    ) == (1, 1, 1)


def test_a_reward_without_the_graders_solved_does_not_count_as_solved() -> None:
    # partial credit: reward > 0, but the grader's record says not every test passed, or says nothing
    partial = rollout("a", "p", 0.5, {"solved": False})
    for unsolved in (
        partial,
        rollout("b", "p", 1.0, None),
        rollout("c", "p", 1.0, {}),
        rollout("d", "p", 1.0, {"solved": 1}),
        rollout("e", "p", 1.0, {"solved": "true"}),
    ):
        assert counted(unsolved, "pass") and not counted(unsolved, "solved")
    assert not counted(rollout("f", "p", 1.0, {"solved": True}), "complexity")  # no complexity_ok: not satisfying
    assert counted(rollout("g", "p", 1.0, {"solved": True, "complexity_ok": True}), "complexity")
    # 4 of 8 pass on reward, none is solved: counting passes keeps the group, counting solved drops it
    group = [rollout(f"r{i}", "p", 0.5 if i < 4 else 0.0, {"solved": False}) for i in range(8)]
    assert group_verdict(group, GroupRule(k_of_n=(1, 5, 8))) == "kept"
    assert group_verdict(group, STAGE_1) == "too hard"


def test_the_pass_rate_band_counts_what_counts_says() -> None:
    # all 8 pass on reward (partial credit), 4 solved: too easy by passes, kept by the solved fraction 50%
    group = [rollout(f"r{i}", "p", 1.0 if i < 4 else 0.5, {"solved": i < 4}) for i in range(8)]
    assert group_verdict(group, GroupRule()) == "too easy"
    assert group_verdict(group, GroupRule(counts="solved")) == "kept"


@pytest.mark.parametrize(
    ("solved", "verdict"), [(0, "too hard"), (1, "kept"), (4, "kept"), (5, "too easy"), (7, "too easy")]
)
def test_a_group_of_7_keeps_the_same_fractions_as_1_to_5_of_8(solved: int, verdict: str) -> None:
    # one of the 8 rollouts crashed and is left out: 7 usable, kept for 1/8 <= k/7 <= 5/8, i.e. 1 to 4
    # (5 of 7 = 71% is more than 5 of 8 = 62.5%)
    group = problem("p", solved, n=7) + [rollout("crashed", "p", 0.0, None, stop=None)]
    assert kept_groups(group, STAGE_1) == (verdict == "kept", verdict == "too easy", verdict == "too hard")
    assert [k for k in range(8) if keep_k_of_n(k, 7, 1, 5, 8)] == [1, 2, 3, 4]


def test_the_k_of_n_bounds_are_exact_integers_and_inclusive() -> None:
    # 16 rollouts against 1-5/8: 2 and 10 of 16 are exactly 1/8 and 5/8, kept; 1 and 11 are not
    assert [k for k in range(17) if keep_k_of_n(k, 16, 1, 5, 8)] == list(range(2, 11))
    # 3 of 10 against 3/10 and 1 of 3 against 1/3 sit on the bound: k·n == low·m, kept
    assert keep_k_of_n(3, 10, 3, 5, 10) and keep_k_of_n(1, 3, 1, 1, 3) and not keep_k_of_n(1, 3, 2, 3, 3)


def test_the_rule_in_force_is_described_in_words() -> None:
    assert describe_band(STAGE_1) == "1 to 5 of 8 solved"
    assert describe_band(STAGE_2) == "1 to 5 of 8 solved at optimal complexity"
    assert describe_band(GroupRule()) == "a pass rate between 0.1 and 0.9"


def test_nothing_in_the_band_is_an_error_naming_the_rule(tmp_path: Path) -> None:
    from nanbeige.trainer.model import TrainError
    from nanbeige.trainer.rollouts import read_samples

    data = write(tmp_path / "judged.jsonl", problem("p", solved=8) + problem("q", solved=0))
    config = TrainConfig(data=[data], model=str(tmp_path / "no-model"), out=tmp_path / "out", groups=STAGE_1)
    with pytest.raises(
        TrainError,
        match=r"nothing to train on: .*GRPO keeps groups with 1 to 5 of 8 solved; "
        r"check the grader's records \(judge\[\"solved\"\]\)",
    ):
        read_samples(config)
    config.groups = GroupRule(counts="nonsense")
    with pytest.raises(TrainError, match="counts pass, solved or complexity, not 'nonsense'"):
        read_samples(config)


# ---------------------------------------------------------------- the loop uses the same rule


def test_the_loops_dynamic_sampling_counts_groups_with_the_trainers_rule(tmp_path: Path) -> None:
    from nanbeige.agent.trajectory.trajectory_file import load_trajectories
    from nanbeige.trainer.rl_loop import informative_groups

    # 3 of 8 solved (kept either way); 7 of 8 solved (the default band keeps it, stage 1 does not)
    judged = write(tmp_path / "judged.jsonl", problem("a", 3) + problem("b", 7) + problem("c", 0))
    for rule, kept in ((GroupRule(), 2), (STAGE_1, 1), (GroupRule(counts="solved", k_of_n=(0, 8, 8)), 3)):
        config = TrainConfig(data=[], model="m", out=tmp_path, groups=rule)
        assert informative_groups(load_trajectories(judged), config) == (kept, 3)
        assert kept_groups(load_trajectories(judged), rule)[0] == kept  # what the trainer then keeps


# ---------------------------------------------------------------- the command line


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    """The configs `nanbeige train` would train with; nothing trains."""
    configs: list[TrainConfig] = []

    def fake_train(config: TrainConfig, resume: bool = False, log: Any = None) -> dict[str, Any]:
        configs.append(config)
        return {"checkpoint": None}

    monkeypatch.setattr("nanbeige.trainer.train.train", fake_train)
    return configs


def train(tmp_path: Path, *flags: str) -> Result:
    return CliRunner().invoke(
        app, ["train", "--model", "m", "--out", str(tmp_path / "out"), "--data", str(tmp_path / "judged.jsonl"), *flags]
    )


def test_the_flags_map_onto_the_group_rule(tmp_path: Path, trained: list[TrainConfig]) -> None:
    for flags, counts, k_of_n in (
        (["--filter-counts", "solved", "--keep", "1-5/8"], "solved", (1, 5, 8)),
        (["--filter-counts", "complexity", "--keep", "1-5/8"], "complexity", (1, 5, 8)),
        (["--keep", "0-3/4"], "pass", (0, 3, 4)),
        ([], "pass", None),
    ):
        result = train(tmp_path, *flags)
        assert result.exit_code == 0, result.output
        rule = trained[-1].groups
        assert (rule.counts, rule.k_of_n) == (counts, k_of_n), flags
    assert (rule.min_pass_rate, rule.max_pass_rate) == (0.1, 0.9)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--keep", "5-1/8"], ["--keep", "'5-1/8'", "not a range"]),
        (["--keep", "0-9/8"], ["--keep", "9 is more than the 8 rollouts"]),
        (["--keep", "1-5/4"], ["--keep", "5 is more than the 4 rollouts"]),
        (["--keep", "a-b/c"], ["--keep", "'a-b/c' is not K-M/N"]),
        (["--keep", "1..5/8"], ["--keep", "is not K-M/N"]),
        (["--keep", "1-5/0"], ["--keep", "n is 0"]),
        (["--filter-counts", "tests"], ["--filter-counts must be pass, solved or complexity, not 'tests'"]),
        (["--keep", "1-5/8", "--min-pass-rate", "0.2"], ["--keep", "--min-pass-rate", "not both"]),
        (["--keep", "1-5/8", "--max-pass-rate", "0.5"], ["--keep", "--max-pass-rate", "not both"]),
        (["--keep", "1-5/8", "--objective", "sft"], ["--keep filters GRPO's groups", "no group filter"]),
    ],
)
def test_bad_filter_flags_are_one_line_and_exit_2(
    tmp_path: Path, trained: list[TrainConfig], flags: list[str], words: list[str]
) -> None:
    result = train(tmp_path, *flags)
    assert result.exit_code == 2 and trained == []
    [line] = result.output.strip().splitlines()
    assert line.startswith("error:")
    for word in words:
        assert word in line, line


def test_for_code_a_pass_is_a_solved_problem_not_a_reward_above_zero() -> None:
    half_right = []
    for index in range(8):
        trajectory = Trajectory(question="q", id=f"t{index}", group_id="p")
        trajectory.reward, trajectory.judge = 0.5, {"grader": "code-tests", "solved": index == 0}
        half_right.append(trajectory)
    # eight programs passing half their tests, one solving the problem: 1 of 8 passes, not 8 of 8
    assert sum(counted(t, "pass") for t in half_right) == 1
    assert group_verdict(half_right, GroupRule()) == "kept"


def test_the_loop_takes_code_problems_and_judges_them_by_their_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loops: list[LoopConfig] = []
    monkeypatch.setattr("nanbeige.agent.cli.train_commands.run_train_loop", loops.append)
    problems = tmp_path / "problems.jsonl"
    base = ["train", "--model", "m", "--out", str(tmp_path / "loop"), "--loop", "1", "--no-critic"]
    judge_env = {"NANBEIGE_JUDGE_BASE_URL": "http://127.0.0.1:9/v1", "NANBEIGE_JUDGE_MODEL": "judge"}
    result = CliRunner().invoke(
        app,
        [*base, "--problems", str(problems), "--filter-counts", "solved", "--keep", "1-5/8", "--time-reward"],
        env=judge_env,
    )
    assert result.exit_code == 0, result.output
    [loop] = loops
    judge, train_config = loop.judge, loop.train
    assert loop.questions == problems and (judge.grader, judge.problems, judge.time_reward) == (
        "code-tests",
        problems,
        True,
    )
    assert (judge.complexity.base_url, judge.complexity.model) == ("http://127.0.0.1:9/v1", "judge")
    assert (train_config.groups.counts, train_config.groups.k_of_n) == ("solved", (1, 5, 8))
    loops.clear()
    with_f1 = CliRunner().invoke(app, [*base, "--questions", str(problems), "--grader", "token-f1"])
    assert with_f1.exit_code == 0 and loops[0].judge.grader == "token-f1", with_f1.output
    for flags, words in (
        (["--time-reward", "--questions", str(problems)], "--time-reward rewards code problems"),
        (["--questions", str(problems), "--problems", str(problems)], "one of them"),
        (["--problems", str(problems), "--grader", "token-f1"], "code problems are graded by their tests"),
    ):
        refused = CliRunner().invoke(app, [*base, *flags])
        assert refused.exit_code == 2 and words in refused.output, refused.output


def test_a_batch_where_every_group_failed_and_no_rollout_called_a_tool_says_so(tmp_path: Path) -> None:
    """What a starting policy too weak for a search task gives the loop (SmolLM2-135M never called the search
    tool in 175 rollouts): every reward 0, so GRPO has no signal; the error says why, not only the band."""
    from nanbeige.trainer.model import TrainError
    from nanbeige.trainer.rollouts import read_samples

    rollouts = problem("p", solved=0) + problem("q", solved=0)
    for trajectory in rollouts:
        trajectory.tools = [{"server": "search", "name": "google_search", "description": "", "input_schema": {}}]
    data = write(tmp_path / "judged.jsonl", rollouts)
    config = TrainConfig(data=[data], model=str(tmp_path / "no-model"), out=tmp_path / "out")
    with pytest.raises(TrainError, match=r"every group failed \(16 rollouts, none passed\).*no rollout called a tool"):
        read_samples(config)
