"""`--grader code-tests`: the program in an answer, run against its problem's tests in a sandbox (the local jail,
or E2B's where the sandbox settings choose it: `CodeRunner`).

Model code never runs outside a sandbox (`tools/sandbox`: a jail with no network, its own home and /tmp,
seccomp, memory, process, disk and CPU budgets; a fresh sandbox per program, deleted after it). Here only
its text is read: the program is extracted and parsed, never executed, to check its form
(`code_extraction.py`), and what comes back from the sandbox (stdout, one JSON line per test) is compared
with the expected outputs, which never enter the sandbox for stdin/stdout and call tests (`code_problems.py`).

Rewards, each recorded so that a trainer or a person can see why (`CodeGrade.record`):
- R_format: 0 when the answer holds a well-formed program (a ```python block that parses and, for function
  style, defines the entry point), -`format_penalty` when not: nothing is run then. Our choice, since the
  paper does not give the term's values: a malformed answer scores below a program that runs and fails,
  and a well-formed program alone earns nothing.
- R_correctness: the pass rate, tests passed / tests.
- R_time: only at pass rate 1 (`complexity.py`): `time_weight` when a judge finds the program's time
  complexity no worse than the reference's label, 0 when it finds it slower; none (null) when the judge
  could not decide or the problem has no label.

R = R_format + R_correctness (+ R_time at pass rate 1), as the paper's stage 2 (stage 1: no time term).
"""

from __future__ import annotations

import ast
import json
import math
import secrets
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.evals.code_extraction import extract_program, form_error
from nanbeige.evals.code_problems import CODE_TESTS, CodeProblem
from nanbeige.evals.tasks import one_line
from nanbeige.tools.sandbox import SandboxConfig, SandboxError, config_from_env

if TYPE_CHECKING:
    from nanbeige.tools.sandbox.program_runs import ProgramRun

HARNESS = Path(__file__).with_name("code_harness.py")
STARTUP_S = 1.0
"""Wall-clock time a run gets beyond its tests' limits: its jail and interpreter start (about 0.1 s here),
more under load."""
MAX_OUTPUT_BYTES = 1 << 22
"""Stdout kept from one run; an output that long that is still cut fails its test."""
DETAIL_CHARS = 300
FAILED = {"fail": "wrong result", "time-out": "timed out", "error": "error"}
"""A failure reason for an outcome without a detail of its own."""
KILLED_SANDBOX = "the program killed its sandbox (its jail, its worker, its process group or all it could signal)"


@dataclass
class CodeRewards:
    """The reward's terms (see the module's docstring)."""

    format_penalty: float = 1.0
    """What R_format takes away from an answer without a well-formed program."""
    time_weight: float = 1.0
    """R_time when the time reward is on, every test passes and the judge finds the complexity optimal."""


@dataclass
class Outcome:
    result: str
    """`pass`, `fail` (wrong output, a failed assertion), `time-out` or `error` (it raised, crashed, or
    exited non-zero)."""
    seconds: float | None = None
    detail: str = ""

    def record(self) -> dict[str, Any]:
        line: dict[str, Any] = {"result": self.result}
        if self.seconds is not None:
            line["seconds"] = round(self.seconds, 4)
        if self.detail:
            line["detail"] = self.detail[:DETAIL_CHARS]
        return line


