"""A file someone else could have made is read one way (`nanbeige.tools.handed_over`): never through a link
planted in its folder, never a FIFO that blocks the reader, never more than its size cap, and the readers of
trajectory files, eval folders and benchmark files all go through it. The attacks run through the real
commands, and a scan of the readers' source fails when one of them reads such a file another way."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanbeige.evals.dataset_rows import rows_of
from nanbeige.evals.files import read_jsonl
from nanbeige.evals.tasks import LoadError
from nanbeige.tools.handed_over import HandedOverError, read_bytes, read_json_object

ROOT = Path(__file__).parent.parent
NANBEIGE = [str(Path(sys.executable).parent / "nanbeige")]
GIB = 1024**3


def nanbeige(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command as a user runs it; a reader that blocks on a FIFO fails by the timeout."""
    return subprocess.run([*NANBEIGE, *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def test_a_link_planted_in_a_handed_over_folder_is_refused_and_never_lends_its_target(tmp_path: Path) -> None:
    private = tmp_path / "private.txt"
    private.write_text("the user's secret")
    folder = tmp_path / "handed-over"
    folder.mkdir()
    (folder / "results.jsonl").symlink_to(private)
    with pytest.raises(HandedOverError, match="is a symbolic link"):
        read_bytes(folder / "results.jsonl", 1024, inside=folder)


def test_a_linked_parent_folder_cannot_lead_a_reader_out_of_the_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "state.json").write_text("{}")
    folder = tmp_path / "handed-over"
    folder.mkdir()
    (folder / "checkpoint").symlink_to(elsewhere)
    with pytest.raises(HandedOverError, match="lies outside"):
        read_json_object(folder / "checkpoint" / "state.json", 1024, inside=folder)
    with pytest.raises(HandedOverError, match="lies outside"):
        read_json_object(folder / ".." / "elsewhere" / "state.json", 1024, inside=folder)


def test_a_link_the_user_named_themselves_is_followed(tmp_path: Path) -> None:
    (tmp_path / "run.jsonl").write_text('{"type": "start"}\n')
    (tmp_path / "latest.jsonl").symlink_to(tmp_path / "run.jsonl")
    assert read_bytes(tmp_path / "latest.jsonl", 1024) == b'{"type": "start"}\n'


def test_a_file_past_its_cap_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    sparse = tmp_path / "eval.json"
    with open(sparse, "wb") as file:
        file.truncate(8 * GIB)  # eight gigabytes that take no disk: reading it whole would take the memory
    with pytest.raises(HandedOverError, match=r"8192\.0 MiB, more than the 1\.0 MiB"):
        read_json_object(sparse, 1024 * 1024, inside=tmp_path)


def test_benchmark_files_that_are_a_fifo_or_a_sparse_giant_are_refused_unread(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "problems.jsonl")
    with pytest.raises(LoadError, match="not a regular file"):
        list(rows_of(tmp_path / "problems.jsonl"))  # no writer ever opens it: a plain read would never return
    with open(tmp_path / "metadata.jsonl", "wb") as file:
        file.truncate(5 * GIB)
    with pytest.raises(LoadError, match="5120.0 MiB, more than the 4096.0 MiB"):
        read_jsonl(tmp_path / "metadata.jsonl")


def test_show_answers_a_fifo_and_a_sparse_giant_in_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.jsonl")
    one_line_error(nanbeige("show", "fifo.jsonl", cwd=tmp_path), "fifo.jsonl is not a regular file")
    with open(tmp_path / "giant.jsonl", "wb") as file:
        file.truncate(3 * GIB)  # read whole, it took 35 s and 6 GB of memory before the cap
    one_line_error(nanbeige("show", "giant.jsonl", cwd=tmp_path), "giant.jsonl is 3072.0 MiB, more than")


def test_eval_report_refuses_a_results_file_that_is_a_fifo_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "eval-gaia"
    out.mkdir()
    (out / "eval.json").write_text(json.dumps({"bench": "gaia", "k": 1, "tasks": [{"id": "t1", "level": 1}]}))
    os.mkfifo(out / "results.jsonl")
    one_line_error(nanbeige("eval", "report", str(out), cwd=tmp_path), "results.jsonl is not a regular file")


# The modules that read files someone else could have made, and the functions in them allowed to open a file
# some other way, each with why.
READERS = {
    "agent/trajectory/trajectory_file.py": {
        "__init__": "the writer opens its own file to append, after `check_trajectory_file`",
        "_ends_with_newline": "the writer reads one byte of the file it appends to, after `check_trajectory_file`",
    },
    "evals/out_folder.py": {},
    "evals/files.py": {
        "file_sha256": "hashes the data file after `read_data`'s loader has read it (a regular file by then)",
        "drop_torn_line": "the results file it cuts is the one `read_results` has just read",
        "append_jsonl": "appends to the results file, in a folder `refuse_links` checked",
        "write_inside": "writes with O_NOFOLLOW",
    },
    "evals/code_problems.py": {},
    "evals/dataset_rows.py": {},
    "evals/tasks.py": {},
    "trainer/train_report.py": {},
    "trainer/graph.py": {},
    "trainer/rl_loop.py": {},
    "trainer/loop_state.py": {},
    "agent/cli/settings_file.py": {},
    "trainer/checkpoints.py": {
        "save_checkpoint": "copies the search template of the model the user named",
        "read_trainer_state": "torch.load with weights_only=True of a file `handed_over.open_file` opened",
    },
    "evals/bfcl.py": {
        "registry_entry": "parses the source of the bfcl-eval package installed here, not a file handed over",
    },
    "evals/bfcl_grading.py": {
        "grade": "writes the runner's log, after removing whatever stood at its name (a FIFO would block)",
        "append_log": "opens a log to append with O_NOFOLLOW and O_NONBLOCK, refusing all but a regular file",
    },
    "evals/bfcl_jail.py": {
        "infer": "sends nanbeige's own `bfcl_inside.py` into the sandbox",
        "grade": "sends nanbeige's own `bfcl_inside.py` into the sandbox",
    },
    "tools/index.py": {
        "_save": "writes the index it builds into a folder it has just made",
        "load": "bm25s opens the BM25 matrices once `handed_over.check_folder` has checked the whole folder",
        "search_index": "`LocalIndex.load`, the module's own reader",
    },
    "trainer/start_policy.py": {
        "load_start_logprobs": "torch.load with weights_only=True of a file `handed_over.open_file` opened",
    },
}
OPENERS = {"read_text", "read_bytes", "open", "load", "loads_file", "fdopen"}


def direct_reads(source: str) -> list[tuple[str, int, str]]:
    """Each call in `source` that opens or reads a file without `handed_over`: (function, line, call)."""
    tree = ast.parse(source)
    imported = {  # `from nanbeige.tools.handed_over import read_bytes`: those names are the reader's own
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "nanbeige.tools.handed_over"
        for alias in node.names
    }
    # the module's own functions are scanned themselves: calling one is no read of its own
    imported |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                through_reader = (
                    getattr(node.func.value, "id", "") == "handed_over"
                    if isinstance(node.func, ast.Attribute)
                    else name in imported
                )
                if name in OPENERS and not through_reader:
                    found.append((function.name, node.lineno, ast.unparse(node.func)))
    return found


def test_the_readers_of_handed_over_files_read_them_only_through_handed_over() -> None:
    strays = [
        f"{module}:{line} {call}() in {function}"
        for module, allowed in READERS.items()
        for function, line, call in direct_reads((ROOT / module).read_text())
        if function not in allowed
    ]
    assert not strays, "read these through nanbeige.tools.handed_over: " + "; ".join(strays)


def test_the_scan_names_a_reader_that_reads_a_file_directly() -> None:
    planted = (
        "def load(path):\n    return json.loads(path.read_text())\n\n"
        "def fine(path):\n    return handed_over.read_text(path, 9)\n\n"
        "from nanbeige.tools.handed_over import read_bytes\n\n"
        "def also_fine(path):\n    return read_bytes(path, 9)\n\n"
        "def load_again(path):\n    return also_fine(path)\n"
    )
    assert direct_reads(planted) == [("load", 2, "path.read_text")]


def test_train_report_reads_no_metrics_through_a_loop_folder_linked_elsewhere(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "train"
    elsewhere.mkdir(parents=True)
    os.mkfifo(elsewhere / "metrics.jsonl")  # read through the link, it would block the report for ever
    loop = tmp_path / "loop"
    (loop / "iter-1").mkdir(parents=True)
    (loop / "iter-1" / "train").symlink_to(elsewhere)
    one_line_error(nanbeige("train", "report", str(loop), cwd=tmp_path), "lies outside", "loop")


def test_a_downloaded_index_folder_is_read_as_handed_over(tmp_path: Path) -> None:
    from nanbeige.tools.index import FORMAT, META_FILE, PASSAGES_FILE
    from nanbeige.trainer.graph import SynthError, load_documents

    index = tmp_path / "index"
    index.mkdir()
    (index / META_FILE).write_text(json.dumps({"format": FORMAT}))
    (tmp_path / "private.jsonl").write_text(json.dumps({"doc": 0, "title": "key", "link": "x", "text": "secret"}))
    (index / PASSAGES_FILE).symlink_to(tmp_path / "private.jsonl")
    with pytest.raises(SynthError, match="is a symbolic link"):
        load_documents(index)
    (index / PASSAGES_FILE).unlink()
    (index / PASSAGES_FILE).write_text(json.dumps({"doc": "0", "title": 1}) + "\n")
    with pytest.raises(SynthError, match=r"passages.jsonl:1: not a passage"):
        load_documents(index)  # was a KeyError or TypeError traceback


@pytest.fixture(scope="module")
def built_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An index of two small documents, built by `nanbeige index build` as a user builds one."""
    folder = tmp_path_factory.mktemp("built")
    (folder / "corp").mkdir()
    (folder / "corp" / "a.txt").write_text("alpha beta gamma\n\nthe second paragraph says alpha again")
    (folder / "corp" / "b.md").write_text("delta alpha")
    done = nanbeige("index", "build", "corp", "--out", "idx", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / "idx"


def downloaded(built_index: Path, tmp_path: Path) -> Path:
    shutil.copytree(built_index, tmp_path / "idx")
    return tmp_path / "idx"


def test_a_downloaded_index_searches_as_built(built_index: Path, tmp_path: Path) -> None:
    done = nanbeige("index", "search", str(downloaded(built_index, tmp_path)), "delta", cwd=tmp_path)
    assert done.returncode == 0 and "1. delta alpha" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["passages.jsonl", "bm25/vocab.index.json"])
def test_index_search_answers_a_fifo_in_the_index_folder_in_one_line(
    built_index: Path, tmp_path: Path, name: str
) -> None:
    """bm25s opens the BM25 files itself: the folder is checked before it does, or a FIFO blocks it forever."""
    index = downloaded(built_index, tmp_path)
    (index / name).unlink()
    os.mkfifo(index / name)
    one_line_error(nanbeige("index", "search", "idx", "alpha", cwd=tmp_path), f"{name} is not a regular file")


def test_index_search_never_shows_the_file_a_planted_link_names(built_index: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"doc": 0, "title": "alpha", "link": "x", "text": "alpha the user's secret"}) + "\n")
    index = downloaded(built_index, tmp_path)
    (index / "passages.jsonl").unlink()
    (index / "passages.jsonl").symlink_to(secret)
    done = nanbeige("index", "search", "idx", "alpha", cwd=tmp_path)
    assert "secret" not in done.stdout
    one_line_error(done, "passages.jsonl is a symbolic link")


def test_index_search_refuses_a_sparse_giant_and_a_row_that_is_no_passage(built_index: Path, tmp_path: Path) -> None:
    index = downloaded(built_index, tmp_path)
    with open(index / "passages.jsonl", "wb") as file:
        file.truncate(6 * GIB)  # read whole, a MemoryError traceback
    one_line_error(nanbeige("index", "search", "idx", "alpha", cwd=tmp_path), "more than the 4096.0 MiB")
    (index / "passages.jsonl").write_text('{"x": 1}\n')  # was a KeyError traceback
    one_line_error(nanbeige("index", "search", "idx", "alpha", cwd=tmp_path), "passages.jsonl:1: not a passage")


def test_index_search_refuses_passages_the_bm25_matrix_does_not_match(built_index: Path, tmp_path: Path) -> None:
    index = downloaded(built_index, tmp_path)
    first = (index / "passages.jsonl").read_text().splitlines()[0]
    (index / "passages.jsonl").write_text(first + "\n")  # a search would index past the one passage left
    one_line_error(nanbeige("index", "search", "idx", "alpha", cwd=tmp_path), "do not match")


def test_a_loop_iteration_whose_questions_file_is_a_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    from nanbeige.trainer.loop_config import LoopError
    from nanbeige.trainer.loop_questions import drawn

    os.mkfifo(tmp_path / "questions.jsonl")
    with pytest.raises(LoopError, match="questions.jsonl is not a regular file"):
        drawn(tmp_path)
