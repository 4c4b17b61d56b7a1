"""The size limits the code keeps (CONTRIBUTING.md): a Python file of at most 400 lines, a function of at most
60, with no exceptions. Sizes are physical lines as the file holds them, laid out by `ruff format` (which CI
checks); a function counts from its `def` to its last line, nested functions and methods included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
FILE_LIMIT = 400
FUNCTION_LIMIT = 60


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


def test_no_file_is_over_the_limit() -> None:
    sizes = {name: len((ROOT / name).read_text().splitlines()) for name in python_files()}
    over = [f"{name}: {lines} lines" for name, lines in sizes.items() if lines > FILE_LIMIT]
    assert not over, f"split these files (limit {FILE_LIMIT} lines): " + "; ".join(over)


def test_no_function_is_over_the_limit() -> None:
    sizes = {
        f"{name}::{function}": lines
        for name in python_files()
        for function, lines in function_sizes(ast.parse((ROOT / name).read_text())).items()
    }
    over = [f"{name}: {lines} lines" for name, lines in sizes.items() if lines > FUNCTION_LIMIT]
    assert not over, f"split these functions (limit {FUNCTION_LIMIT} lines): " + "; ".join(over)


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n")
    assert function_sizes(tree) == {"A.f": 5, "A.f.g": 2}