@dataclass
class CodeGrade:
    """What the grader found for one answer."""

    program: str | None
    """The program run, None when the answer has none."""
    format_error: str | None = None
    """Why the answer's program is not well-formed (then nothing ran)."""
    tests: list[Outcome] = field(default_factory=list)
    time: dict[str, Any] | None = None
    """The complexity judge's verdict (`complexity.py`), when the time reward was asked for and applies."""

    @property
    def pass_rate(self) -> float:
        return sum(t.result == "pass" for t in self.tests) / len(self.tests) if self.tests else 0.0

    @property
    def solved(self) -> bool:
        return bool(self.tests) and all(t.result == "pass" for t in self.tests)

    @property
    def failure(self) -> str | None:
        """Why the program is not solved, in one line for a person: the form error, or the first test that did
        not pass with its first error line (`test 2 of 7: NameError: name 'x' is not defined`). Read from the
        outcomes only, never used for a reward."""
        if self.format_error is not None:
            return one_line(self.format_error)
        for number, test in enumerate(self.tests, 1):
            if test.result != "pass":
                return one_line(f"test {number} of {len(self.tests)}: {test.detail or FAILED[test.result]}")
        return None

    @property
    def counts(self) -> dict[str, int]:
        """How many tests ended each way."""
        return {kind: sum(t.result == kind for t in self.tests) for kind in ("pass", "fail", "time-out", "error")}

    def terms(self, rewards: CodeRewards) -> dict[str, float | None]:
        """R_format, R_correctness and R_time (None: not applicable, or not asked for)."""
        time = None
        if self.time is not None and self.solved and self.time.get("optimal") is not None:  # undecided: no term
            time = rewards.time_weight if self.time["optimal"] is True else 0.0
        return {
            "format": 0.0 if self.format_error is None else -rewards.format_penalty,
            "correctness": self.pass_rate,
            "time": time,
        }

    def reward(self, rewards: CodeRewards) -> float:
        return sum(value for value in self.terms(rewards).values() if value is not None)

    def record(self, rewards: CodeRewards) -> dict[str, Any]:
        """What `trajectory.judge` holds: the terms, the reward, the per-test results and the verdicts the
        group filter reads (`solved`; `complexity_ok` for solved programs the judge found optimal)."""
        counts = self.counts
        complexity_ok = None if self.time is None or not self.solved else self.time.get("optimal")
        return {
            "grader": CODE_TESTS,
            "judge_model": (self.time or {}).get("model"),
            "correct": self.solved,
            "extracted": None,
            "reason": self.format_error or f"{counts['pass']} of {len(self.tests)} tests passed",
            "error": (self.time or {}).get("error"),
            "terms": self.terms(rewards),
            "failure": self.failure,
            "reward": self.reward(rewards),
            "pass_rate": self.pass_rate,
            "solved": self.solved,
            "complexity_ok": complexity_ok,
            "time_judge": self.time,
            "counts": counts,
            "tests": [t.record() for t in self.tests],
        }


# ---------------------------------------------------------------- comparing outputs


def same_output(got: str, expected: str) -> bool:
    """Stdout against the expected output, line by line, trailing spaces and trailing blank lines ignored."""

    def lines(text: str) -> list[str]:
        kept = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while kept and not kept[-1]:
            kept.pop()
        return kept

    return lines(got) == lines(expected)


