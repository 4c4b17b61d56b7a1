"""Rollouts for RL: G token-exact rollouts of the agent per question, run concurrently, resumable.

The out file is trajectory JSONL holding finished rollouts only: each trajectory is written whole
when it ends, and only when it ended on its own (answered, or a limit), never one cut short by a
signal, a crash or the model server. Each carries its group id (the question's id), its rollout
index, the policy version and, when the question has one, the reference answer and its grader.
Resuming counts the (question, rollout) pairs already in the file and runs only the missing ones.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.trajectory.trajectory import NOT_ENDED_ON_ITS_OWN
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.gaia_scorer import question_scorer
from nanbeige.evals.questions import read_questions
from nanbeige.evals.runner import Progress, run_all
from nanbeige.evals.tasks import Task
from nanbeige.tools.errors import NanbeigeError

if TYPE_CHECKING:
    from nanbeige.agent.setup.setup import Ready
    from nanbeige.evals.benchmarks import Benchmark


class CollectError(NanbeigeError):
    """Something the user must fix before rollouts can be collected; one line naming the fix."""


@dataclass
class CollectConfig:
    """Which questions, how many rollouts, and where they go; the model and tools come from `RunSettings`."""

    out: Path
    """Trajectory JSONL the rollouts are appended to (an existing one is resumed)."""
    questions: Path | None = None
    """A JSONL or CSV file of questions: `question`, optional `answer`, optional `id`."""
    bench: Benchmark | None = None
    """Or a benchmark of `nanbeige eval`, read from `data`."""
    data: Path | None = None
    """The benchmark's file, with `bench`."""
    group_size: int = 8
    """Rollouts per question (G)."""
    concurrency: int = 8
    """Rollouts at once."""
    limit: int | None = None
    """Only the first N questions."""
    policy_version: str | None = None
    """Recorded on every rollout; None: what the model server says its weights are (vLLM's model
    `root`), or the model's name in process."""
    allow_inexact: bool = False
    """Collect through a chat endpoint, whose prompts the server renders, so token ids are not exact."""
    ray: str | None = None
    """Run the rollouts in shards on a Ray cluster (`auto`, or the head's HOST:PORT): a shard per node, each
    with its own tool servers and model clients and `concurrency` rollouts at once; None: in this process."""


def load_questions(config: CollectConfig) -> list[Task]:
    if config.bench is not None:
        tasks = config.bench.load(config.data)
    elif config.questions is not None:
        tasks = read_questions(config.questions)
    else:
        raise CollectError("give the questions: --questions FILE, or --bench NAME --data PATH")
    return tasks[: config.limit] if config.limit else tasks


def done_rollouts(out: Path) -> set[tuple[str, int]]:
    """The (question id, rollout index) pairs already in the out file."""
    if not out.exists():
        return set()
    try:
        trajectories = load_trajectories(out, say_torn=True)
    except (OSError, ValueError) as exc:
        raise CollectError(f"cannot read {out} to resume it ({exc}); pass another --out") from None
    return {
        (t.group_id, t.rollout_index)
        for t in trajectories
        if t.finished and t.stop_reason not in NOT_ENDED_ON_ITS_OWN and t.group_id is not None
    }


def check_exact(runtime: Ready, config: CollectConfig) -> None:
    """Refuse a backend whose token ids are not exact: a chat server renders prompts itself, so what
    the model saw can only be re-tokenized, which RL must not train on."""
    if runtime.llm.tokenizer_identity is None and not config.allow_inexact:
        raise CollectError(
            "collect needs token-exact rollouts, and this chat endpoint renders prompts on the "
            "server: use --token-mode against vLLM (`nanbeige serve --rl-logprobs`), or the in-process "
            "backend (--backend transformers); --allow-inexact collects through the chat endpoint "
            "anyway"
        )


def rollout_attempt(runtime: Ready, config: CollectConfig, policy_version: str | None) -> Callable[..., Any]:
    """One rollout of the agent on a question; its trajectory goes to the out file when it ends."""
    from nanbeige.agent.run.loop import run

    # a questions file's answers are short: the GAIA scorer by default (`nanbeige judge --grader` overrides)
    grader = config.bench.grader if config.bench is not None else "gaia-exact"

    async def attempt(task: Task, rollout_index: int) -> dict[str, Any] | str:
        header = {
            "rollout_index": rollout_index,
            "policy_version": policy_version,
            "reference_answer": task.answer or None,
            # code problems are graded by their tests, which the judge reads from the problems file
            "grader": grader if task.answer or grader == CODE_TESTS else None,
        }
        try:
            trajectory = await run(
                task.question,
                runtime.llm,
                runtime.toolbox,
                runtime.agent,
                runtime.writer,
                group_id=task.id,
                header=header,
            )
        except Exception as exc:  # not written (whole mode): run again on resume
            return f"{type(exc).__name__}: {exc}"
        if trajectory.stop_reason in NOT_ENDED_ON_ITS_OWN:
            return trajectory.error or f"the rollout ended as {trajectory.stop_reason}"
        # a quick pass rate for the progress line; `nanbeige judge` gives the rewards
        correct = question_scorer(trajectory.answer, task.answer) if task.answer else None
        return {"task_id": task.id, "correct": correct, "turns": len(trajectory.turns)}

    return attempt


