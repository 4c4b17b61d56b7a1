"""Code RL's outcome rewards in `nanbeige judge --grader code-tests`: each trajectory's program run against its
problem's tests (`evals/code_tests.py`), and with `--time-reward` the complexity judge on solved programs
(`evals/complexity.py`). The reward and every term go on the trajectory: `reward`, `judge` (see
`CodeGrade.record`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.evals.code_problems import CODE_TESTS, CodeProblem, read_problems
from nanbeige.evals.code_tests import CodeRewards, CodeRunner, grade_program
from nanbeige.evals.complexity import judge_complexity, measured
from nanbeige.evals.judges import JudgeUnavailable
from nanbeige.evals.runner import visible_texts
from nanbeige.evals.tasks import LoadError
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.tools.sandbox import SandboxError
from nanbeige.trainer.judge_config import JudgeError


class CodeJudgeError(JudgeError):
    """Code judging cannot go on (a problems file that cannot be used, a complexity judge that is down)."""


@dataclass
class CodeJudging:
    """What code judging holds for a judge run: the problems by id, the sandbox runner, the complexity judge."""

    problems: dict[str, CodeProblem]
    source: Path
    rewards: CodeRewards = field(default_factory=CodeRewards)
    complexity: ChatEndpoint | None = None
    """The time reward's judge; None: no time reward (stage 1)."""
    runner: CodeRunner = field(default_factory=CodeRunner)
    reference_seconds: dict[str, float | None] = field(default_factory=dict)
    """Each problem's reference solution's time over its timing tests, measured once."""
    timing_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """One per problem: its rollouts, judged at once, wait for one measurement of the reference."""

    def close(self) -> None:
        self.runner.close()


def open_code_judging(problems: Path, rewards: CodeRewards, complexity: ChatEndpoint | None) -> CodeJudging:
    try:
        by_id = {problem.id: problem for problem in read_problems(problems)}
    except LoadError as exc:
        raise CodeJudgeError(str(exc)) from None
    code = CodeJudging(problems=by_id, source=problems, rewards=rewards, complexity=complexity)
    try:
        code.runner.require_jail()
    except SandboxError as exc:
        code.close()
        raise CodeJudgeError(str(exc)) from None
    return code


async def time_verdict(
    problem: CodeProblem, program: str, code: CodeJudging, client: httpx.AsyncClient
) -> dict[str, Any]:
    """Whether a solved program's time complexity is optimal: timed against the reference on the problem's
    timing tests, if it has any (too slow: not optimal, and the judge is not asked), then the judge's
    verdict against the complexity label (none: the measurement decides)."""
    timing = None
    if problem.timing_tests:
        async with code.timing_locks.setdefault(problem.id, asyncio.Lock()):  # measured once per judge run
            if problem.id not in code.reference_seconds:
                code.reference_seconds[problem.id] = await asyncio.to_thread(
                    code.runner.seconds, problem, problem.reference_solution or ""
                )
        program_s = await asyncio.to_thread(code.runner.seconds, problem, program)
        timing = measured(program_s, code.reference_seconds[problem.id])
        if timing["fast_enough"] is False or (timing["fast_enough"] is not None and not problem.complexity):
            return {"optimal": timing["fast_enough"], "bound": problem.complexity, "model": None, "measured": timing}
    assert code.complexity is not None
    verdict = await judge_complexity(problem, program, code.complexity, client)
    return verdict if timing is None else {**verdict, "measured": timing}


async def judge_code(trajectory: Trajectory, code: CodeJudging, client: httpx.AsyncClient) -> None:
    """Set the trajectory's reward and `judge` record from its program's run against its problem's tests
    (the problem is the one whose id is the trajectory's question id, its `group_id`)."""
    problem = code.problems.get(trajectory.group_id or "")
    if problem is None:
        trajectory.reward = None
        trajectory.judge = {
            "grader": CODE_TESTS,
            "correct": None,
            "error": f"no problem {trajectory.group_id!r} in {code.source}",
        }
        return
    # the last program of the whole run: its summary turn may hold only a short boxed answer
    try:
        grade = await asyncio.to_thread(
            grade_program, code.runner, problem, trajectory.answer, visible_texts(trajectory)
        )
    except SandboxError as exc:  # this machine's failure, not the program's: no reward, stop to resume later
        raise CodeJudgeError(
            f"the sandbox failed while judging trajectory {trajectory.id}: {exc}; fix it and run again to resume"
        ) from None
    if code.complexity is not None and grade.solved and grade.program is not None:
        try:
            grade.time = await time_verdict(problem, grade.program, code, client)
        except SandboxError as exc:
            raise CodeJudgeError(
                f"the sandbox failed while timing trajectory {trajectory.id}: {exc}; fix it and run again to resume"
            ) from None
        except JudgeUnavailable as exc:
            where = "" if code.complexity.base_url in str(exc) else f" ({code.complexity.base_url})"
            raise CodeJudgeError(
                f"the complexity judge cannot be used: {exc}{where}; fix the judge endpoint "
                "(--judge-base-url) and run again to resume"
            ) from None
    trajectory.reward = grade.reward(code.rewards)
    trajectory.judge = grade.record(code.rewards)
