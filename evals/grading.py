"""Which grader an eval's answers get, and the grading function for it: the GAIA scorer, a judge profile
(`judges.py`), or the program run against its tests (`code_tests.py`, with the sandbox runner it needs).
`runner.py` asks here; so does nothing else of the eval's running."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from nanbeige.evals.code_problems import CODE_TESTS
from nanbeige.evals.eval_config import EvalConfig, EvalError
from nanbeige.evals.judges import JUDGE_ENDPOINT, JudgeUnavailable
from nanbeige.evals.tasks import Task, Verdict

Grade = Callable[[Task, "str | None", str, httpx.AsyncClient], Awaitable[Verdict]]


def grader_name(config: EvalConfig) -> str:
    """The grader's full name: `--grader` as given (a family, resolved for the benchmark, or a full name),
    else the benchmark's default (the reference harness's)."""
    from nanbeige.evals import judges

    name = config.grader or config.bench.grader
    if config.bench.pipeline is not None and name != config.bench.grader:
        raise EvalError(
            f"{config.bench.name} is graded by its own pipeline ({config.bench.grader}): leave out --grader"
        )
    if name in judges.FAMILIES:
        try:
            return judges.grader_name(config.bench.name, name)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
    return name


def grader_for(config: EvalConfig, reference_prompts: dict[str, str] | None = None, code_runner: Any = None) -> Grade:
    """The grading function for answers: the GAIA scorer, the program run against its tests in a sandbox
    (`code_runner`, a `code_tests.CodeRunner`), or the named judge profile (a reference grader with the
    reference checkout's own prompt, where `--reference` gives one)."""
    from nanbeige.evals import gaia_scorer, judges

    name = grader_name(config)
    if name == CODE_TESTS:
        return code_grader(code_runner)
    if name == "gaia-exact":

        async def exact(task: Task, prediction: str | None, response: str, client: httpx.AsyncClient) -> Verdict:
            return gaia_scorer.grade_exact(prediction, task.answer)

        return exact
    profile = judges.profile_for(name, config.judge.template, reference_prompts)

    async def judged(task: Task, prediction: str | None, response: str, client: httpx.AsyncClient) -> Verdict:
        if profile.shows == "answer":
            if prediction is None:  # deviation: the reference harness shows its judge a format-error text instead
                return Verdict(correct=False, grader=profile.name, reason="no answer")
            return await judges.judge(profile, task.question, prediction, task.answer, config.judge, client)
        return await judges.judge(
            profile, task.question, response or prediction or "", task.answer, config.judge, client
        )

    return judged


def code_grader(runner: Any) -> Grade:
    """Code problems: correct when the program passes every test (the report's accuracy is pass@1, avg@k);
    the pass rate and the counts of each test's result go in the verdict's reason, the first failing test's
    error line in its failure."""
    from nanbeige.evals.code_tests import grade_program
    from nanbeige.tools.sandbox import SandboxError

    async def graded(task: Task, prediction: str | None, response: str, client: httpx.AsyncClient) -> Verdict:
        problem = task.metadata.get("code_problem")
        if problem is None:
            return Verdict(correct=None, grader=CODE_TESTS, error="the task is not a code problem")
        try:
            grade = await asyncio.to_thread(grade_program, runner, problem, prediction, response)
        except SandboxError as exc:  # this machine's failure: the run is graded again on resume
            raise JudgeUnavailable(f"the sandbox failed: {exc}") from None
        counts = ", ".join(f"{n} {kind}" for kind, n in grade.counts.items() if n)
        return Verdict(
            correct=grade.solved,
            grader=CODE_TESTS,
            extracted=grade.program,
            reason=grade.format_error or f"pass rate {grade.pass_rate:.3f} ({counts})",
            failure=grade.failure,
        )

    return graded


def check_grader(config: EvalConfig) -> None:
    from nanbeige.evals import judges

    name = grader_name(config)
    if name in ("gaia-exact", CODE_TESTS):
        if name == CODE_TESTS and config.bench.grader != CODE_TESTS:
            raise EvalError(f"{CODE_TESTS} grades code problems (--bench code or humaneval), not {config.bench.name}")
        return
    if name not in judges.PROFILES:
        raise EvalError(
            f"--grader must be one of {', '.join(judges.FAMILIES)}, gaia-exact or a grader's full name "
            f"({', '.join(judges.PROFILES)}), not {name!r}"
        )
    if config.judge.base_url == JUDGE_ENDPOINT.base_url and not config.judge.api_key:
        hint = (
            "; or --grader official, GAIA's own scorer, which needs no judge"
            if config.bench.name.startswith("gaia")
            else ""
        )
        model = config.judge.model or judges.PROFILES[name].model
        raise EvalError(
            f"{config.bench.name} is graded by the {name!r} LLM judge, by default {model} at "
            f"{JUDGE_ENDPOINT.base_url}: set NANBEIGE_JUDGE_API_KEY, or pass --judge-base-url (and "
            f"--judge-model) for another OpenAI-compatible endpoint{hint}"
        )
    if config.judge.template is not None and not config.judge.template.is_file():
        raise EvalError(f"--judge-template {config.judge.template}: no such file")


def open_code_runner(config: EvalConfig) -> Any:
    """The sandbox runner `code-tests` grades with (None for other graders); `close()` it when done."""
    if grader_name(config) != CODE_TESTS:
        return None
    from nanbeige.evals.code_tests import CodeRunner
    from nanbeige.tools.sandbox import SandboxError

    runner = CodeRunner()
    try:
        runner.require_jail()
    except SandboxError as exc:
        runner.close()
        raise EvalError(str(exc)) from None
    return runner
