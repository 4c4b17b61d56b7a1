"""Judging trajectories for training: `nanbeige judge IN --out OUT`.

Each finished trajectory in IN gets
- an outcome reward: its answer graded against its reference answer, 1.0 right, 0.0 wrong, None when
  there is no reference answer or the grader could not decide (`trajectory.reward`, `trajectory.judge`);
- unless `no_critic`, a critic verdict on every turn, turned into the turn's reward and mask by the
  `TurnRule` (`turn.critic`, `turn.reward`, `turn.mask`; see `critic.py`).

It is then written whole to OUT (start record, every turn, end record), everything else unchanged, token
fields included. Trajectories still running or cut short (`interrupted`, `crashed`, `model_error`) are
skipped. OUT is appended to: a trajectory already complete there (an end record) is not judged again, so
an interrupted judge run resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from nanbeige.agent.records import encoded, record_line
from nanbeige.agent.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory_file import (
    TrajectoryWriter,
    end_record,
    load_trajectories,
    read_records,
    start_record,
    turn_record,
    warn_on_stderr,
)
from nanbeige.evals import gaia_scorer, judges
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.code_tests import CodeRewards
from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.evals.runner import final_response
from nanbeige.evals.tasks import Verdict
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.trainer.code_rewards import CodeJudgeError, CodeJudging, NanbeigeError, judge_code, open_code_judging
from nanbeige.trainer.critic import CRITIC_ENDPOINT, CriticUnreachable, TurnRule, judge_turn, load_template

CUT_SHORT = ("interrupted", "crashed", "model_error")
EXACT = "gaia-exact"
CRITIC_TIMED_OUT = "critic did not answer within"
"""How `critique` records a turn whose every call timed out (the wording of `evals.endpoint`)."""
CRITIC_DOWN_AFTER = 3
"""Turns in a row the critic may leave unanswered in time before the run stops. One is a slow turn; several
in a row are a critic that hangs, which would otherwise cost timeout x retries on every turn of every
trajectory, for hours, and record them all unjudged."""


class JudgeError(NanbeigeError):
    """Something the user must fix before judging can go on; one line naming the fix."""


@dataclass
class JudgeRunConfig:
    """What `judge_file` does and which endpoints it asks."""

    grader: str | None = None
    """`gaia-exact`, `code-tests` or a judge profile's full name (`browsecomp/reference`, `hle/official`, ...)
    for every trajectory; None: each trajectory's own `grader`."""
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


@dataclass
class JudgeProgress:
    """Counts a progress display reads while judging runs."""

    total: int = 0
    """Trajectories to judge in this run (not counting those already judged in OUT)."""
    done: int = 0
    running: int = 0
    skipped: int = 0
    """Trajectories not judged because they are unfinished or were cut short."""
    already_judged: int = 0
    """Trajectories complete in OUT before this run."""
    rewarded: int = 0
    """Judged trajectories with an outcome reward (not None)."""
    reward_sum: float = 0.0
    outcome_errors: int = 0
    """Trajectories whose outcome could not be graded (no reference answer, a judge that failed)."""
    turns_judged: int = 0
    masked_turns: int = 0
    critic_failures: int = 0
    """Turns the critic gave no usable scores for (recorded unjudged)."""
    started: float = field(default_factory=time.monotonic)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def count(self, trajectory: Trajectory) -> None:
        """Add one judged trajectory."""
        self.done += 1
        if trajectory.reward is None:
            self.outcome_errors += 1
        else:
            self.rewarded, self.reward_sum = self.rewarded + 1, self.reward_sum + trajectory.reward
        for turn in trajectory.turns:
            critic = turn.critic or {}
            self.turns_judged += bool(critic)
            self.masked_turns += bool(critic) and turn.mask == 0
            self.critic_failures += "error" in critic


# ---------------------------------------------------------------- the outcome


