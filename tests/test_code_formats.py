"""`nanbeige problems FILE --format NAME`: the code problems RL users already have (APPS and TACO, CodeContests,
LiveCodeBench), read from files in each dataset's own published shape, which these tests write themselves.
Every converted problem is held to the checks of nanbeige's own format; a row that cannot be is skipped with
one line naming the file and row; and LiveCodeBench's pickled private tests are read without unpickling.
The converted problems judged by the real grader are tests/test_converted_problems_graded.py."""

from __future__ import annotations

import base64
import json
import pickle
import re
import struct
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli import nanbeige

from nanbeige.agent.cli.problems_command import ProblemFormat
from nanbeige.evals.code_formats import CONVERTERS, livecodebench_problem
from nanbeige.evals.code_problems import MAX_TESTS, read_problems
from nanbeige.evals.tasks import LoadError

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
    return {
        "problem_id": problem_id,
        "question": question,
        "solutions": json.dumps([SUM_PROGRAM]),
        "input_output": io if isinstance(io, str) else json.dumps(io),
        "difficulty": "interview",
        "url": f"https://example.org/{problem_id}",
        "starter_code": starter,
    }


APPS_SUM = apps_row(
    1, {"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]}, "Print the sum of the two integers on the input."
)
APPS_LINES = apps_row(2, {"inputs": [["3 4", ""]], "outputs": [["7"]]}, "The same, its tests given as lines.")
APPS_CALL = apps_row(
    3,
    {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [[3], [[1, 2]]]},
    "Write add(a, b).",
    "def add(a, b):\n\t",
)
APPS_METHOD = apps_row(
    4,
    {"fn_name": "maxScore", "inputs": [[[1, 5, 3], 2]], "outputs": [8]},
    "Return the sum of the k largest numbers.",
    "class Solution:\n    def maxScore(self, nums: List[int], k: int) -> int:\n        ",
)


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
    assert found["apps-3"]["tests"] == [
        {"args": "[1, 2]", "expected": "3"},
        {"args": "[[1], [2]]", "expected": "[1, 2]"},
    ]
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
    for line_number, words in (
        (2, "not JSON"),
        (3, "no tests"),
        (4, "same length"),
        (5, "text or a list of lines"),
        (6, "more than the 100000"),
        (7, "an integer of more than 4300 digits"),
        (8, "not a Python name"),
        (9, "a list of arguments"),
        (10, "`question`"),
        (11, "must be an object"),
        (12, "not JSON"),
        (13, "more than one problem"),
    ):
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
    row = {
        "question": "Print the sum of two integers.",
        "solutions": json.dumps([SUM_PROGRAM]),
        "starter_code": "",
        "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
        "difficulty": "EASY",
        "raw_tags": "[]",
        "name": None,
        "source": "codeforces",
        "tags": "[]",
        "skill_types": "[]",
        "url": "u",
        "Expected Auxiliary Space": None,
        "time_limit": "1.5 seconds",
        "date": None,
        "picture_num": "0",
        "memory_limit": "256 megabytes",
        "Expected Time Complexity": "O(1)",
    }
    unlabelled = {**row, "time_limit": None, "Expected Time Complexity": None}
    source = parquet(tmp_path / "train-00000-of-00001.parquet", [row, unlabelled])
    result, found = convert(source, "taco", tmp_path / "taco.jsonl")
    assert result.returncode == 0, result.stderr
    assert (found["taco-1"]["time_limit_s"], found["taco-1"]["complexity"]) == (1.5, "O(1)")
    assert (found["taco-2"]["time_limit_s"], found["taco-2"].get("complexity")) == (2.0, None)


def test_taco_in_the_arrow_files_its_loader_script_reads(tmp_path: Path) -> None:
    row = {
        "question": "Echo.",
        "input_output": json.dumps({"inputs": ["x\n"], "outputs": ["x\n"]}),
        "starter_code": "",
        "time_limit": None,
        "Expected Time Complexity": None,
    }
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
    return {
        "name": name,
        "description": "Print the sum of the two integers on the input.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["10 -4\n"], "output": ["6\n"]},
        "generated_tests": {"input": ["0 0\n", "5 5\n"], "output": ["0\n", "10\n"]},
        "source": 2,
        "difficulty": 7,
        "solutions": {"language": [3], "solution": [SUM_PROGRAM]},
        "cf_rating": 800,
        "time_limit": {"seconds": 1, "nanos": 500_000_000},
        "memory_limit_bytes": 256_000_000,
        "input_file": "",
        "output_file": "",
        **fields,
    }


def test_codecontests_parquet_takes_public_private_and_generated_tests(tmp_path: Path) -> None:
    empty = {"input": [], "output": []}
    rows = [
        contest_row("1A. Sum"),
        contest_row("2B. Big", time_limit=None, memory_limit_bytes=2_000_000_000),
        contest_row("3C. Files", input_file="input.txt", output_file="output.txt"),
        contest_row("4D. Untested", public_tests=empty, private_tests=empty, generated_tests=empty),
    ]
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
    row = contest_row(
        "5E. Pairs",
        public_tests=[{"input": "2 3\n", "output": "5\n"}],
        private_tests=None,
        generated_tests=None,
        time_limit={"seconds": 2},
    )
    source = tmp_path / "valid.json"
    source.write_text(json.dumps([row]))
    result, found = convert(source, "codecontests", tmp_path / "cc.jsonl")
    assert result.returncode == 0, result.stderr
    assert found["5E. Pairs"]["tests"] == [{"input": "2 3\n", "output": "5\n"}]


# ---------------------------------------------------------------- LiveCodeBench (code_generation_lite: jsonl)


def compressed(cases: list[dict[str, str]]) -> str:
    """How LiveCodeBench's release packs its private tests: JSON, pickled, zlib-compressed, base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def lcb_row(
    question_id: str, public: list[dict[str, str]], private: str, func_name: str | None = None, starter: str = ""
) -> dict[str, Any]:
    return {
        "question_title": question_id,
        "question_content": f"Problem {question_id}.",
        "platform": "atcoder",
        "question_id": question_id,
        "contest_id": "abc001",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": starter,
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": private,
        "metadata": json.dumps({"func_name": func_name} if func_name else {}),
    }


STDIN_CASES = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
PRIVATE_CASES = [{"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}]
FUNCTIONAL = [{"input": "[1, 5, 3]\n2", "output": "8", "testtype": "functional"}]
PRIVATE_FUNCTIONAL = [{"input": "[4, 4]\n1", "output": "4", "testtype": "functional"}]
LEETCODE_STARTER = "class Solution:\n    def maxScore(self, nums: List[int], k: int) -> int:\n        "


def packed_text(block: bytes, repeats: int, head: bytes = b"", tail: bytes = b"") -> str:
    """A row's `private_test_cases` as the release packs them (base64 of zlib of a pickle of one text), for a
    text of `head`, `block` `repeats` times and `tail`, made a block at a time: a few hundred KB that inflate
    to as much as the blocks make."""
    length = len(head) + len(block) * repeats + len(tail)
    packer = zlib.compressobj(6)
    # protocol 4: PROTO 4, BINUNICODE8 and its length, the text, MEMOIZE, STOP
    parts = [packer.compress(b"\x80\x04\x8d" + struct.pack("<Q", length) + head)]
    parts += [packer.compress(block) for _ in range(repeats)]
    parts += [packer.compress(tail + b"\x94."), packer.flush()]
    return base64.b64encode(b"".join(parts)).decode()


def inflates_to(size: int) -> str:
    """A JSON list of no test cases, padded with spaces to SIZE bytes: only the decompression cap stops it."""
    return packed_text(b" " * (1 << 20), size >> 20, b"[", b"]")


class RunsCode:
    """A pickle that would run code if unpickled: it writes MARKER."""

    marker = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_livecodebench_private_tests_are_read_without_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    RunsCode.marker = str(marker)
    evil = base64.b64encode(zlib.compress(pickle.dumps(RunsCode()))).decode()
    bomb = inflates_to(300 << 20)
    rows = [
        lcb_row("abc001_a", STDIN_CASES, compressed(PRIVATE_CASES)),
        lcb_row("2847", FUNCTIONAL, compressed(PRIVATE_FUNCTIONAL), "maxScore", LEETCODE_STARTER),
        lcb_row("abc002_a", STDIN_CASES, json.dumps(PRIVATE_CASES)),  # plain JSON, as some copies hold it
        lcb_row("abc003_a", STDIN_CASES, evil),
        lcb_row("abc004_a", STDIN_CASES, bomb),
        lcb_row("abc005_a", STDIN_CASES, "not base64 at all!"),
        lcb_row("abc006_a", STDIN_CASES + FUNCTIONAL, ""),
    ]
    source = jsonl(tmp_path / "test6.jsonl", rows)
    result, found = convert(source, "livecodebench", tmp_path / "lcb.jsonl")
    assert result.returncode == 0, result.stderr
    assert not marker.exists()  # the payload never ran
    assert found["abc001_a"]["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}]
    assert found["abc002_a"]["tests"] == found["abc001_a"]["tests"]
    assert found["2847"]["entry_point"] == "maxScore"
    assert found["2847"]["tests"] == [
        {"args": "[[1, 5, 3], 2]", "expected": "8"},
        {"args": "[[4, 4], 1]", "expected": "4"},
    ]
    lines = {line.split(":")[1]: line for line in skipped_lines(result.stderr)}
    assert "refused, never unpickled" in lines["4"] and "STACK_GLOBAL" in lines["4"]
    assert "more than 256 MiB" in lines["5"]
    assert "base64" in lines["6"]
    assert "both stdin and functional" in lines["7"]


def test_a_livecodebench_row_with_too_many_tests_is_refused_as_they_are_read() -> None:
    # about 300 KB that inflate to 128 MiB of test cases: 2.4 million of them, past the cap of 10,000
    case = json.dumps(PRIVATE_CASES[0]).encode() + b", "
    block = case * ((1 << 20) // len(case))
    row = lcb_row("abc007_a", STDIN_CASES, packed_text(block, 128, b"[", case[:-2] + b"]"))
    assert len(row["private_test_cases"]) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(LoadError, match=f"more than {MAX_TESTS - 1} test cases"):
            livecodebench_problem(row, "test6.jsonl:1", 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # what was held at once: a piece of the text and the cases up to the cap, not the 128 MiB it inflates to
    assert peak < 32 << 20, peak


def test_the_test_cap_counts_the_public_tests_too() -> None:
    private = [PRIVATE_CASES[0]] * (MAX_TESTS - 1)
    assert (
        len(livecodebench_problem(lcb_row("abc008_a", STDIN_CASES, compressed(private)), "t:1", 1).tests) == MAX_TESTS
    )
    with pytest.raises(LoadError, match=f"more than {MAX_TESTS - 1} test cases"):
        livecodebench_problem(lcb_row("abc009_a", STDIN_CASES, compressed(private + private[:1])), "t:1", 1)


def test_one_test_case_longer_than_its_cap_is_refused_before_it_is_whole() -> None:
    huge = packed_text(b"1" * (1 << 20), 64, b'[{"input": "', b'", "output": "1", "testtype": "stdin"}]')
    with pytest.raises(LoadError, match="a test case longer than 32 MiB"):
        livecodebench_problem(lcb_row("abc010_a", STDIN_CASES, huge), "t:1", 1)
