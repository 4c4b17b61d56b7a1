"""The program in a code answer: which of its ```python blocks is the solution, and whether that program is
well-formed for its problem. The program is only parsed here, never run: a malformed one is a format error and
nothing of it reaches a sandbox (`code_tests.py`)."""

from __future__ import annotations

import ast
import re
import threading

from nanbeige.evals.code_problems import CodeProblem

FENCE = re.compile(r"```[ \t]*([\w+.-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
"""A fenced block and its language tag; the last block may be left open (a reply that ends inside it)."""
PYTHON_TAGS = ("python", "python3", "py")
MAX_PROGRAM_BYTES = 1 << 20
"""A longer program is a format error (nothing a solution needs; far below the sandbox's file size limit)."""
_PARSING = threading.Lock()
"""One parse at a time: the judge grades programs in threads, and CPython 3.11's `ast` keeps one recursion
counter per interpreter, so a thread switch inside a parse (a finalizer the garbage collector runs there) let
another thread's parse move it: `SystemError: AST constructor recursion depth mismatch` (CPython gh-106905)."""


def extract_program(*texts: str | None, entry_point: str | None = None) -> str | None:
    """The program among the Python blocks of `texts` (a run's turns, in the order written; each read apart, so
    that a block one turn leaves open ends with that turn): the blocks tagged python (or py) first, else the
    untagged ones; for function style the last that defines `entry_point` (a usage example after the
    solution is not the solution), tagged or else untagged, else the last block."""
    blocks = [
        (tag.lower(), code)
        for text in texts
        for tag, code in FENCE.findall(text or "")
        if tag.lower() in ("", *PYTHON_TAGS)
    ]
    tagged, untagged = [code for tag, code in blocks if tag], [code for tag, code in blocks if not tag]
    if entry_point is not None:
        for group in (tagged, untagged):
            defining = [code for code in group if defines(code, entry_point)]
            if defining:
                return defining[-1]
    chosen = tagged or untagged
    return chosen[-1] if chosen else None


def defines(program: str, name: str) -> bool:
    try:
        return name in defined_names(parse(program))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def form_error(program: str | None, problem: CodeProblem) -> str | None:
    """Why the program is not well-formed for the problem, None when it is. Parsed, never run."""
    if program is None or not program.strip():
        return "the answer has no program in a ```python block"
    if len(program.encode()) > MAX_PROGRAM_BYTES:
        return f"the program is longer than {MAX_PROGRAM_BYTES // 1024} KB"
    try:
        tree = parse(program, "solution.py")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"the program does not parse: {type(exc).__name__}: {str(exc)[:200]}"
    if problem.entry_point is not None and problem.entry_point not in defined_names(tree):
        return f"the program does not define `{problem.entry_point}`"
    return None


def parse(program: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, safe to call from the judge's threads (`_PARSING`)."""
    with _PARSING:
        return ast.parse(program, filename)


def defined_names(tree: ast.Module) -> set[str]:
    """Names the module's top level binds: functions, classes, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names