def judgeable(trajectory: Trajectory) -> bool:
    """Whether the trajectory ended in a way worth judging (not still running, not cut short)."""
    return trajectory.stop_reason is not None and trajectory.stop_reason not in CUT_SHORT


def verdict_record(verdict: Verdict) -> dict[str, Any]:
    """What `trajectory.judge` holds."""
    return {"grader": verdict.grader, "judge_model": verdict.judge_model, "correct": verdict.correct,
            "extracted": verdict.extracted, "reason": verdict.reason, "error": verdict.error}


async def grade(trajectory: Trajectory, grader: str, config: JudgeRunConfig, client: httpx.AsyncClient) -> Verdict:
    """The grader's verdict on the trajectory's answer against its reference answer."""
    gold = trajectory.reference_answer or ""
    if grader == EXACT:
        return gaia_scorer.grade_exact(trajectory.answer, gold)
    if grader not in judges.PROFILES:
        return Verdict(correct=None, grader=grader, error=f"unknown grader {grader!r}: pass --grader")
    profile = judges.profile_for(grader, config.judge.template)
    if profile.shows == "answer" and trajectory.answer is None:  # as `nanbeige eval` grades it
        return Verdict(correct=False, grader=profile.name, reason="no answer")
    text = trajectory.answer if profile.shows == "answer" else (final_response(trajectory) or trajectory.answer or "")
    try:
        return await judges.judge(profile, trajectory.question, text, gold, config.judge, client)
    except judges.JudgeUnavailable as exc:  # not a verdict: stop, so that a resume grades this one again
        raise JudgeError(f"the outcome judge cannot be used: {naming(str(exc), config.judge.base_url)}; fix the "
                         "judge endpoint (--judge-base-url) and run again to resume") from None


def naming(error: str, base_url: str) -> str:
    """The error with the endpoint's address: a time-out or an HTTP status does not say which server."""
    return error if base_url in error else f"{error} ({base_url})"


def chosen_grader(trajectory: Trajectory, config: JudgeRunConfig) -> str | None:
    """`--grader` (a grader, or a family resolved for the trajectory's own grader), else the trajectory's."""
    own = judges.ALIASES.get(trajectory.grader or "", trajectory.grader)
    if config.grader in judges.FAMILIES:
        return judges.in_family(own, config.grader) if own else None
    return config.grader or own


async def judge_outcome(trajectory: Trajectory, config: JudgeRunConfig, client: httpx.AsyncClient,
                        code: CodeJudging | None = None) -> None:
    """Set the trajectory's `reward` (1.0 / 0.0, or None when undecided; code: `code_rewards.py`) and
    `judge` breakdown."""
    if chosen_grader(trajectory, config) == CODE_TESTS and code is not None:
        try:
            await judge_code(trajectory, code, client)
        except CodeJudgeError as exc:
            raise JudgeError(str(exc)) from None
        return
    if trajectory.reference_answer is None:
        trajectory.reward, trajectory.judge = None, {"error": "no reference answer"}
        return
    grader = chosen_grader(trajectory, config)
    if grader is None:
        trajectory.reward, trajectory.judge = None, {"error": "no grader named: pass --grader"}
        return
    verdict = await grade(trajectory, grader, config, client)
    trajectory.reward = None if verdict.correct is None else float(verdict.correct)
    trajectory.judge = verdict_record(verdict)


# ---------------------------------------------------------------- the file


def completed_ids(out: Path) -> set[str]:
    """Ids of the trajectories complete (with an end record) in OUT; a torn last line is tolerated."""
    if not out.exists() or not out.stat().st_size:
        return set()
    try:
        records = read_records(out, say_torn=True)
    except (OSError, ValueError) as exc:
        raise JudgeError(f"cannot read {out} to resume it ({exc}); pass another --out") from None
    return {r["trajectory_id"] for r in records if r.get("type") == "end" and isinstance(r.get("trajectory_id"), str)}