def same_value(got: Any, expected: Any) -> bool:
    """Python's ==, but floats within 1e-9 relative, inside lists, tuples and dicts too."""
    if isinstance(got, float) or isinstance(expected, float):
        numbers = all(isinstance(v, int | float) for v in (got, expected))  # True == 1.0, as in Python
        return numbers and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(got, list | tuple) and isinstance(expected, list | tuple):
        return type(got) is type(expected) and len(got) == len(expected) and all(map(same_value, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in got)
    try:
        return bool(got == expected)
    except Exception:  # a literal's == does not raise; kept for safety
        return False


def call_result(line: dict[str, Any], test: dict[str, Any]) -> Outcome:
    """One harness line against its test."""
    seconds = line.get("s") if isinstance(line.get("s"), int | float) else None
    if line.get("time-out") is True:
        return Outcome("time-out", seconds)
    if isinstance(line.get("error"), str):
        return Outcome("error", seconds, line["error"])
    if isinstance(line.get("failed"), str):
        return Outcome("fail", seconds, line["failed"])
    if "assert" in test:
        return Outcome("pass" if line.get("ok") is True else "error", seconds)
    shown = line.get("result")
    if not isinstance(shown, str):
        return Outcome("error", seconds, "no result")
    if "expected" not in test:  # a timing test: any result will do
        return Outcome("pass", seconds)
    try:
        value = ast.literal_eval(shown)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return Outcome("fail", seconds, f"the result is not a literal: {shown[:100]}")
    if same_value(value, ast.literal_eval(test["expected"])):
        return Outcome("pass", seconds)
    return Outcome("fail", seconds, f"returned {shown[:100]}")


def harness_results(stdout: bytes, tests: list[dict[str, Any]], ended: str, nonce: str) -> list[Outcome]:
    """The harness's lines (those carrying the run's nonce) as one result per test: a test without exactly one
    line of its own gets `ended` (the process died, ran out of time, or wrote a second line for it); an assert
    test passes only when the harness also reached its end."""
    lines: dict[int, list[dict[str, Any]]] = {}
    done = False
    for raw in stdout.decode(errors="replace").splitlines():
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(line, dict):
            continue
        done = done or line.get("done") == nonce
        if line.get("n") != nonce:
            continue
        if isinstance(line.get("start"), str):
            return [Outcome("error", None, f"the program could not start: {line['start']}") for _ in tests]
        if isinstance(line.get("i"), int) and not isinstance(line["i"], bool):
            lines.setdefault(line["i"], []).append(line)
    results = []
    for index, test in enumerate(tests):
        found = lines.get(index, [])
        if len(found) > 1:
            results.append(Outcome("error", None, "more than one result for this test"))
        elif found and "assert" in test and not done:
            results.append(Outcome("error", None, "the process ended before the last test"))
        else:
            kind, _, why = ended.partition(":")
            results.append(call_result(found[0], test) if found else Outcome(kind, None, why))
    return results


# ---------------------------------------------------------------- running in the sandbox


def end_reason(run: ProgramRun, chars: int) -> str:
    """Why a run ended abnormally: a budget of its sandbox, the program killing its own sandbox (its failure,
    as a known-good program run after it showed), the end of what it wrote on stderr, or the signal."""
    from nanbeige.tools.sandbox.system import signal_name

    if run.budget_spent:
        return run.budget_spent
    if run.killed_sandbox:
        return KILLED_SANDBOX
    said = run.stderr.decode(errors="replace").strip()[-chars:]
    return said or (f"killed by {signal_name(-run.exit_code)}" if run.exit_code < 0 else "")


class CodeRunner:
    """Runs programs against tests in sandboxes (local or E2B), one fresh sandbox per program; thread-safe. Holds
    the sandbox backend for a judge or eval run: `close()` when done."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        base = config or config_from_env()
        # outputs are compared whole; the sandbox is chosen as the python tool's is (E2B when a key is set)
        self.config = replace(base, max_output_chars=MAX_OUTPUT_BYTES // 4)
        self.backend: Any
        if self.config.backend == "e2b":
            from nanbeige.tools.sandbox.e2b import PYTHON, E2BBackend

            self.backend, self.python = E2BBackend(self.config), PYTHON
            self.where = f"E2B sandboxes (template {self.config.e2b_template or 'code-interpreter'})"
        else:
            from nanbeige.tools.sandbox.local import LocalBackend

            self.backend, self.python = LocalBackend(self.config), self.config.python  # the sandbox's interpreter
            self.where = "the local jail"

    def require_jail(self) -> None:
        """Raise `SandboxError` (with its fix) unless programs can be graded: locally, unless they will run in
        the filesystem jail (or the operator turned it off, NANBEIGE_SANDBOX_JAIL=0); on E2B, unless a
        known-good program runs in a fresh sandbox. Asked before the first program, so that a judge that cannot
        run any says so at once; the local sandbox runs nothing unjailed otherwise."""
        if self.config.backend == "e2b":
            if broken := self.backend.known_good_fails():
                raise SandboxError(f"code-tests cannot run programs on E2B: a known-good program failed ({broken})")
            return
        self.backend.isolation  # noqa: B018 - probes, and raises where the jail cannot be made

    def run(self, problem: CodeProblem, program: str) -> list[Outcome]:
        """Every test's result. A sandbox that cannot be made or used raises `SandboxError`: that is this
        machine's failure, not the program's, and must not become a reward. A program that kills its own
        sandbox does not pass for one: a known-good program run after it shows the machine works."""
        sandbox = self.backend.create(int(self.config.idle_timeout_s))
        try:
            self.backend.write_file(sandbox, "/home/user/solution.py", program.encode())
            if problem.entry_point is None:
                return [self._stdio_test(sandbox, problem, test) for test in problem.tests]
            return self._function_tests(sandbox, problem)
        finally:
            self.backend.destroy(sandbox)

    def _limits(self, seconds: float, problem: CodeProblem) -> dict[str, Any]:
        return {"timeout_s": seconds + STARTUP_S, "cpu_seconds": math.ceil(seconds) + 1, "memory_mb": problem.memory_mb}

    def _stdio_test(self, sandbox: str, problem: CodeProblem, test: dict[str, Any]) -> Outcome:
        run = self.backend.run_program(
            sandbox,
            [self.python, "-I", "-B", "solution.py"],
            test["input"].encode(),
            **self._limits(problem.time_limit_s, problem),
        )
        if run.timed_out or run.exit_code == -signal.SIGXCPU:  # its CPU time ran out
            return Outcome("time-out", run.seconds, f"timed out after {problem.time_limit_s:g} s")
        if run.exit_code != 0:
            return Outcome("error", run.seconds, f"exit {run.exit_code}: {end_reason(run, DETAIL_CHARS)}")
        if "output" not in test or same_output(run.stdout.decode(errors="replace"), test["output"]):  # timing
            return Outcome("pass", run.seconds)
        return Outcome("fail", run.seconds, f"printed {run.stdout[:100].decode(errors='replace')!r}")

    def _function_tests(self, sandbox: str, problem: CodeProblem) -> list[Outcome]:
        # inputs only, on the harness's stdin after the nonce: an assert test's check holds its expected values,
        # and no file in the sandbox may (the program would read it)
        given = [{k: v for k, v in test.items() if k != "expected"} for test in problem.tests]
        self.backend.write_file(sandbox, "/home/user/harness.py", HARNESS.read_bytes())
        # each test: its call, and a restart of the program (its top level) after one that ran out of time
        total = problem.time_limit_s * (2 * len(problem.tests) + 1)
        nonce = secrets.token_hex(16)
        run = self.backend.run_program(
            sandbox,
            [self.python, "-I", "-B", "harness.py", str(problem.entry_point), repr(problem.time_limit_s)],
            f"{nonce}\n{json.dumps(given)}\n".encode(),
            **self._limits(total, problem),
        )
        if run.timed_out or run.exit_code == -signal.SIGXCPU:
            ended = f"time-out:timed out: the whole run ran past its {total:g} s"
        elif run.exit_code != 0:
            ended = f"error:the process ended (exit {run.exit_code}) before this test: {end_reason(run, 200)}"
        else:
            ended = "error:the process ended before this test"
        outcomes = harness_results(run.stdout, problem.tests, ended, nonce)
        for outcome in outcomes:  # the harness says only that a call ran out of time
            outcome.detail = outcome.detail or (
                f"timed out after {problem.time_limit_s:g} s" if outcome.result == "time-out" else ""
            )
        return outcomes

    def seconds(self, problem: CodeProblem, program: str) -> float | None:
        """The program's time over the problem's timing tests (each within `time_limit_s`; the sum of its calls'
        times, or of its runs' wall-clock times for stdin/stdout), None when one did not finish cleanly."""
        outcomes = self.run(replace(problem, tests=problem.timing_tests or []), program)
        if not outcomes or any(o.result != "pass" or o.seconds is None for o in outcomes):
            return None
        return sum(o.seconds for o in outcomes if o.seconds is not None)

    def close(self) -> None:
        self.backend.close()


def grade_program(
    runner: CodeRunner, problem: CodeProblem, answer: str | None, response: str | list[str] | None
) -> CodeGrade:
    """The program of a run (`extract_program` over its response, or its turns' texts in order; else over its
    answer), checked for form and, when well-formed, run against every test of the problem."""
    texts = response if isinstance(response, list) else [response]
    program = extract_program(*texts, entry_point=problem.entry_point) or extract_program(
        answer, entry_point=problem.entry_point
    )
    error = form_error(program, problem)
    if error is not None:
        return CodeGrade(program=program, format_error=error)
    assert program is not None
    return CodeGrade(program=program, tests=runner.run(problem, program))
