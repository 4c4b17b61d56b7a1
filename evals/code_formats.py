"""The code problems RL users already have, converted to nanbeige's format (`evals/code_problems.py`): APPS and
TACO, CodeContests and LiveCodeBench, read from the files their publishers distribute.

Where each format comes from, and what is read of it:
- APPS (`codeparrot/apps`, train.jsonl / test.jsonl): `problem_id`, `question`, `starter_code` and
  `input_output`, a JSON text `{"inputs": [...], "outputs": [...]}` with `fn_name` for call-style problems.
  A stdin input or output may be a list of lines (joined with newlines, as APPS's harness does). A call's
  input is the list of its arguments; Codewars-style results come wrapped in a one-element list, which APPS's
  harness accepts with or without the wrapping: where every output of a problem is wrapped, the element is
  the expected value.
- TACO (`BAAI/TACO`, parquet or the arrow files its loader reads): APPS's fields, plus `time_limit`
  ("1.5 seconds") and `Expected Time Complexity` (becomes `complexity`). It has no id: `taco-<row>`.
- CodeContests (`deepmind/code_contests`, parquet; JSON rows of the same shape): `name`, `description`,
  `public_tests`, `private_tests` and `generated_tests` (each `{"input": [...], "output": [...]}`, or a list
  of `{"input", "output"}` pairs), `time_limit` (`{seconds, nanos}`), `memory_limit_bytes`. A problem that
  reads or writes a named file (`input_file`, `output_file`) is skipped: tests here use stdin and stdout.
- LiveCodeBench (`livecodebench/code_generation_lite`, test*.jsonl): `question_id`, `question_content`,
  `starter_code`, `metadata` (`func_name` for LeetCode problems), `public_test_cases` and
  `private_test_cases` (JSON lists of `{"input", "output", "testtype"}`). A functional test's input is one
  JSON value per line, the arguments; its output a JSON value.

LiveCodeBench packs its private tests as base64 of zlib of a pickle of the JSON text. It is never unpickled
(that runs whatever the pickle names), and every cap applies while it is read, never after: decompression
stops at 256 MiB, the test cases are counted as they are parsed, and a row is refused at the case past
`MAX_TESTS` (`packed_tests.py` says how).

A LeetCode-style method of `class Solution` becomes a top-level function of the same name and parameters
(less `self`): the statement says so, since the grader calls the entry point as a function.

Every converted problem goes through the format's own reader (`problem_from`): the literal caps, the test
shapes, the limits. A row that cannot be converted is skipped with one line naming the file and row.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanbeige.evals.code_problems import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIME_LIMIT_S,
    MAX_TESTS,
    MAX_TIME_LIMIT_S,
    CodeProblem,
    problem_from,
)
from nanbeige.evals.dataset_rows import rows_of
from nanbeige.evals.packed_tests import Inflating, json_cases, pickled_text
from nanbeige.evals.tasks import LoadError

MAX_COMPLEXITY_CHARS = 200
METHOD_NOTE = (
    "The starter code shows `{name}` as a method of `class Solution`: write it as a top-level function "
    "`{name}` with the same parameters, without `self`."
)


# ---------------------------------------------------------------- fields


def text_field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise LoadError(f"{where}: `{name}` must be non-empty text")
    return value


def json_field(value: Any, name: str, where: str) -> Any:
    """A field the dataset stores as JSON text (or already parsed, as some copies hold it)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        if "integer string conversion" in str(exc):  # longer than Python reads from text
            raise LoadError(
                f"{where}: `{name}` holds an integer of more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise LoadError(f"{where}: `{name}` is not JSON ({str(exc)[:100]})") from None


def literal(value: Any) -> str:
    """A JSON value as Python literal text; the format's reader checks its size and that it parses."""
    return repr(value)


def statement(text: str, starter: Any, entry: str | None) -> str:
    parts = [text.strip()]
    if isinstance(starter, str) and starter.strip():
        if entry and re.search(r"^\s*class\s+Solution\b", starter, re.M):
            parts.append(METHOD_NOTE.format(name=entry))
        parts.append(f"Starter code:\n```python\n{starter.rstrip()}\n```")
    return "\n\n".join(parts)


def entry_point(name: Any, where: str) -> str | None:
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        raise LoadError(f"{where}: the function's name must be text, not {type(name).__name__}")
    return name  # the format's reader checks that it is a Python name


# ---------------------------------------------------------------- APPS and TACO


def lines(value: Any, where: str, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise LoadError(f"{where}: each of `{what}` must be text or a list of lines, not {type(value).__name__}")


def apps_tests(io: Any, where: str) -> tuple[str | None, list[dict[str, str]]]:
    """The entry point (None: stdin/stdout) and the tests of an `input_output` field."""
    if io in (None, "", {}):
        raise LoadError(f"{where}: no tests (`input_output` is empty)")
    if not isinstance(io, dict):
        raise LoadError(f"{where}: `input_output` must be an object with `inputs` and `outputs`")
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise LoadError(f"{where}: `inputs` and `outputs` must be lists of the same length")
    if not inputs:
        raise LoadError(f"{where}: no tests (`inputs` is empty)")
    entry = entry_point(io.get("fn_name"), where)
    if entry is None:
        return None, [
            {"input": lines(i, where, "inputs"), "output": lines(o, where, "outputs")} for i, o in zip(inputs, outputs)
        ]
    if not all(isinstance(args, list) for args in inputs):
        raise LoadError(f"{where}: each input of a call-style problem must be a list of arguments")
    wrapped = all(isinstance(out, list) and len(out) == 1 for out in outputs)
    return entry, [
        {"args": literal(args), "expected": literal(out[0] if wrapped else out)} for args, out in zip(inputs, outputs)
    ]


def apps_like(row: dict[str, Any], where: str, id: str, dataset: str, **limits: Any) -> CodeProblem:
    question = text_field(row, "question", where)
    raw = row.get("input_output")
    entry, tests = apps_tests(None if raw in (None, "") else json_field(raw, "input_output", where), where)
    known = {k: row[k] for k in ("difficulty", "url") if isinstance(row.get(k), str) and row[k]}
    return CodeProblem(
        id=id,
        statement=statement(question, row.get("starter_code"), entry),
        tests=tests,
        entry_point=entry,
        extra={"dataset": dataset, **known},
        **limits,
    )


def apps_problem(row: dict[str, Any], where: str, number: int) -> CodeProblem:
    problem_id = row.get("problem_id")
    if isinstance(problem_id, bool) or not isinstance(problem_id, int | str) or str(problem_id).strip() == "":
        raise LoadError(f"{where}: `problem_id` must be a number or text")
    return apps_like(row, where, f"apps-{problem_id}", "apps")


def seconds_of(text: Any) -> float:
    """TACO's `time_limit` ("1 second", "2.5 seconds"): our default where it is missing or unreadable."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:s|secs?|seconds?)?\s*", text) if isinstance(text, str) else None
    seconds = float(found.group(1)) if found else 0.0
    return seconds if 0 < seconds <= MAX_TIME_LIMIT_S else DEFAULT_TIME_LIMIT_S


def taco_problem(row: dict[str, Any], where: str, number: int) -> CodeProblem:
    complexity = row.get("Expected Time Complexity")
    label = complexity.strip() if isinstance(complexity, str) and complexity.strip() else None
    if label is not None and len(label) > MAX_COMPLEXITY_CHARS:
        raise LoadError(f"{where}: `Expected Time Complexity` is longer than {MAX_COMPLEXITY_CHARS} characters")
    return apps_like(
        row, where, f"taco-{number}", "taco", time_limit_s=seconds_of(row.get("time_limit")), complexity=label
    )


# ---------------------------------------------------------------- CodeContests


def contest_tests(group: Any, where: str, name: str) -> list[dict[str, str]]:
    if group is None:
        return []
    if isinstance(group, dict):
        inputs, outputs = group.get("input"), group.get("output")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise LoadError(f"{where}: `{name}` must hold `input` and `output` lists of the same length")
        pairs = list(zip(inputs, outputs))
    elif isinstance(group, list) and all(isinstance(test, dict) for test in group):
        pairs = [(test.get("input"), test.get("output")) for test in group]
    else:
        raise LoadError(f'{where}: `{name}` must be {{"input": [...], "output": [...]}} or a list of pairs')
    if not all(isinstance(text, str) for pair in pairs for text in pair):
        raise LoadError(f"{where}: every input and output of `{name}` must be text")
    return [{"input": i, "output": o} for i, o in pairs]


def contest_limits(row: dict[str, Any]) -> dict[str, Any]:
    """The problem's time limit as given; its memory limit where above our default (an address-space cap on
    Python is stricter than a judge's memory limit on a compiled program)."""
    limit, seconds = row.get("time_limit"), DEFAULT_TIME_LIMIT_S
    if isinstance(limit, dict):
        whole, nanos = limit.get("seconds") or 0, limit.get("nanos") or 0
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (whole, nanos)):
            given = whole + nanos / 1e9
            seconds = given if 0 < given <= MAX_TIME_LIMIT_S and not math.isnan(given) else seconds
    memory = row.get("memory_limit_bytes")
    mb = memory >> 20 if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0 else 0
    return {"time_limit_s": seconds, "memory_mb": min(max(mb, DEFAULT_MEMORY_MB), 65536)}


def codecontests_problem(row: dict[str, Any], where: str, number: int) -> CodeProblem:
    name = text_field(row, "name", where)
    for key in ("input_file", "output_file"):
        if isinstance(row.get(key), str) and row[key].strip():
            raise LoadError(f"{where}: the problem uses the file {row[key].strip()[:60]!r} (`{key}`), not stdin/stdout")
    tests = [
        test
        for group in ("public_tests", "private_tests", "generated_tests")
        for test in contest_tests(row.get(group), where, group)
    ]
    if not tests:
        raise LoadError(f"{where}: no tests (public, private or generated)")
    return CodeProblem(
        id=name,
        statement=text_field(row, "description", where),
        tests=tests,
        extra={"dataset": "codecontests"},
        **contest_limits(row),
    )


# ---------------------------------------------------------------- LiveCodeBench


def private_cases(value: Any, most: int, where: str) -> Any:
    """The private test cases of a row, at most `most` of them, read with every cap applied as they are read
    (`packed_tests`)."""
    if value is None or value == "" or isinstance(value, list):
        return value or []
    if not isinstance(value, str):
        raise LoadError(f"{where}: `private_test_cases` must be text, not {type(value).__name__}")
    if value.lstrip().startswith("["):  # some copies hold it as plain JSON
        return json_cases(iter([value]), most, where)
    try:
        packed = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise LoadError(f"{where}: `private_test_cases` is neither JSON nor base64") from None
    stream = Inflating(packed, where)
    return json_cases(pickled_text(stream, where), most, where)


def lcb_test(case: Any, entry: str | None, where: str) -> dict[str, str]:
    if not isinstance(case, dict) or not all(isinstance(case.get(k), str) for k in ("input", "output")):
        raise LoadError(f'{where}: a test case must be {{"input": text, "output": text, "testtype": ...}}')
    if entry is None:
        return {"input": case["input"], "output": case["output"]}
    args = [json_field(line, "input", where) for line in case["input"].split("\n")]
    return {"args": literal(args), "expected": literal(json_field(case["output"], "output", where))}


def livecodebench_problem(row: dict[str, Any], where: str, number: int) -> CodeProblem:
    id = text_field(row, "question_id", where)
    cases = json_field(row.get("public_test_cases") or "[]", "public_test_cases", where)
    if not isinstance(cases, list) or len(cases) > MAX_TESTS:
        raise LoadError(f"{where}: `public_test_cases` must be a list of at most {MAX_TESTS} test cases")
    private = private_cases(row.get("private_test_cases"), MAX_TESTS - len(cases), where)
    if not isinstance(private, list):
        raise LoadError(f"{where}: the test cases must be a list")
    cases += private
    kinds = {case.get("testtype") for case in cases if isinstance(case, dict)}
    if not cases:
        raise LoadError(f"{where}: no tests (public or private)")
    if kinds == {"stdin", "functional"}:
        raise LoadError(f"{where}: the tests must be all stdin or all functional, not both stdin and functional")
    if len(kinds) > 1 or not kinds <= {"stdin", "functional"}:
        raise LoadError(f"{where}: unknown test types {sorted(map(str, kinds))}")
    metadata = json_field(row.get("metadata") or "{}", "metadata", where)
    entry = None
    if kinds == {"functional"}:
        entry = entry_point(metadata.get("func_name") if isinstance(metadata, dict) else None, where)
        if entry is None:
            raise LoadError(f"{where}: functional tests need `func_name` in `metadata`")
    content = text_field(row, "question_content", where)
    known = {k: row[k] for k in ("platform", "difficulty", "contest_date") if isinstance(row.get(k), str)}
    return CodeProblem(
        id=id,
        statement=statement(content, row.get("starter_code"), entry),
        entry_point=entry,
        tests=[lcb_test(case, entry, where) for case in cases],
        extra={"dataset": "livecodebench", **known},
    )


# ---------------------------------------------------------------- converting a file


CONVERTERS: dict[str, Callable[[dict[str, Any], str, int], CodeProblem]] = {
    "apps": apps_problem,
    "taco": taco_problem,
    "codecontests": codecontests_problem,
    "livecodebench": livecodebench_problem,
}


def convert(path: Path, form: str) -> tuple[list[CodeProblem], list[str]]:
    """The problems of a file in one of the datasets' formats, each held to the format's checks, and one line
    for each row skipped (naming the file and row); `LoadError` when no row converts."""
    make = CONVERTERS[form]
    problems: list[CodeProblem] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for number, (where, row) in enumerate(rows_of(path), 1):
        try:
            if isinstance(row, LoadError):
                raise row
            if not isinstance(row, dict):
                raise LoadError(f"{where}: a row must be an object, not {type(row).__name__}")
            problem = problem_from(make(row, where, number).record(), where)
            if problem.id in seen:
                raise LoadError(f"{where}: the id {problem.id!r} is given to more than one problem")
        except LoadError as exc:
            skipped.append(str(exc))
            continue
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise LoadError(
            f"{path}: no problem could be converted"
            + (f" (the first row: {skipped[0].split(': ', 1)[-1]})" if skipped else " (no rows)")
        )
    return problems, skipped