def writable(trajectory: Trajectory, src: Path) -> bool:
    """Whether the trajectory can be written to OUT. One that cannot (a record nested deeper than the
    encoder goes, read from a crafted file) is skipped, saying where, before anything is asked about it."""
    records = [("start", None, start_record(trajectory)),
               *(("turn", turn.index, turn_record(trajectory.id, turn)) for turn in trajectory.turns),
               ("end", None, end_record(trajectory))]
    for kind, index, record in records:
        try:
            encoded(record)
        except ValueError as exc:
            warn_on_stderr(f"{src}:{record_line(src, trajectory.id, kind, index)}: skipped trajectory "
                           f"{trajectory.id}: {exc}")
            return False
    return True


def gapless(trajectory: Trajectory, src: Path) -> bool:
    """Whether every turn of the trajectory was read. One whose turn the reader skipped (a malformed line,
    named in its warning) is skipped whole: written back without that turn, its token chain would be
    broken and its turn rewards shifted."""
    indices = [turn.index for turn in trajectory.turns]
    if indices == list(range(len(indices))):
        return True
    missing = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
    warn_on_stderr(f"{src}: skipped trajectory {trajectory.id}: its turn {missing[0] if missing else '?'} could "
                   "not be read (see the warning above)")
    return False


def write_whole(writer: TrajectoryWriter, trajectory: Trajectory) -> None:
    # No await between these writes: trajectories judged concurrently never interleave their lines.
    writer.start(trajectory)
    for turn in trajectory.turns:
        writer.turn(trajectory, turn)
    writer.end(trajectory)


def check(src: Path, out: Path, config: JudgeRunConfig) -> None:
    """Raise `JudgeError` for what the user must fix, before anything is judged."""
    if not src.is_file():
        raise JudgeError(f"{src}: no such trajectory file")
    if out.resolve() == src.resolve():
        raise JudgeError("--out must be another file than the input: judging appends whole trajectories to it")
    from nanbeige.agent.writable import unwritable

    problem = unwritable(out)
    if problem:
        raise JudgeError(f"cannot write --out {out}: {problem}")
    if config.grader is not None and config.grader not in (EXACT, CODE_TESTS, *judges.PROFILES, *judges.FAMILIES):
        raise JudgeError(f"--grader must be a family ({', '.join(judges.FAMILIES)}: each trajectory's benchmark's "
                         f"grader of that family), {EXACT}, {CODE_TESTS} or one of {', '.join(judges.PROFILES)}, not "
                         f"{config.grader!r}")
    if config.problems is not None and not config.problems.is_file():
        raise JudgeError(f"--problems {config.problems}: no such file")
    if config.grader == CODE_TESTS and config.problems is None:
        raise JudgeError(f"--grader {CODE_TESTS} runs each program against its problem's tests: pass --problems FILE "
                         "(`nanbeige problems humaneval --out FILE` writes HumanEval's)")
    if config.time_reward and config.complexity is None:
        raise JudgeError("--time-reward asks a judge model about each solved program's complexity: it needs the "
                         "judge endpoint")
    if config.concurrency < 1:
        raise JudgeError("--concurrency must be at least 1")
    if config.rule.failed not in ("mask", "penalise"):
        raise JudgeError(f"the rule for failed turns must be mask or penalise, not {config.rule.failed!r}")
    for name, template in (("--judge-template", config.judge.template),
                           ("--critic-template", config.critic.template if config.critic else None)):
        if template is not None and not template.is_file():
            raise JudgeError(f"{name} {template}: no such file")
    if config.no_critic:
        return
    if config.critic is None:
        raise JudgeError("the turn critic needs an endpoint: pass --critic-base-url and --critic-model, "
                         "or --no-critic for the outcome reward alone")
    if config.critic.base_url == CRITIC_ENDPOINT.base_url and not config.critic.api_key:
        raise JudgeError(f"the critic is {config.critic.model} at {CRITIC_ENDPOINT.base_url}: set its API key, or "
                         "pass --critic-base-url for another OpenAI-compatible endpoint")


