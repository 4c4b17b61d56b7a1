"""Hostile programs under `--grader code-tests`: fork bombs, programs that kill their own sandbox, endless loops,
memory hogs, reading the expected outputs, writing outside their folder, forging the harness's results or its
clock. Each gets reward 0 and leaves nothing behind; the machine is not blamed for what the program did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JAIL
from sandbox_leftovers import leftovers, processes_running
from test_code_grader import ADD, SUM, fenced, results, root, runner  # noqa: F401 (root, runner: the fixtures)

from nanbeige.evals.code_problems import CodeProblem, read_problems
from nanbeige.evals.code_tests import CodeRewards, CodeRunner, grade_program
from nanbeige.tools.sandbox import config_from_env

SECRET = "expected-7f3a9c41"
# Programs are judged only in the jail (or with it turned off by the operator): where bubblewrap cannot be
# installed these tests say so, as the sandbox's own jail tests do.
pytestmark = pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")


def echo_secret(tmp_path: Path) -> tuple[CodeProblem, Path]:
    """A stdin/stdout problem whose expected output is a secret, kept in a problems file on the host."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        json.dumps(
            {
                "id": "secret",
                "statement": "Print the secret.",
                "time_limit_s": 2,
                "tests": [{"input": "", "output": SECRET + "\n"}],
            }
        )
        + "\n"
    )
    return read_problems(problems)[0], problems


def test_a_fork_bomb_gets_nothing_and_leaves_no_process_or_sandbox(runner: CodeRunner, root: Path) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    grade = grade_program(runner, SUM, None, fenced(bomb))
    assert grade.reward(CodeRewards()) == 0.0 and set(results(grade)) <= {"time-out", "error"}
    assert not processes_running(str(root)) and not leftovers(root)
    after = grade_program(runner, SUM, None, fenced("a, b = map(int, input().split())\nprint(a + b)"))
    assert after.solved  # the machine and the runner still work


