"""The outcome reward: a trajectory's answer graded against its reference answer, by exact match or an LLM
judge's profile (the functions `nanbeige eval` grades with), or for code by its problem's tests
(`code_rewards.py`): 1.0 right, 0.0 wrong, None when undecided; `token-f1` gives partial credit, its F1."""

from __future__ import annotations

from typing import Any

import httpx

from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.evals import gaia_scorer, judges, token_f1
from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.runner import final_response
from nanbeige.evals.tasks import Verdict
from nanbeige.trainer.code_rewards import CodeJudging, judge_code
from nanbeige.trainer.judge_config import EXACT, JudgeError, JudgeRunConfig, chosen_grader


def verdict_record(verdict: Verdict) -> dict[str, Any]:
    """What `trajectory.judge` holds."""
    return {
        "grader": verdict.grader,
        "judge_model": verdict.judge_model,
        "correct": verdict.correct,
        "extracted": verdict.extracted,
        "reason": verdict.reason,
        "error": verdict.error,
    } | ({} if verdict.score is None else {"score": verdict.score})


async def grade(trajectory: Trajectory, grader: str, config: JudgeRunConfig, client: httpx.AsyncClient) -> Verdict:
    """The grader's verdict on the trajectory's answer against its reference answer."""
    gold = trajectory.reference_answer or ""
    if grader == EXACT:
        return gaia_scorer.grade_exact(trajectory.answer, gold)
    if grader == token_f1.TOKEN_F1:
        return token_f1.grade_f1(trajectory.answer, gold)
    if grader not in judges.PROFILES:
        return Verdict(correct=None, grader=grader, error=f"unknown grader {grader!r}: pass --grader")
    profile = judges.profile_for(grader, config.judge.template)
    if profile.shows == "answer" and trajectory.answer is None:  # as `nanbeige eval` grades it
        return Verdict(correct=False, grader=profile.name, reason="no answer")
    text = trajectory.answer if profile.shows == "answer" else (final_response(trajectory) or trajectory.answer or "")
    try:
        return await judges.judge(profile, trajectory.question, text, gold, config.judge, client)
    except judges.JudgeUnavailable as exc:  # not a verdict: stop, so that a resume grades this one again
        raise JudgeError(
            f"the outcome judge cannot be used: {naming(str(exc), config.judge.base_url)}; fix the "
            "judge endpoint (--judge-base-url) and run again to resume"
        ) from None


def naming(error: str, base_url: str) -> str:
    """The error with the endpoint's address: a time-out or an HTTP status does not say which server."""
    return error if base_url in error else f"{error} ({base_url})"


async def judge_outcome(
    trajectory: Trajectory, config: JudgeRunConfig, client: httpx.AsyncClient, code: CodeJudging | None = None
) -> None:
    """Set the trajectory's `reward` (1.0 / 0.0, or None when undecided; code: `code_rewards.py`) and
    `judge` breakdown."""
    if chosen_grader(trajectory, config) == CODE_TESTS and code is not None:
        await judge_code(trajectory, code, client)
        return
    if trajectory.reference_answer is None:
        trajectory.reward, trajectory.judge = None, {"error": "no reference answer"}
        return
    grader = chosen_grader(trajectory, config)
    if grader is None:
        trajectory.reward, trajectory.judge = None, {"error": "no grader named: pass --grader"}
        return
    verdict = await grade(trajectory, grader, config, client)
    graded = None if verdict.correct is None else float(verdict.correct)
    trajectory.reward = graded if verdict.score is None else verdict.score
    trajectory.judge = verdict_record(verdict)