def check_judge_endpoint(trajectories: list[Trajectory], config: JudgeRunConfig) -> None:
    """Refuse to start when some trajectory needs the LLM judge and it cannot be reached as configured, or
    needs code problems that were not given."""
    code = [t for t in trajectories if chosen_grader(t, config) == CODE_TESTS]
    if code and config.problems is None:
        raise JudgeError(f"{len(code)} trajectories are graded by {CODE_TESTS}, which runs each program against its "
                         "problem's tests: pass --problems FILE (`nanbeige problems humaneval --out FILE` writes "
                         "HumanEval's)")
    complexity = config.complexity
    if code and config.time_reward and complexity is not None and complexity.base_url == JUDGE_ENDPOINT.base_url \
            and not complexity.api_key:
        raise JudgeError(f"--time-reward asks {complexity.model} at {complexity.base_url} about each solved "
                         "program: set NANBEIGE_JUDGE_API_KEY, or pass --judge-base-url (and --judge-model) for "
                         "another OpenAI-compatible endpoint")
    needs = {chosen_grader(t, config) for t in trajectories if t.reference_answer is not None} & set(judges.PROFILES)
    if needs and config.judge.base_url == JUDGE_ENDPOINT.base_url and not config.judge.api_key:
        models = sorted({config.judge.model or judges.PROFILES[name].model for name in needs})
        raise JudgeError(f"grading with {', '.join(sorted(needs))} asks {', '.join(models)} at "
                         f"{JUDGE_ENDPOINT.base_url}: set NANBEIGE_JUDGE_API_KEY, or pass --judge-base-url "
                         f"(and --judge-model) for another OpenAI-compatible endpoint, or --grader {EXACT}")


@dataclass
class CriticWatch:
    """Counts the critic's time-outs in a row, over all the trajectories judged at once."""

    critic: ChatEndpoint
    in_a_row: int = 0

    def saw(self, turn: Turn) -> None:
        """Raise `JudgeError` once `CRITIC_DOWN_AFTER` turns in a row got no answer in time."""
        record = turn.critic or {}
        if "model" not in record:  # rolled back: the critic was not asked
            return
        timed_out = str(record.get("error", "")).startswith(CRITIC_TIMED_OUT)
        self.in_a_row = self.in_a_row + 1 if timed_out else 0
        if self.in_a_row >= CRITIC_DOWN_AFTER:
            raise JudgeError(f"the critic at {self.critic.base_url} did not answer {self.in_a_row} turns in a row "
                             f"within {self.critic.timeout_s:g} s (each asked {self.critic.retries + 1} times); fix "
                             "the critic endpoint and run again to resume")


async def judge_trajectory(trajectory: Trajectory, config: JudgeRunConfig, template: str,
                           client: httpx.AsyncClient, watch: CriticWatch | None = None,
                           code: CodeJudging | None = None) -> None:
    """The outcome reward, then (unless `no_critic`) each turn's critic verdict, in place."""
    await judge_outcome(trajectory, config, client, code)
    if config.no_critic or config.critic is None:
        return
    for turn in trajectory.turns:
        try:
            await judge_turn(trajectory, turn, config.critic, config.rule, template, client)
        except CriticUnreachable as exc:
            raise JudgeError(f"{naming(str(exc), config.critic.base_url)}; fix the critic endpoint and run again "
                             "to resume") from None
        if watch is not None:
            watch.saw(turn)


def judging_secrets(config: JudgeRunConfig) -> list[str]:
    from nanbeige.tools.endpoint import url_credentials

    keys = [config.judge.api_key, config.critic.api_key if config.critic else None,
            config.complexity.api_key if config.complexity else None]
    urls = [config.judge.base_url, config.critic.base_url if config.critic else ""]
    return [key for key in keys if key] + [s for url in urls for s in url_credentials(url) if s]


