"""Running a benchmark: every task k times, concurrently, graded as each run finishes, resumable.

The out folder holds everything a run of `nanbeige eval` leaves:

    eval.json           what was run (benchmark, data file, k, grader, judge), checked on resume
    trajectories.jsonl  every run's trajectory, written turn by turn
    results.jsonl       one line per graded run (see `result_row`), appended as each finishes
    report.json         the scores (`evals.report`), rewritten at the end

A run is done when its line is in `results.jsonl`; resuming runs only the (task, run) pairs
without one, so an interrupted or killed eval loses at most the runs in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from nanbeige.agent.run import dialects
from nanbeige.agent.run.run_config import RunSettings
from nanbeige.agent.trajectory.trajectory import NOT_ENDED_ON_ITS_OWN, Trajectory
from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.grading import check_grader, grader_for, open_code_runner
from nanbeige.evals.judges import JudgeUnavailable
from nanbeige.evals.out_folder import (
    REPORT,
    RESULTS,
    TRAJECTORIES,
    append_result,
    judge_prompt_origin,
    pending_runs,
    prepare_out,
    read_results,
)
from nanbeige.evals.progress import Progress
from nanbeige.evals.tasks import Task, Verdict, one_line

if TYPE_CHECKING:
    from nanbeige.agent.setup.setup import Ready


# ---------------------------------------------------------------- one run of one task


def final_response(trajectory: Trajectory) -> str:
    """What the agent said in the turn its answer came from (the last turn whose text holds the answer;
    the last turn when none does), without its reasoning: the response an official judge reads."""
    texts = [
        dialects.visible_text(turn.assistant.get("content") or "").strip()
        for turn in trajectory.turns
        if not turn.rolled_back
    ]
    answer = trajectory.answer
    holding = [text for text in texts if answer and answer in text]
    return holding[-1] if holding else (texts[-1] if texts else "")


def visible_texts(trajectory: Trajectory) -> list[str]:
    """What the agent said in each turn it kept, without its reasoning, in order: where `code-tests` looks for
    the program (the summary turn may hold only a short boxed answer, the program a turn before)."""
    return [
        dialects.visible_text(turn.assistant.get("content") or "") for turn in trajectory.turns if not turn.rolled_back
    ]


def result_row(
    task: Task, run_index: int, prediction: str | None, verdict: Verdict, trajectory: Trajectory | None
) -> dict[str, Any]:
    """One line of `results.jsonl`. Why a run is not right, where something says so: `reason` (the grader's
    words: a judge's reasoning, a program's pass rate), `failure` (a graded program's first failing test and
    its first error line, or its form error; None otherwise), `judge_error` (why the grader could not decide)
    and `error` (what went wrong in the run itself, such as the model server failing on the final answer or
    the run's budget or context running out; None when nothing did). `failure` and `error` are one line of at
    most 200 characters, without control characters: for people, never for scoring."""
    turns = trajectory.turns if trajectory else []
    return {
        "task_id": task.id,
        "run": run_index,
        "level": task.level,
        "prediction": prediction,
        "gold": task.answer,
        "correct": verdict.correct,
        "grader": verdict.grader,
        "judge_model": verdict.judge_model,
        "extracted": verdict.extracted,
        "reason": verdict.reason,
        "judge_error": verdict.error,
        "confidence": verdict.confidence,
        "failure": verdict.failure,
        "stop_reason": trajectory.stop_reason if trajectory else None,
        "error": one_line(trajectory.error) if trajectory and trajectory.error else None,
        "turns": sum(not t.rolled_back for t in turns),
        "tool_calls": sum(len(t.tool_calls) for t in turns),
        "trajectory_id": trajectory.id if trajectory else None,
        "trajectory_file": TRAJECTORIES if trajectory else None,
        "wall_s": round(trajectory.timings.get("wall_s", 0.0), 3) if trajectory else None,
        "usage": trajectory.usage if trajectory else None,
    }


Attempt = Callable[[Task, int], Awaitable["dict[str, Any] | str"]]
"""Runs one task once: the graded row, or why the run failed in a way worth retrying (the model
server failed, a crash): such runs are not recorded, so the next resume runs them again."""


async def run_all(
    pending: list[tuple[Task, int]],
    attempt: Attempt,
    concurrency: int,
    progress: Progress,
    record: Callable[[dict[str, Any]], None],
) -> None:
    """Every pending (task, run) through `attempt`, `concurrency` at a time, each finished one handed
    to `record` as it comes. A cancelled eval cancels the runs in flight (each closes its trajectory);
    failures in a row past the concurrency (a model server gone) stop it with the last error."""
    queue: asyncio.Queue[tuple[Task, int]] = asyncio.Queue()
    for item in pending:
        queue.put_nowait(item)
    in_a_row = [0]

    async def worker() -> None:
        while not queue.empty():
            task, run_index = queue.get_nowait()
            began, row = progress.began_one(), None  # row: the graded row, why the run failed, or None (raised)
            try:
                row = await attempt(task, run_index)
            finally:
                progress.ended_one(began, isinstance(row, dict))
            if isinstance(row, str):
                progress.failed, progress.last_error = progress.failed + 1, row
                progress.failures.append({"task_id": task.id, "run": run_index, "error": one_line(row)})
                in_a_row[0] += 1
                if in_a_row[0] >= max(3, concurrency):
                    raise EvalError(f"{in_a_row[0]} runs in a row failed, the last with: {row}")
                continue
            in_a_row[0] = 0
            record(row)
            progress.done += 1
            progress.correct += row.get("correct") is True
            progress.graded += row.get("correct") is not None
            progress.turns += row.get("turns") or 0

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(pending))):
                group.create_task(worker())
    except* EvalError as errors:
        raise errors.exceptions[0] from None


def agent_attempt(runtime: Ready, config: EvalConfig, client: httpx.AsyncClient, code_runner: Any = None) -> Attempt:
    """A run of the agent loop on the task's question, graded on its answer."""
    from nanbeige.agent.run.loop import run

    reference = runtime.agent.reference
    grade = grader_for(config, reference.judge_prompts if reference else None, code_runner)

    async def attempt(task: Task, run_index: int) -> dict[str, Any] | str:
        try:
            trajectory = await run(
                task.question, runtime.llm, runtime.toolbox, runtime.agent, runtime.writer, group_id=task.id
            )
        except Exception as exc:  # the trajectory is closed as crashed; the run is retried on resume
            return f"{type(exc).__name__}: {exc}"
        if trajectory.stop_reason in NOT_ENDED_ON_ITS_OWN:  # the model server failed, or a replay missed
            return trajectory.error or "the model server failed"
        # code: the last program of the whole run, not only of its final response
        response: Any = visible_texts(trajectory) if code_runner else final_response(trajectory)
        try:
            verdict = await grade(task, trajectory.answer, response, client)
        except JudgeUnavailable as exc:  # not recorded: the run is graded again on resume
            return f"the judge cannot be used: {exc}"
        # code: the program graded is the prediction (the report's "no answer" counts runs without one)
        prediction = verdict.extracted if code_runner else trajectory.answer
        return result_row(task, run_index, prediction, verdict, trajectory)

    return attempt


def with_out(settings: RunSettings, config: EvalConfig, tasks: list[Task]) -> RunSettings:
    """The run settings writing into the out folder, with the tasks' attachments uploadable."""
    folders = sorted({str(f.parent) for task in tasks for f in task.files})
    tools = dataclasses.replace(settings.tools, upload_dirs=[*settings.tools.upload_dirs, *map(Path, folders)])
    return dataclasses.replace(settings, trajectory=config.out / TRAJECTORIES, tools=tools)


# ---------------------------------------------------------------- the whole eval


def load_tasks(config: EvalConfig) -> list[Task]:
    tasks = config.bench.load(config.data)
    if not tasks:
        raise EvalError(f"{config.data} holds no tasks of {config.bench.name}")
    return tasks[: config.limit] if config.limit else tasks


def with_reference(settings: RunSettings) -> RunSettings:
    """The settings with the reference checkout the runs' prompts come from, read once here (a checkout
    that cannot be read is refused before the out folder is made); `ready` takes it as it is."""
    if settings.reference is None:
        return settings
    from nanbeige.agent.setup.setup_checks import SetupError, read_reference
    from nanbeige.agent.setup.setup_checks import with_reference as taken

    try:
        return taken(settings, read_reference(settings.reference))
    except SetupError as exc:
        raise EvalError(str(exc)) from None


Runs = Callable[
    [
        EvalConfig,
        RunSettings,
        list[tuple[Task, int]],
        Progress,
        Callable[[str], None],
        Callable[[Progress], Any] | None,
    ],
    Awaitable[None],
]
"""Runs the pending runs, writing into the out folder: `run_here`, or `evals.sharded.run_on_ray` (`--ray`)."""


async def evaluate(
    config: EvalConfig,
    settings: RunSettings,
    notice: Callable[[str], None],
    progress_view: Callable[[Progress], Any] | None = None,
    runs: Runs | None = None,
) -> dict[str, Any]:
    """Run (or resume) the eval and return its report, also written to `report.json`; `runs` runs what is
    pending (default: `run_here`, in this process)."""
    from nanbeige.evals.scores import build_report

    if config.bench.pipeline is not None:
        return await config.bench.pipeline(config, settings, notice, progress_view)
    tasks = load_tasks(config)
    check_grader(config)
    settings = with_reference(settings)
    reference = settings.agent.reference
    try:
        fresh = not config.out.exists()
    except OSError:  # a name the file system cannot hold: `prepare_out` says so
        fresh = False
    found = prepare_out(
        config,
        tasks,
        reference.identity() if reference else None,
        judge_prompt_origin(config, reference.judge_prompts if reference else {}),
    )
    progress = Progress(total=len(tasks) * config.k)
    pending = pending_runs(tasks, config.k, read_results(config.out, notice))
    progress.done = progress.total - len(pending)
    if pending:
        if progress.done:
            notice(f"resuming: {progress.done} of {progress.total} runs already done in {config.out}")
        run = runs or run_here
        try:
            await run(config, with_out(settings, config, tasks), pending, progress, notice, progress_view)
        except BaseException:
            if fresh:
                remove_if_nothing_ran(config.out)
            raise
    report = build_report(found, read_results(config.out))
    report["failed_runs"], report["failed_run_errors"] = progress.failed, failed_run_errors(config, settings, progress)
    (config.out / REPORT).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def remove_if_nothing_ran(out: Path) -> None:
    """The out folder this eval made, removed when the eval stopped before any run was recorded or begun (a
    model server that is not up, a key refused): a folder of nothing is no eval to resume, only one more to
    tell apart from those that are."""
    if any((out / name).exists() and (out / name).stat().st_size > 0 for name in (RESULTS, TRAJECTORIES)):
        return
    shutil.rmtree(out, ignore_errors=True)


def failed_run_errors(config: EvalConfig, settings: RunSettings, progress: Progress) -> list[dict[str, Any]]:
    """This session's failed runs with their errors, for the report; a model server's error may quote the key
    it was sent, which the report never does (as the results file never does)."""
    from nanbeige.agent.setup.setup import secrets_of
    from nanbeige.agent.trajectory.trajectory_file import redact, usable_secrets

    secrets = usable_secrets([*secrets_of(settings), *([config.judge.api_key] if config.judge.api_key else [])])
    return [{**failure, "error": redact(failure["error"], secrets)} for failure in progress.failures]


async def run_here(
    config: EvalConfig,
    settings: RunSettings,
    pending: list[tuple[Task, int]],
    progress: Progress,
    notice: Callable[[str], None],
    progress_view: Callable[[Progress], Any] | None,
) -> None:
    """Every pending run in this process; `settings` write into the out folder."""
    from nanbeige.agent.setup.setup import ready

    code_runner = open_code_runner(config)
    async with ready(settings, notice) as runtime, httpx.AsyncClient() as client:
        attempt = agent_attempt(runtime, config, client, code_runner)
        view = progress_view(progress) if progress_view else None
        try:
            # the model's answer or the judge's reason may quote a key: the results file never does
            secrets = [*runtime.writer.secrets, *([config.judge.api_key] if config.judge.api_key else [])]
            await run_all(
                pending, attempt, config.concurrency, progress, lambda row: append_result(config.out, row, secrets)
            )
        finally:
            if view is not None:
                view.stop()
            if code_runner is not None:
                code_runner.close()
