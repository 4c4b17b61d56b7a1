"""The size limits the code keeps (CONTRIBUTING.md): a Python file of at most 400 lines, a function of at most
60. The files and functions over them when the limits were set are listed with their size then as a ceiling:
they may shrink, never grow, and leave the list once under the limit. Sizes are physical lines as
the file holds them; a function counts from its `def` to its last line, nested functions and methods included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
FILE_LIMIT = 400
FUNCTION_LIMIT = 60

FILE_CEILINGS = {}

FUNCTION_CEILINGS: dict[str, int] = {}


def python_files() -> list[str]:
    """The repository's Python files: the packages' folders, the tests and the documentation's hooks."""
    folders = ("agent", "evals", "trainer", "tools", "servers", "tests", "docs")
    return sorted(str(path.relative_to(ROOT)) for folder in folders for path in (ROOT / folder).rglob("*.py"))


def function_sizes(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """Each function's lines, by its dotted name in the module (`Class.method`, `outer.inner`)."""
    sizes: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                sizes[name] = max(sizes.get(name, 0), node.end_lineno - node.lineno + 1)
            sizes.update(function_sizes(node, name + "."))
        else:
            sizes.update(function_sizes(node, prefix))
    return sizes


def test_no_file_grows_past_its_limit() -> None:
    sizes = {name: len((ROOT / name).read_text().splitlines()) for name in python_files()}
    over = [
        f"{name}: {lines} lines (limit {FILE_CEILINGS.get(name, FILE_LIMIT)})"
        for name, lines in sizes.items()
        if lines > max(FILE_LIMIT, FILE_CEILINGS.get(name, 0))
    ]
    assert not over, "split these files: " + "; ".join(over)
    done = [name for name, ceiling in FILE_CEILINGS.items() if sizes.get(name, 0) <= FILE_LIMIT]
    assert not done, f"under {FILE_LIMIT} lines now (or gone): take them out of FILE_CEILINGS: {done}"


def test_no_function_grows_past_its_limit() -> None:
    sizes = {
        f"{name}::{function}": lines
        for name in python_files()
        for function, lines in function_sizes(ast.parse((ROOT / name).read_text())).items()
    }
    over = [
        f"{name}: {lines} lines (limit {FUNCTION_CEILINGS.get(name, FUNCTION_LIMIT)})"
        for name, lines in sizes.items()
        if lines > max(FUNCTION_LIMIT, FUNCTION_CEILINGS.get(name, 0))
    ]
    assert not over, "split these functions: " + "; ".join(over)
    done = [name for name in FUNCTION_CEILINGS if sizes.get(name, 0) <= FUNCTION_LIMIT]
    assert not done, f"under {FUNCTION_LIMIT} lines now (or gone): take them out of FUNCTION_CEILINGS: {done}"


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n")
    assert function_sizes(tree) == {"A.f": 5, "A.f.g": 2}