async def judge_file(src: Path, out: Path, config: JudgeRunConfig, notice: Callable[[str], None] = lambda _: None,
                     progress: JudgeProgress | None = None, judge_all: Callable[..., Any] | None = None
                     ) -> dict[str, Any]:
    """Judge the finished trajectories of `src` not yet complete in `out`, appending each to `out` whole
    as it is done; returns a summary. `progress` (if given) is kept up to date for a live view; `judge_all`
    judges and writes what is to do (default: `_judge_all`, in this process)."""
    check(src, out, config)
    progress = progress if progress is not None else JudgeProgress()
    try:
        trajectories = load_trajectories(src, say_torn=True)
    except (OSError, ValueError) as exc:
        raise JudgeError(f"cannot read {src}: {exc}") from None
    if not trajectories:
        raise JudgeError(f"{src} holds no trajectory (`nanbeige collect --out FILE` writes them)")
    done = completed_ids(out)
    todo = [t for t in trajectories if judgeable(t) and t.id not in done and gapless(t, src) and writable(t, src)]
    progress.skipped = sum(not judgeable(t) for t in trajectories)
    progress.already_judged = sum(judgeable(t) and t.id in done for t in trajectories)
    progress.total = len(todo)
    check_judge_endpoint(todo, config)
    if progress.already_judged:
        notice(f"resuming: {progress.already_judged} trajectories already judged in {out}")
    if progress.skipped:
        notice(f"skipping {progress.skipped} trajectories that are unfinished or were cut short")
    try:
        template = "" if config.no_critic or config.critic is None else load_template(config.critic)
    except (OSError, UnicodeDecodeError) as exc:
        raise JudgeError(f"cannot read --critic-template: {exc}") from None
    if todo:
        await (judge_all or _judge_all)(todo, out, config, template, progress, notice)
    return summary(progress, out)


async def _judge_all(todo: list[Trajectory], out: Path, config: JudgeRunConfig, template: str,
                     progress: JudgeProgress, notice: Callable[[str], None]) -> None:
    slots = asyncio.Semaphore(config.concurrency)
    code = None
    if config.problems is not None and any(chosen_grader(t, config) == CODE_TESTS for t in todo):
        try:
            code = open_code_judging(config.problems, config.rewards, config.complexity if config.time_reward
                                     else None)
        except CodeJudgeError as exc:
            raise JudgeError(str(exc)) from None
        notice(f"code-tests runs programs in {code.runner.where}")  # the user's choice, visible
    writer = TrajectoryWriter(out, secrets=judging_secrets(config))
    watch = CriticWatch(config.critic) if config.critic is not None else None

    async def one(trajectory: Trajectory) -> None:
        async with slots:
            progress.running += 1
            try:
                await judge_trajectory(trajectory, config, template, client, watch, code)
            finally:
                progress.running -= 1
            write_whole(writer, trajectory)
            progress.count(trajectory)

    try:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=max(config.concurrency, 10))) as client:
            async with asyncio.TaskGroup() as group:
                for trajectory in todo:
                    group.create_task(one(trajectory))
    except* JudgeError as errors:
        # An endpoint that is down fails every trajectory in flight alike: the first says it for all.
        raise errors.exceptions[0] from None
    finally:
        writer.close()
        if code is not None:
            code.close()


def summary(progress: JudgeProgress, out: Path) -> dict[str, Any]:
    """What a judge run reports at the end."""
    mean = progress.mean_reward
    return {"out": str(out), "judged": progress.done, "already_judged": progress.already_judged,
            "skipped": progress.skipped, "mean_reward": None if mean is None else round(mean, 4),
            "rewarded": progress.rewarded, "outcome_errors": progress.outcome_errors,
            "turns_judged": progress.turns_judged, "masked_turns": progress.masked_turns,
            "critic_failures": progress.critic_failures}
