"""`nanbeige problems FILE --format NAME`: the code problems RL users already have (APPS and TACO, CodeContests,
LiveCodeBench), read from files in each dataset's own published shape, which these tests write themselves.
Every converted problem is held to the checks of nanbeige's own format; a row that cannot be is skipped with
one line naming the file and row; LiveCodeBench's pickled private tests are read without unpickling; and
known-correct programs earn full reward on the converted problems through the real grader."""

from __future__ import annotations

import base64
import importlib.util
import json
import pickle
import re
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import JAIL
from test_cli import nanbeige
from test_code_judge import fenced, rollout
from test_judge import write

from nanbeige.agent.cli.problems_command import ProblemFormat
from nanbeige.agent.trajectory_file import load_trajectories
from nanbeige.evals.code_formats import CONVERTERS
from nanbeige.evals.code_problems import read_problems

SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def convert(source: Path, form: str, out: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The real command; the problems it wrote, by id, as nanbeige's own reader reads them back."""
    result = nanbeige("problems", str(source), "--format", form, "--out", str(out))
    assert "Traceback" not in result.stderr, result.stderr
    found = {p.id: p.record() for p in read_problems(out)} if result.returncode == 0 else {}
    return result, found


def skipped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("skipped ")]


# ---------------------------------------------------------------- APPS (codeparrot/apps: train.jsonl, test.jsonl)


def apps_row(problem_id: int, io: Any, question: str = "Solve it.", starter: str = "") -> dict[str, Any]:
    return {"problem_id": problem_id, "question": question, "solutions": json.dumps([SUM_PROGRAM]),
            "input_output": io if isinstance(io, str) else json.dumps(io), "difficulty": "interview",
            "url": f"https://example.org/{problem_id}", "starter_code": starter}