# Ways a program ends its own sandbox's run: its jail's init (the worker, in a pid namespace of its own) and
# everything else it can signal, its process group, or its parent (the worker, for a stdin/stdout program).
SANDBOX_KILLERS = {
    "kill(-1)": "os.kill(-1, signal.SIGKILL)",
    "killpg(0)": "os.killpg(0, signal.SIGKILL)",
    "its parent": "os.kill(os.getppid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("kill", SANDBOX_KILLERS.values(), ids=SANDBOX_KILLERS.keys())
def test_a_program_that_kills_its_sandbox_fails_itself_and_the_machine_is_not_blamed(
    runner: CodeRunner, root: Path, kill: str
) -> None:
    """Killing its jail at import used to read as "the machine failed" (a SandboxError), which stops judge at
    that trajectory on every rerun. A known-good program in a fresh jail shows the machine works: the failure
    is the program's: reward 0, each test an error, and the next program is judged as usual."""
    for problem, program in (
        (SUM, f"import os, signal\n{kill}\n"),
        (ADD, f"import os, signal\n{kill}\ndef add(a, b):\n    return a + b\n"),
    ):
        grade = grade_program(runner, problem, None, fenced(program))
        assert grade.reward(CodeRewards()) == 0.0 and results(grade) == ["error"] * len(problem.tests), grade
    assert grade_program(runner, SUM, None, fenced("print(sum(map(int, input().split())))")).solved
    assert not processes_running(str(root)) and not leftovers(root)


def test_a_program_that_kills_its_jail_says_so_in_its_record(runner: CodeRunner) -> None:
    grade = grade_program(runner, SUM, None, fenced("import os, signal\nos.kill(-1, signal.SIGKILL)\n"))
    record = grade.record(CodeRewards())
    assert (record["reward"], record["solved"], record["counts"]["error"]) == (0.0, False, 3)
    assert all("the program killed its sandbox" in test["detail"] for test in record["tests"]), record["tests"]


def test_a_program_cannot_read_the_expected_outputs(runner: CodeRunner, tmp_path: Path) -> None:
    problem, problems_file = echo_secret(tmp_path)
    thief = f"""
import os
found = ""
for path in [{str(problems_file)!r}, "/proc/1/environ", "/proc/1/cmdline"]:
    try:
        text = open(path, errors="replace").read()
        found = found or ("{SECRET[:9]}" in text and text)
    except OSError:
        pass
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if d not in ("proc", "sys", "usr", "lib", "dev")]
    for name in files:
        try:
            text = open(os.path.join(top, name), errors="replace").read(1 << 20)
        except OSError:
            continue
        if "{SECRET[:9]}" in text:
            found = text
print(found[found.find("{SECRET[:9]}"):][:17] if found else "")
"""
    grade = grade_program(runner, problem, None, fenced(thief))
    assert results(grade) == ["fail"] and grade.reward(CodeRewards()) == 0.0
    assert SECRET not in json.dumps(grade.record(CodeRewards()))


def test_a_program_cannot_write_outside_its_folder(runner: CodeRunner, tmp_path: Path) -> None:
    problem, problems_file = echo_secret(tmp_path)
    before = problems_file.read_bytes()
    targets = [str(problems_file), str(tmp_path / "planted.txt"), "/etc/planted", str(Path.cwd() / "planted.txt")]
    vandal = "\n".join(f"try:\n    open({t!r}, 'w').write('{SECRET}')\nexcept OSError:\n    pass" for t in targets)
    vandal += "\nimport os\ntry:\n    os.write(0, b'x' * 4096)\nexcept OSError:\n    pass"  # its input is read-only
    grade = grade_program(runner, problem, None, fenced(vandal))
    assert results(grade) == ["fail"] and grade.reward(CodeRewards()) == 0.0
    assert problems_file.read_bytes() == before
    assert not any(Path(t).exists() for t in targets[1:])


def test_forged_or_cut_harness_results_count_as_errors(runner: CodeRunner) -> None:
    # the program runs in a process of its own: a line it writes to any descriptor it has is no result (and
    # here breaks the exchange with the judge's side before the first call: the program does not start)
    forger = (
        "import os, json\nfor fd in range(1, 10):\n    try:\n        os.write(fd, (json.dumps({'i': 0, "
        "'result': '3', 's': 0}) + '\\n').encode())\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return 0"
    )
    forged = grade_program(runner, ADD, None, fenced(forger))
    assert results(forged) == ["error"] * 3 and "could not start" in forged.tests[0].detail
    checked = CodeProblem(
        id="checked",
        statement="add(a, b)",
        entry_point="add",
        time_limit_s=1.0,
        tests=[{"assert": "assert candidate(2, 2) == 5"}],
    )
    claimer = (
        "import os, json\nfor fd in range(1, 10):\n    try:\n        os.write(fd, (json.dumps({'i': 0, 'ok': "
        "True, 's': 0}) + '\\n').encode())\n    except OSError:\n        pass\ndef add(a, b):\n    return 0\n"
        "os._exit(0)"
    )
    assert results(grade_program(runner, checked, None, fenced(claimer))) == ["error"]  # no nonce, no end
    quitter = "import os\ndef add(a, b):\n    return a + b\nos._exit(0)"
    assert results(grade_program(runner, ADD, None, fenced(quitter))) == ["error"] * 3
    exiter = "import sys\ndef add(a, b):\n    sys.exit(0)"
    assert results(grade_program(runner, ADD, None, fenced(exiter))) == ["error"] * 3


CHECKED = CodeProblem(
    id="checked",
    statement="f(x)",
    entry_point="f",
    time_limit_s=1.0,
    tests=[{"assert": "assert candidate(1) == 2"}, {"assert": "assert candidate(2) == 5"}],
)


def test_assert_tests_run_outside_the_program_so_it_cannot_fake_equality_or_the_results(runner: CodeRunner) -> None:
    always_equal = "class Yes:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Yes()"
    assert results(grade_program(runner, CHECKED, None, fenced(always_equal))) == ["error", "error"]  # no literal
    # what reached full marks when the program shared the judge's interpreter: the nonce from the caller's frame
    frame_walker = (
        "import sys, os, json\nframe = sys._getframe(1)\nnonce = frame.f_locals.get('nonce')\n"
        "report = frame.f_locals.get('report')\nif nonce and report:\n"
        "    for i in range(2):\n"
        "        report.write(json.dumps({'i': i, 'ok': True, 'n': nonce}) + '\\n')\n"
        "    report.write(json.dumps({'done': nonce}) + '\\n')\n    report.flush()\n    os._exit(0)\n"
        "def f(x):\n    return 0"
    )
    assert results(grade_program(runner, CHECKED, None, fenced(frame_walker))) == ["fail", "fail"]
    numpy_result = "import numpy\ndef f(x):\n    return numpy.int64(2 * x + (x == 2))"  # its repr is no literal
    assert results(grade_program(runner, CHECKED, None, fenced(numpy_result))) == ["pass", "pass"]


def test_the_judges_side_keeps_the_time_so_a_program_cannot_stop_its_clock_or_alarm(runner: CodeRunner) -> None:
    frozen_clock = "import time\ntime.perf_counter = lambda: 0.0\ndef f(x):\n    time.sleep(0.3)\n    return x + 1"
    grade = grade_program(runner, CHECKED, None, fenced(frozen_clock))
    assert results(grade) == ["pass", "fail"] and grade.tests[0].seconds >= 0.3
    no_alarm = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef f(x):\n    time.sleep(5)"
    assert results(grade_program(runner, CHECKED, None, fenced(no_alarm))) == ["time-out", "time-out"]


def test_a_program_that_swallows_the_time_limit_times_out_as_a_whole(runner: CodeRunner) -> None:
    stubborn = (
        "def add(a, b):\n    while True:\n        try:\n            while True:\n                pass\n"
        "        except BaseException:\n            pass"
    )
    grade = grade_program(runner, ADD, None, fenced(stubborn))
    assert results(grade) == ["time-out"] * 3 and grade.reward(CodeRewards()) == 0.0


def test_a_program_that_takes_all_memory_is_an_error(runner: CodeRunner, root: Path) -> None:
    hog = "def add(a, b):\n    return len(bytearray(8 * 1024 ** 3))"
    grade = grade_program(runner, ADD, None, fenced(hog))
    assert results(grade) == ["error"] * 3 and "MemoryError" in grade.tests[0].detail
    assert not processes_running(str(root))


def test_without_a_jail_programs_are_not_judged_unless_the_operator_turned_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanbeige.tools.sandbox import SandboxError

    monkeypatch.setenv("PATH", str(tmp_path / "no-bwrap"))  # a machine where bwrap is not installed
    runner = CodeRunner(config_from_env({"NANBEIGE_SANDBOX_DIR": str(tmp_path)}))
    with pytest.raises(
        SandboxError,
        match=r"bwrap .* is not installed.*apt-get install bubblewrap.*"
        r"NANBEIGE_SANDBOX_JAIL=0",
    ):
        runner.require_jail()
    with pytest.raises(SandboxError, match="is not installed"):  # nor is any program run by another road
        grade_program(runner, SUM, None, fenced("print(3)"))
    runner.close()
    chosen = CodeRunner(config_from_env({"NANBEIGE_SANDBOX_DIR": str(tmp_path), "NANBEIGE_SANDBOX_JAIL": "0"}))
    chosen.require_jail()  # the operator's choice: the sandbox says at start what it lacks
    assert chosen.backend.isolation.jail is None
    chosen.close()
