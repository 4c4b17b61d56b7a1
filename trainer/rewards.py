"""Judging trajectories for training: `nanbeige judge IN --out OUT`.

Each finished trajectory in IN gets
- an outcome reward: its answer graded against its reference answer, 1.0 right, 0.0 wrong, None when
  there is no reference answer or the grader could not decide (`trajectory.reward`, `trajectory.judge`;
  see `outcome.py`);
- unless `no_critic`, a critic verdict on every turn, turned into the turn's reward and mask by the
  `TurnRule` (`turn.critic`, `turn.reward`, `turn.mask`; see `critic.py`).

It is then written whole to OUT (start record, every turn, end record), everything else unchanged, token
fields included. Trajectories still running or cut short (`interrupted`, `crashed`, `model_error`) are
skipped. OUT is appended to: a trajectory already complete there (an end record) is not judged again, so
an interrupted judge run resumes where it stopped. What a run is told, and the checks that refuse it before
anything is judged, are `judge_config.py`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from nanbeige.agent.trajectory.records import encoded, record_line
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import (
    TrajectoryWriter,
    end_record,
    load_trajectories,
    read_records,
    start_record,
    turn_record,
    warn_on_stderr,
)
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.trainer.code_rewards import CodeJudging, open_code_judging
from nanbeige.trainer.critic import CriticUnavailable, judge_turn, load_template
from nanbeige.trainer.judge_config import JudgeError, JudgeRunConfig, check, check_judge_endpoint, chosen_grader
from nanbeige.trainer.outcome import judge_outcome, naming

CUT_SHORT = ("interrupted", "crashed", "model_error")
CRITIC_TIMED_OUT = "critic did not answer within"
"""How `critique` records a turn whose every call timed out (the wording of `evals.endpoint`)."""
CRITIC_DOWN_AFTER = 3
"""Turns in a row the critic may leave unanswered in time before the run stops. One is a slow turn; several
in a row are a critic that hangs, which would otherwise cost timeout x retries on every turn of every
trajectory, for hours, and record them all unjudged."""


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


# ---------------------------------------------------------------- the file


def judgeable(trajectory: Trajectory) -> bool:
    """Whether the trajectory ended in a way worth judging (not still running, not cut short)."""
    return trajectory.stop_reason is not None and trajectory.stop_reason not in CUT_SHORT


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
    records = [
        ("start", None, start_record(trajectory)),
        *(("turn", turn.index, turn_record(trajectory.id, turn)) for turn in trajectory.turns),
        ("end", None, end_record(trajectory)),
    ]
    for kind, index, record in records:
        try:
            encoded(record)
        except ValueError as exc:
            warn_on_stderr(
                f"{src}:{record_line(src, trajectory.id, kind, index)}: skipped trajectory {trajectory.id}: {exc}"
            )
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
    warn_on_stderr(
        f"{src}: skipped trajectory {trajectory.id}: its turn {missing[0] if missing else '?'} could "
        "not be read (see the warning above)"
    )
    return False


def write_whole(writer: TrajectoryWriter, trajectory: Trajectory) -> None:
    # No await between these writes: trajectories judged concurrently never interleave their lines.
    writer.start(trajectory)
    for turn in trajectory.turns:
        writer.turn(trajectory, turn)
    writer.end(trajectory)


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
            raise JudgeError(
                f"the critic at {self.critic.base_url} did not answer {self.in_a_row} turns in a row "
                f"within {self.critic.timeout_s:g} s (each asked {self.critic.retries + 1} times); fix "
                "the critic endpoint and run again to resume"
            )


async def judge_trajectory(
    trajectory: Trajectory,
    config: JudgeRunConfig,
    template: str,
    client: httpx.AsyncClient,
    watch: CriticWatch | None = None,
    code: CodeJudging | None = None,
) -> None:
    """The outcome reward, then (unless `no_critic`) each turn's critic verdict, in place."""
    await judge_outcome(trajectory, config, client, code)
    if config.no_critic or config.critic is None:
        return
    for turn in trajectory.turns:
        try:
            await judge_turn(trajectory, turn, config.critic, config.rule, template, client)
        except CriticUnavailable as exc:
            raise JudgeError(
                f"{naming(str(exc), config.critic.base_url)}; fix the critic endpoint and run again to resume"
            ) from None
        if watch is not None:
            watch.saw(turn)


def judging_secrets(config: JudgeRunConfig) -> list[str]:
    from nanbeige.tools.endpoint import url_credentials

    keys = [
        config.judge.api_key,
        config.critic.api_key if config.critic else None,
        config.complexity.api_key if config.complexity else None,
    ]
    urls = [config.judge.base_url, config.critic.base_url if config.critic else ""]
    return [key for key in keys if key] + [s for url in urls for s in url_credentials(url) if s]


async def judge_file(
    src: Path,
    out: Path,
    config: JudgeRunConfig,
    notice: Callable[[str], None] = lambda _: None,
    progress: JudgeProgress | None = None,
    judge_all: Callable[..., Any] | None = None,
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


async def _judge_all(
    todo: list[Trajectory],
    out: Path,
    config: JudgeRunConfig,
    template: str,
    progress: JudgeProgress,
    notice: Callable[[str], None],
) -> None:
    slots = asyncio.Semaphore(config.concurrency)
    code = None
    if config.problems is not None and any(chosen_grader(t, config) == CODE_TESTS for t in todo):
        code = open_code_judging(config.problems, config.rewards, config.complexity if config.time_reward else None)
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
    return {
        "out": str(out),
        "judged": progress.done,
        "already_judged": progress.already_judged,
        "skipped": progress.skipped,
        "mean_reward": None if mean is None else round(mean, 4),
        "rewarded": progress.rewarded,
        "outcome_errors": progress.outcome_errors,
        "turns_judged": progress.turns_judged,
        "masked_turns": progress.masked_turns,
        "critic_failures": progress.critic_failures,
    }
