"""What `nanbeige judge` is told (`JudgeRunConfig`), which grader each trajectory gets, and the checks that
refuse a run the user must fix first. The checks run before anything is judged, so a wrong flag or a missing key
costs no judge call and leaves OUT as it was."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.evals import judges
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.code_tests import CodeRewards
from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.evals.token_f1 import TOKEN_F1
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.tools.errors import NanbeigeError
from nanbeige.trainer.critic import CRITIC_ENDPOINT, TurnRule

EXACT = "gaia-exact"


class JudgeError(NanbeigeError):
    """Something the user must fix before judging can go on; one line naming the fix."""


@dataclass
class JudgeRunConfig:
    """What `judge_file` does and which endpoints it asks."""

    grader: str | None = None
    """`gaia-exact`, `token-f1`, `code-tests` or a judge profile's full name (`browsecomp/reference`,
    `hle/official`, ...) for every trajectory; None: each trajectory's own `grader`."""
    problems: Path | None = None
    """The code problems file (`evals/code_problems.py`) whose tests `code-tests` runs: a trajectory's
    problem is the one whose id is its question id."""
    time_reward: bool = False
    """Code RL's stage 2: add the time reward, the complexity judge's verdict on programs that pass every test
    (asked at `complexity`)."""
    rewards: CodeRewards = field(default_factory=CodeRewards)
    """The weights of the code reward's format and time terms."""
    complexity: ChatEndpoint | None = None
    """The complexity judge's endpoint, with `time_reward`."""
    judge: ChatEndpoint = JUDGE_ENDPOINT
    """The LLM judge's endpoint, for judge-profile graders."""
    critic: ChatEndpoint | None = None
    """The turn critic's endpoint; needed unless `no_critic`."""
    rule: TurnRule = field(default_factory=TurnRule)
    """What the critic's scores mean for each turn's reward and mask."""
    concurrency: int = 8
    """Trajectories judged at a time (a trajectory's turns go to the critic one after another)."""
    no_critic: bool = False
    """Compute the outcome reward alone; turns are left as they are."""
    ray: str | None = None
    """Judge in shards on a Ray cluster (`auto`, or the head's HOST:PORT): a shard per node, each with its own
    clients (and sandbox) and `concurrency` trajectories at once (`rewards_sharded.judge_on_ray`, which
    `nanbeige judge --ray` passes to `judge_file`); None: in this process."""


def chosen_grader(trajectory: Trajectory, config: JudgeRunConfig) -> str | None:
    """`--grader` (a grader, or a family resolved for the trajectory's own grader), else the trajectory's."""
    own = judges.ALIASES.get(trajectory.grader or "", trajectory.grader)
    if config.grader in judges.FAMILIES:
        return judges.in_family(own, config.grader) if own else None
    return config.grader or own


def check(src: Path, out: Path, config: JudgeRunConfig) -> None:
    """Raise `JudgeError` for what the user must fix, before anything is judged."""
    if not src.is_file():
        raise JudgeError(f"{src}: no such trajectory file")
    if out.resolve() == src.resolve():
        raise JudgeError("--out must be another file than the input: judging appends whole trajectories to it")
    from nanbeige.agent.trajectory.writable import unwritable

    problem = unwritable(out)
    if problem:
        raise JudgeError(f"cannot write --out {out}: {problem}")
    if config.grader is not None and config.grader not in (
        EXACT,
        TOKEN_F1,
        CODE_TESTS,
        *judges.PROFILES,
        *judges.FAMILIES,
    ):
        raise JudgeError(
            f"--grader must be a family ({', '.join(judges.FAMILIES)}: each trajectory's benchmark's "
            f"grader of that family), {EXACT}, {TOKEN_F1}, {CODE_TESTS} or one of {', '.join(judges.PROFILES)}, not "
            f"{config.grader!r}"
        )
    if config.problems is not None and not config.problems.is_file():
        raise JudgeError(f"--problems {config.problems}: no such file")
    if config.grader == CODE_TESTS and config.problems is None:
        raise JudgeError(
            f"--grader {CODE_TESTS} runs each program against its problem's tests: pass --problems FILE "
            "(`nanbeige problems humaneval --out FILE` writes HumanEval's)"
        )
    if config.time_reward and config.complexity is None:
        raise JudgeError(
            "--time-reward asks a judge model about each solved program's complexity: it needs the judge endpoint"
        )
    if config.concurrency < 1:
        raise JudgeError("--concurrency must be at least 1")
    if config.rule.failed not in ("mask", "penalise"):
        raise JudgeError(f"the rule for failed turns must be mask or penalise, not {config.rule.failed!r}")
    for name, template in (
        ("--judge-template", config.judge.template),
        ("--critic-template", config.critic.template if config.critic else None),
    ):
        if template is not None and not template.is_file():
            raise JudgeError(f"{name} {template}: no such file")
    if config.no_critic:
        return
    if config.critic is None:
        raise JudgeError(
            "the turn critic needs an endpoint: pass --critic-base-url and --critic-model, "
            "or --no-critic for the outcome reward alone"
        )
    if config.critic.base_url == CRITIC_ENDPOINT.base_url and not config.critic.api_key:
        raise JudgeError(
            f"the critic is {config.critic.model} at {CRITIC_ENDPOINT.base_url}: set its API key, or "
            "pass --critic-base-url for another OpenAI-compatible endpoint"
        )


def check_judge_endpoint(trajectories: list[Trajectory], config: JudgeRunConfig) -> None:
    """Refuse to start when some trajectory needs the LLM judge and it cannot be reached as configured, or
    needs code problems that were not given."""
    code = [t for t in trajectories if chosen_grader(t, config) == CODE_TESTS]
    if code and config.problems is None:
        raise JudgeError(
            f"{len(code)} trajectories are graded by {CODE_TESTS}, which runs each program against its "
            "problem's tests: pass --problems FILE (`nanbeige problems humaneval --out FILE` writes "
            "HumanEval's)"
        )
    complexity = config.complexity
    if (
        code
        and config.time_reward
        and complexity is not None
        and complexity.base_url == JUDGE_ENDPOINT.base_url
        and not complexity.api_key
    ):
        raise JudgeError(
            f"--time-reward asks {complexity.model} at {complexity.base_url} about each solved "
            "program: set NANBEIGE_JUDGE_API_KEY, or pass --judge-base-url (and --judge-model) for "
            "another OpenAI-compatible endpoint"
        )
    needs = {chosen_grader(t, config) for t in trajectories if t.reference_answer is not None} & set(judges.PROFILES)
    if needs and config.judge.base_url == JUDGE_ENDPOINT.base_url and not config.judge.api_key:
        models = sorted({config.judge.model or judges.PROFILES[name].model for name in needs})
        raise JudgeError(
            f"grading with {', '.join(sorted(needs))} asks {', '.join(models)} at "
            f"{JUDGE_ENDPOINT.base_url}: set NANBEIGE_JUDGE_API_KEY, or pass --judge-base-url "
            f"(and --judge-model) for another OpenAI-compatible endpoint, or --grader {EXACT}"
        )