APPS_SUM = apps_row(1, {"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]},
                    "Print the sum of the two integers on the input.")
APPS_LINES = apps_row(2, {"inputs": [["3 4", ""]], "outputs": [["7"]]}, "The same, its tests given as lines.")
APPS_CALL = apps_row(3, {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [[3], [[1, 2]]]},
                     "Write add(a, b).", "def add(a, b):\n\t")
APPS_METHOD = apps_row(4, {"fn_name": "maxScore", "inputs": [[[1, 5, 3], 2]], "outputs": [8]},
                       "Return the sum of the k largest numbers.",
                       "class Solution:\n    def maxScore(self, nums: List[int], k: int) -> int:\n        ")


def test_apps_stdin_and_call_problems_convert_to_the_format_and_read_back(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "test.jsonl", [APPS_SUM, APPS_LINES, APPS_CALL, APPS_METHOD])
    result, found = convert(source, "apps", tmp_path / "apps.jsonl")
    assert result.returncode == 0, result.stderr
    assert "4 problems (2 function style, 2 stdin/stdout), 6 tests" in result.stderr
    assert found["apps-1"]["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}]
    assert "entry_point" not in found["apps-1"] and found["apps-1"]["statement"].startswith("Print the sum")
    assert found["apps-2"]["tests"] == [{"input": "3 4\n", "output": "7"}]  # lines joined, as APPS's harness does
    # Codewars-style results come wrapped in a one-element list; APPS's harness takes either, the element is kept
    assert found["apps-3"]["entry_point"] == "add"
    assert found["apps-3"]["tests"] == [{"args": "[1, 2]", "expected": "3"}, {"args": "[[1], [2]]",
                                                                             "expected": "[1, 2]"}]
    assert "```python\ndef add(a, b):" in found["apps-3"]["statement"]
    method = found["apps-4"]
    assert method["tests"] == [{"args": "[[1, 5, 3], 2]", "expected": "8"}]
    assert "top-level function `maxScore`" in method["statement"] and "class Solution" in method["statement"]
    assert (method["dataset"], method["difficulty"]) == ("apps", "interview")


def test_hostile_apps_rows_are_skipped_one_line_each_and_the_rest_converts(tmp_path: Path) -> None:
    huge_int = '{"fn_name": "f", "inputs": [[1]], "outputs": [' + "1" * 5000 + "]}"  # past Python's 4300 digits
    rows = [
        APPS_SUM,
        apps_row(10, "{not json"),
        apps_row(11, ""),  # APPS ships problems without tests
        apps_row(12, {"inputs": ["1\n", "2\n"], "outputs": ["1\n"]}),
        apps_row(13, {"inputs": [7], "outputs": ["7\n"]}),
        apps_row(14, {"fn_name": "f", "inputs": [["x" * 200_000]], "outputs": [[1]]}),
        apps_row(15, huge_int),
        apps_row(16, {"fn_name": "import", "inputs": [[1]], "outputs": [[1]]}),
        apps_row(17, {"fn_name": "f", "inputs": [5], "outputs": [[1]]}),
        {**APPS_SUM, "question": 42},
        "[1, 2, 3]",
        "{truncated",
        APPS_SUM,  # the same problem_id again
    ]
    source = jsonl(tmp_path / "test.jsonl", rows)
    result, found = convert(source, "apps", tmp_path / "apps.jsonl")
    assert result.returncode == 0, result.stderr
    assert list(found) == ["apps-1"]
    lines = skipped_lines(result.stderr)
    assert len(lines) == 12 and "12 rows skipped" in result.stderr
    assert all(f"{source}:" in line for line in lines)
    for line_number, words in ((2, "not JSON"), (3, "no tests"), (4, "same length"), (5, "text or a list of lines"),
                               (6, "more than the 100000"), (7, "an integer of more than 4300 digits"),
                               (8, "not a Python name"),
                               (9, "a list of arguments"), (10, "`question`"), (11, "must be an object"),
                               (12, "not JSON"), (13, "more than one problem")):
        [line] = [line for line in lines if re.match(rf"skipped {re.escape(str(source))}:{line_number}\b", line)]
        assert words in line, line


def test_a_file_with_no_convertible_problem_is_one_error_line(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "test.jsonl", [apps_row(1, "")])
    result = nanbeige("problems", str(source), "--format", "apps")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: {source}: no problem could be converted" in result.stderr and "no tests" in result.stderr


def test_an_unknown_format_is_refused_by_the_flag_itself(tmp_path: Path) -> None:
    result = nanbeige("problems", str(tmp_path / "x.jsonl"), "--format", "leetcode")
    assert result.returncode == 2 and "'leetcode' is not one of" in result.stderr
    assert {form.value for form in ProblemFormat} == {"nanbeige", *CONVERTERS}  # every choice has its loader


# ---------------------------------------------------------------- TACO (BAAI/TACO: parquet, arrow)


def test_taco_parquet_takes_its_time_limit_and_expected_complexity(tmp_path: Path) -> None:
    row = {"question": "Print the sum of two integers.", "solutions": json.dumps([SUM_PROGRAM]), "starter_code": "",
           "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}), "difficulty": "EASY",
           "raw_tags": "[]", "name": None, "source": "codeforces", "tags": "[]", "skill_types": "[]", "url": "u",
           "Expected Auxiliary Space": None, "time_limit": "1.5 seconds", "date": None, "picture_num": "0",
           "memory_limit": "256 megabytes", "Expected Time Complexity": "O(1)"}
    unlabelled = {**row, "time_limit": None, "Expected Time Complexity": None}
    source = parquet(tmp_path / "train-00000-of-00001.parquet", [row, unlabelled])
    result, found = convert(source, "taco", tmp_path / "taco.jsonl")
    assert result.returncode == 0, result.stderr
    assert (found["taco-1"]["time_limit_s"], found["taco-1"]["complexity"]) == (1.5, "O(1)")
    assert (found["taco-2"]["time_limit_s"], found["taco-2"].get("complexity")) == (2.0, None)


def test_taco_in_the_arrow_files_its_loader_script_reads(tmp_path: Path) -> None:
    row = {"question": "Echo.", "input_output": json.dumps({"inputs": ["x\n"], "outputs": ["x\n"]}),
           "starter_code": "", "time_limit": None, "Expected Time Complexity": None}
    table = pa.Table.from_pylist([row])
    source = tmp_path / "data-00000-of-00001.arrow"
    with pa.OSFile(str(source), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    result, found = convert(source, "taco", tmp_path / "taco.jsonl")
    assert result.returncode == 0, result.stderr
    assert found["taco-1"]["tests"] == [{"input": "x\n", "output": "x\n"}]


def test_a_file_that_is_not_parquet_is_one_error_line(tmp_path: Path) -> None:
    source = tmp_path / "train.parquet"
    source.write_text("not parquet")
    result = nanbeige("problems", str(source), "--format", "taco")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{source}: cannot read it as parquet" in result.stderr


# ---------------------------------------------------------------- CodeContests (deepmind/code_contests: parquet)


def contest_row(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "description": "Print the sum of the two integers on the input.",
            "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
            "private_tests": {"input": ["10 -4\n"], "output": ["6\n"]},
            "generated_tests": {"input": ["0 0\n", "5 5\n"], "output": ["0\n", "10\n"]},
            "source": 2, "difficulty": 7, "solutions": {"language": [3], "solution": [SUM_PROGRAM]},
            "cf_rating": 800, "time_limit": {"seconds": 1, "nanos": 500_000_000},
            "memory_limit_bytes": 256_000_000, "input_file": "", "output_file": "", **fields}


def test_codecontests_parquet_takes_public_private_and_generated_tests(tmp_path: Path) -> None:
    empty = {"input": [], "output": []}
    rows = [contest_row("1A. Sum"),
            contest_row("2B. Big", time_limit=None, memory_limit_bytes=2_000_000_000),
            contest_row("3C. Files", input_file="input.txt", output_file="output.txt"),
            contest_row("4D. Untested", public_tests=empty, private_tests=empty, generated_tests=empty)]
    source = parquet(tmp_path / "test-00000-of-00001.parquet", rows)
    result, found = convert(source, "codecontests", tmp_path / "cc.jsonl")
    assert result.returncode == 0, result.stderr
    sum_two = found["1A. Sum"]
    assert [t["input"] for t in sum_two["tests"]] == ["1 2\n", "10 -4\n", "0 0\n", "5 5\n"]
    assert (sum_two["time_limit_s"], sum_two["memory_mb"]) == (1.5, 512)  # never below our default
    assert (found["2B. Big"]["time_limit_s"], found["2B. Big"]["memory_mb"]) == (2.0, 1907)
    lines = skipped_lines(result.stderr)
    assert len(lines) == 2
    assert f"{source}: row 3" in lines[0] and "input.txt" in lines[0]
    assert f"{source}: row 4" in lines[1] and "no tests" in lines[1]


def test_codecontests_as_json_rows_with_tests_as_a_list_of_pairs(tmp_path: Path) -> None:
    row = contest_row("5E. Pairs", public_tests=[{"input": "2 3\n", "output": "5\n"}], private_tests=None,
                      generated_tests=None, time_limit={"seconds": 2})
    source = tmp_path / "valid.json"
    source.write_text(json.dumps([row]))
    result, found = convert(source, "codecontests", tmp_path / "cc.jsonl")
    assert result.returncode == 0, result.stderr
    assert found["5E. Pairs"]["tests"] == [{"input": "2 3\n", "output": "5\n"}]


# ---------------------------------------------------------------- LiveCodeBench (code_generation_lite: jsonl)


def compressed(cases: list[dict[str, str]]) -> str:
    """How LiveCodeBench's release packs its private tests: JSON, pickled, zlib-compressed, base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def lcb_row(question_id: str, public: list[dict[str, str]], private: str, func_name: str | None = None,
            starter: str = "") -> dict[str, Any]:
    return {"question_title": question_id, "question_content": f"Problem {question_id}.", "platform": "atcoder",
            "question_id": question_id, "contest_id": "abc001", "contest_date": "2024-01-01T00:00:00",
            "starter_code": starter, "difficulty": "easy", "public_test_cases": json.dumps(public),
            "private_test_cases": private,
            "metadata": json.dumps({"func_name": func_name} if func_name else {})}


STDIN_CASES = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
PRIVATE_CASES = [{"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}]
FUNCTIONAL = [{"input": "[1, 5, 3]\n2", "output": "8", "testtype": "functional"}]
PRIVATE_FUNCTIONAL = [{"input": "[4, 4]\n1", "output": "4", "testtype": "functional"}]
LEETCODE_STARTER = "class Solution:\n    def maxScore(self, nums: List[int], k: int) -> int:\n        "


def inflates_to(size: int) -> bytes:
    """A small zlib stream that decompresses to SIZE bytes."""
    packer = zlib.compressobj(9)
    return b"".join(packer.compress(bytes(1 << 20)) for _ in range(size >> 20)) + packer.flush()


class RunsCode:
    """A pickle that would run code if unpickled: it writes MARKER."""

    marker = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_livecodebench_private_tests_are_read_without_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    RunsCode.marker = str(marker)
    evil = base64.b64encode(zlib.compress(pickle.dumps(RunsCode()))).decode()
    bomb = base64.b64encode(inflates_to(300 << 20)).decode()
    rows = [lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
            lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore", LEETCODE_STARTER),
            lcb_row("abc002_a", STDIN_CASES, json.dumps(PRIVATE_CASES)),  # plain JSON, as some copies hold it
            lcb_row("abc003_a", STDIN_CASES, evil),
            lcb_row("abc004_a", STDIN_CASES, bomb),
            lcb_row("abc005_a", STDIN_CASES, "not base64 at all!"),
            lcb_row("abc006_a", STDIN_CASES + FUNCTIONAL, "")]
    source = jsonl(tmp_path / "test6.jsonl", rows)
    result, found = convert(source, "livecodebench", tmp_path / "lcb.jsonl")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()  # the payload never ran
    assert found["abc001_a"]["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}]
    assert found["abc002_a"]["tests"] == found["abc001_a"]["tests"]
    assert found["2847"]["entry_point"] == "maxScore"
    assert found["2847"]["tests"] == [{"args": "[[1, 5, 3], 2]", "expected": "8"}, {"args": "[[4, 4], 1]",
                                                                                   "expected": "4"}]
    lines = {line.split(":")[1]: line for line in skipped_lines(result.stderr)}
    assert "refused, never unpickled" in lines["4"] and "STACK_GLOBAL" in lines["4"]
    assert "more than 256 MiB" in lines["5"]
    assert "base64" in lines["6"]
    assert "both stdin and functional" in lines["7"]


# ---------------------------------------------------------------- through the real grader


pytestmark_jail = pytest.mark.skipif(not JAIL, reason="needs bwrap, the sandbox's jail, working here")

MAX_SCORE = "def maxScore(nums, k):\n    return sum(sorted(nums)[-k:])\n"
MAX_SCORE_WRONG = "def maxScore(nums, k):\n    return max(nums)\n"
ADD = "def add(a, b):\n    return a + b\n"


@pytestmark_jail
def test_known_correct_programs_earn_full_reward_on_converted_problems(tmp_path: Path) -> None:
    apps = jsonl(tmp_path / "apps.jsonl", [APPS_SUM, APPS_LINES, APPS_CALL, APPS_METHOD])
    lcb = jsonl(tmp_path / "lcb.jsonl", [lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
                                         lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore",
                                                 LEETCODE_STARTER)])
    contests = parquet(tmp_path / "cc.parquet", [contest_row("1A. Sum")])
    problems = tmp_path / "problems.jsonl"
    parts = [convert(source, form, tmp_path / f"{form}.out.jsonl") for source, form in
             ((apps, "apps"), (lcb, "livecodebench"), (contests, "codecontests"))]
    assert all(result.returncode == 0 for result, _ in parts)
    problems.write_text("".join((tmp_path / f"{form}.out.jsonl").read_text()
                                for form in ("apps", "livecodebench", "codecontests")))
    src = write(tmp_path / "in.jsonl", [
        rollout("apps-sum", "apps-1", fenced(SUM_PROGRAM)), rollout("apps-lines", "apps-2", fenced(SUM_PROGRAM)),
        rollout("apps-add", "apps-3", fenced(ADD)), rollout("apps-method", "apps-4", fenced(MAX_SCORE)),
        rollout("lcb-stdin", "abc001_a", fenced(SUM_PROGRAM)), rollout("lcb-call", "2847", fenced(MAX_SCORE)),
        rollout("cc-sum", "1A. Sum", fenced(SUM_PROGRAM)),
        rollout("lcb-call-wrong", "2847", fenced(MAX_SCORE_WRONG)),
        rollout("cc-wrong", "1A. Sum", fenced("print(3)\n"))])
    out = tmp_path / "judged.jsonl"
    result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--grader", "code-tests", "--problems",
                      str(problems), timeout=180)
    assert result.returncode == 0, result.stderr
    rewards = {t.id: t.reward for t in load_trajectories(out)}
    assert rewards == {"apps-sum": 1.0, "apps-lines": 1.0, "apps-add": 1.0, "apps-method": 1.0, "lcb-stdin": 1.0,
                       "lcb-call": 1.0, "cc-sum": 1.0, "lcb-call-wrong": 0.5, "cc-wrong": 0.25}


# ---------------------------------------------------------------- against LiveCodeBench's own harness


def livecodebench_verdict(cases: list[dict[str, str]], func_name: str | None, program: str) -> bool:
    """Whether LiveCodeBench's own `run_test` (as NVIDIA packages it) passes PROGRAM on every case, in a process
    of its own: its reliability guard disables much of `os` for the rest of the process."""
    sample = {"input_output": json.dumps({"inputs": [c["input"] for c in cases],
                                          "outputs": [c["output"] for c in cases], "fn_name": func_name})}
    script = ("import importlib.util, json, sys\n"
              "spec = importlib.util.find_spec('livecodebench')\n"
              "path = spec.submodule_search_locations[0] + '/evaluation/testing_util.py'\n"
              "module_spec = importlib.util.spec_from_file_location('lcb_testing_util', path)\n"
              "util = importlib.util.module_from_spec(module_spec)\n"
              "module_spec.loader.exec_module(util)\n"
              "sample, program = json.loads(sys.stdin.read())\n"
              "results, _ = util.run_test(sample, test=program, timeout=6)\n"
              "sys.__stdout__.write('\\nVERDICT ' + json.dumps(all(r is True for r in results)) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps([sample, program]), capture_output=True,
                          text=True, timeout=60, cwd=tempfile.gettempdir())
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("VERDICT ")]
    assert verdicts, done.stderr
    return json.loads(verdicts[-1].split(" ", 1)[1])


LCB_PROGRAMS = {  # (problem, program): the same program text goes to both harnesses
    "stdin-right": ("abc001_a", SUM_PROGRAM),
    "stdin-wrong": ("abc001_a", "print(3)\n"),
    "stdin-crash": ("abc001_a", "raise ValueError('no')\n"),
    "stdin-leading-space": ("abc001_a", "a, b = map(int, input().split())\nprint(' ', a + b)\n"),
    "stdin-float": ("abc001_a", "a, b = map(int, input().split())\nprint(float(a + b))\n"),
    "call-right": ("2847", MAX_SCORE),
    "call-wrong": ("2847", MAX_SCORE_WRONG),
    "call-method": ("2847", "class Solution:\n    def maxScore(self, nums, k):\n"
                            "        return sum(sorted(nums)[-k:])\n"),
}
LCB_DIFFERENCES = {
    # LiveCodeBench strips each line and compares numbers as decimals; the grader compares line by line with
    # trailing spaces ignored (docs/code-rl.md)
    "stdin-leading-space": "leading spaces", "stdin-float": "3.0 is not 3",
    # the converted statement asks for a top-level function; LiveCodeBench calls Solution().maxScore
    "call-method": "class Solution",
}


@pytestmark_jail
@pytest.mark.skipif(importlib.util.find_spec("livecodebench") is None,
                    reason="LiveCodeBench's harness (nvidia-livecodebench, tests/oracles.txt) is not installed")
def test_the_grader_agrees_with_livecodebench_own_harness_on_converted_problems(tmp_path: Path) -> None:
    rows = {"abc001_a": (STDIN_CASES + PRIVATE_CASES, None),
            "2847": (FUNCTIONAL + PRIVATE_FUNCTIONAL, "maxScore")}
    source = jsonl(tmp_path / "lcb.jsonl", [lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
                                            lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore",
                                                    LEETCODE_STARTER)])
    result, _ = convert(source, "livecodebench", tmp_path / "problems.jsonl")
    assert result.returncode == 0, result.stderr
    src = write(tmp_path / "in.jsonl", [rollout(name, problem, fenced(program))
                                        for name, (problem, program) in LCB_PROGRAMS.items()])
    out = tmp_path / "judged.jsonl"
    judged = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--grader", "code-tests", "--problems",
                      str(tmp_path / "problems.jsonl"), timeout=180)
    assert judged.returncode == 0, judged.stderr
    ours = {t.id: bool(t.judge["solved"]) for t in load_trajectories(out)}
    theirs = {name: livecodebench_verdict(*rows[problem], program) for name, (problem, program) in LCB_PROGRAMS.items()}
    assert theirs == {name: True for name in ("stdin-right", "stdin-leading-space", "stdin-float", "call-right",
                                              "call-method")} | {"stdin-wrong": False, "stdin-crash": False,
                                                                 "call-wrong": False}
    disagree = {name for name in LCB_PROGRAMS if ours[name] != theirs[name]}
    assert disagree == set(LCB_DIFFERENCES)  # every other program: the same verdict from both