def rollout_row_problem(row: Any) -> str | None:
    """Why a rollout's row sent back by a Ray node is not one `rollout_attempt` makes, or None."""
    if type(row) is not dict or set(row) != {"task_id", "correct", "turns"}:
        return "not a rollout's task_id, correct and turns"
    if (
        type(row["task_id"]) is not str
        or type(row["correct"]) not in (bool, type(None))
        or type(row["turns"]) is not int
    ):
        return "a task_id, correct or turns of another type"
    return None


def on_policy(settings: RunSettings, notice: Callable[[str], None]) -> RunSettings:
    """Rollouts for training sample with what the trainer computes, the temperature alone: the dialect's
    top-p and repetition penalty (for answering questions) are not applied unless asked for, since they
    make every recorded logprob another policy's."""
    llm = settings.llm
    top_p = 1.0 if llm.top_p is None else llm.top_p
    penalty = 1.0 if llm.repetition_penalty is None else llm.repetition_penalty
    if top_p != 1.0 or penalty != 1.0:
        notice(
            f"sampling with top-p {top_p} and repetition penalty {penalty}, which the trainer does not apply: "
            "these rollouts are off-policy (`nanbeige train` asks for --off-policy to use them)"
        )
    return dataclasses.replace(settings, llm=dataclasses.replace(llm, top_p=top_p, repetition_penalty=penalty))


async def collect(
    config: CollectConfig,
    settings: RunSettings,
    notice: Callable[[str], None],
    progress_view: Callable[[Progress], Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the collection; returns a summary of what this call did."""
    from nanbeige.agent.trajectory.writable import unwritable

    problem = unwritable(config.out)
    if problem:
        raise CollectError(f"cannot write --out {config.out}: {problem}")
    tasks = load_questions(config)
    done = done_rollouts(config.out)
    pending = [(task, r) for task in tasks for r in range(config.group_size) if (task.id, r) not in done]
    progress = Progress(total=len(tasks) * config.group_size, done=len(tasks) * config.group_size - len(pending))
    left = Counter(task.id for task, _ in pending)
    progress.groups_done = sum(task.id not in left for task in tasks)
    if progress.done:
        notice(f"resuming: {progress.done} of {progress.total} rollouts already in {config.out}")
    if pending:
        settings = on_policy(settings, notice)
        folders = sorted({f.parent for task in tasks for f in task.files})
        tools = dataclasses.replace(settings.tools, upload_dirs=[*settings.tools.upload_dirs, *folders])
        settings = dataclasses.replace(settings, trajectory=config.out, whole_trajectories=True, tools=tools)

        def record(row: dict[str, Any]) -> None:
            left[row["task_id"]] -= 1
            progress.groups_done += left[row["task_id"]] == 0

        async def begin(attempt: Callable[..., Any], concurrency: int) -> None:
            # called once every check has passed: a refused start shows no progress
            view = progress_view(progress) if progress_view else None
            try:
                await run_all(pending, attempt, concurrency, progress, record)
            finally:
                if view is not None:
                    view.stop()

        await (collect_on_ray if config.ray else collect_here)(config, settings, notice, begin)
    return {
        "questions": len(tasks),
        "group_size": config.group_size,
        "rollouts": progress.done,
        "rollouts_expected": progress.total,
        "questions_done": progress.groups_done,
        "failed": progress.failed,
        "last_error": progress.last_error,
        "pass_rate": progress.accuracy,
        "turns": progress.turns,
    }


Begin = Callable[[Callable[..., Any], int], Awaitable[None]]
"""Runs every pending rollout through an attempt, so many at once, with the progress shown."""


def policy_of(runtime: Ready, config: CollectConfig, settings: RunSettings) -> str | None:
    return (
        config.policy_version
        or (runtime.server.weights if runtime.server else None)
        or (settings.llm.model if runtime.server is None else None)
    )


async def collect_here(
    config: CollectConfig, settings: RunSettings, notice: Callable[[str], None], begin: Begin
) -> None:
    from nanbeige.agent.setup.setup import ready

    async with ready(settings, notice) as runtime:
        check_exact(runtime, config)
        await begin(rollout_attempt(runtime, config, policy_of(runtime, config, settings)), config.concurrency)


async def collect_on_ray(
    config: CollectConfig, settings: RunSettings, notice: Callable[[str], None], begin: Begin
) -> None:
    """The rollouts in shards on Ray actors, written here as they come back, exactly as `collect_here` would."""
    from nanbeige.agent import cluster
    from nanbeige.agent.setup.setup import open_writer, secrets_of
    from nanbeige.evals.sharded import written

    assert config.ray is not None
    opener = functools.partial(open_shard, config, settings)
    async with cluster.shards(config.ray, opener, config.concurrency, notice) as shards:
        writer = open_writer(config.out, secrets_of(settings), whole=True)
        try:
            await begin(written(shards, writer, rollout_row_problem), config.concurrency * len(shards.placed))
        finally:
            writer.close()


@asynccontextmanager
async def open_shard(
    config: CollectConfig, settings: RunSettings, notice: Callable[[str], None]
) -> AsyncIterator[Callable[..., Any]]:
    """On a Ray actor: what the node's rollouts need, and the work of one rollout."""
    from nanbeige.agent import cluster

    async with cluster.shard_runtime(settings, notice) as runtime:
        check_exact(runtime, config)
        version = policy_of(runtime, config, settings)
        yield cluster.recorded(runtime, lambda each: rollout_attempt(each, config, version))
