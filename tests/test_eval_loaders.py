"""Benchmark loaders read each benchmark's official file format and give decrypted `Task`s; anything wrong with a
file is one `LoadError` line naming the file and the row. Fixture files are written here, with made-up questions,
encrypted the way the official files are."""

from __future__ import annotations

import hashlib

import pytest
from eval_fixtures import (
    encrypt_browsecomp,
    encrypt_xbench,
    write_csv,
    write_json,
    write_jsonl,
    write_parquet,
    write_xlsx,
)

from nanbeige.evals import browsecomp, gaia, hle, seal, xbench
from nanbeige.evals.files import decrypt_browsecomp, decrypt_xbench
from nanbeige.evals.tasks import LoadError

CANARY = "made-up canary for tests"
ZH_CANARY = "BrowseComp-ZH"
XBENCH_CANARY = "BENCHMARK DATA SHOULD NEVER APPEAR AS PLAIN TEXT ONLINE. canary GUID xbench-test:0000"


def load_error(load, path) -> str:
    """The LoadError's message; it must be a single line."""
    with pytest.raises(LoadError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("decrypt", "ciphertext", "canary", "plaintext"),
    [
        (decrypt_browsecomp, "yFWrWSEhVas4DGSM", "test-canary", "What is 2+2?"),
        (decrypt_browsecomp, "qw==", "test-canary", "4"),
        (decrypt_browsecomp, "9DHyBEqN", "BrowseComp-ZH", "北京"),
        (decrypt_xbench, "Iw0SAA0KEk5TWUtL", "test-canary", "What is 2+2?"),
        (decrypt_xbench, "QA==", "test-canary", "4"),
    ],
)
def test_decryption_matches_published_test_vectors(decrypt, ciphertext, canary, plaintext):
    assert decrypt(ciphertext, canary) == plaintext


def test_test_helpers_encrypt_as_the_benchmarks_do():
    assert encrypt_browsecomp("What is 2+2?", "test-canary") == "yFWrWSEhVas4DGSM"
    assert encrypt_xbench("What is 2+2?", "test-canary") == "Iw0SAA0KEk5TWUtL"


def browsecomp_row(problem: str, answer: str, canary: str = CANARY, **plain: str) -> dict:
    return {
        "problem": encrypt_browsecomp(problem, canary),
        "answer": encrypt_browsecomp(answer, canary),
        "canary": canary,
        **plain,
    }


def test_browsecomp_rows_are_decrypted_with_their_own_canary_and_numbered_from_1(tmp_path):
    path = write_csv(
        tmp_path / "test_set.csv",
        [
            browsecomp_row("Which invented river flows uphill?", "The Nowhere", problem_topic="Geography"),
            browsecomp_row("How many legs has a made-up tripod?", "3", canary="another canary", problem_topic=""),
        ],
    )
    first, second = browsecomp.load(path)
    assert (first.id, first.question, first.answer, first.level) == (
        "1",
        "Which invented river flows uphill?",
        "The Nowhere",
        "Geography",
    )
    assert (second.id, second.answer, second.level) == ("2", "3", None)


def test_browsecomp_zh_reads_the_xlsx_cell_kinds_and_decrypts_all_three_columns(tmp_path):
    def enc(text: str) -> str:
        return encrypt_browsecomp(text, ZH_CANARY)

    # column B (notes) is empty in the data rows, so those rows skip a cell and columns are placed by reference
    path = write_xlsx(
        tmp_path / "zh.xlsx",
        [
            ["Topic", "Notes", "Question", "Answer", "canary"],
            [enc("地理"), None, enc("虚构的河流叫什么？"), enc("无名河"), ZH_CANARY],
            [("inlineStr", enc("历史")), None, ("str", enc("虚构的年份？")), enc("1999"), ("inlineStr", ZH_CANARY)],
        ],
    )
    first, second = browsecomp.load_zh(path)
    assert (first.id, first.level, first.question, first.answer) == ("1", "地理", "虚构的河流叫什么？", "无名河")
    assert (second.id, second.level, second.question, second.answer) == ("2", "历史", "虚构的年份？", "1999")


def test_xbench_keeps_the_prompt_as_is_and_reference_steps_in_metadata(tmp_path):
    def enc(text: str) -> str:
        return encrypt_xbench(text, XBENCH_CANARY)

    path = write_csv(
        tmp_path / "DeepSearch-2510.csv",
        [
            {
                "id": "101",
                "prompt": enc("一个虚构的问题？"),
                "answer": enc("虚构答案"),
                "reference_steps": enc("先搜索，再核对。"),
                "canary": XBENCH_CANARY,
            },
            {
                "id": "102",
                "prompt": enc("Another invented question?"),
                "answer": enc("42"),
                "reference_steps": "",
                "canary": XBENCH_CANARY,
            },
        ],
        encoding="utf-8-sig",
    )  # the official files carry a byte-order mark
    first, second = xbench.load(path)
    assert (first.id, first.question, first.answer) == ("101", "一个虚构的问题？", "虚构答案")
    assert first.metadata == {"reference_steps": "先搜索，再核对。"}
    assert (second.id, second.metadata) == ("102", {"reference_steps": ""})


def gaia_rows() -> list[dict]:
    return [
        {
            "task_id": "aaaa-1",
            "Question": "What colour is the invented sky?",
            "Level": 1,
            "Final answer": "green",
            "file_name": "",
            "Annotator Metadata": {"Steps": "look up"},
        },
        {
            "task_id": "bbbb-2",
            "Question": "Sum the numbers in the sheet.",
            "Level": 2,
            "Final answer": "12",
            "file_name": "bbbb-2.xlsx",
            "Annotator Metadata": {"Steps": "open the file"},
        },
    ]


def test_gaia_folder_gives_levels_as_text_and_points_the_question_at_the_attachment(tmp_path):
    write_jsonl(tmp_path / "metadata.jsonl", gaia_rows())
    (tmp_path / "bbbb-2.xlsx").write_bytes(b"made-up attachment")
    plain, with_file = gaia.load(tmp_path)
    assert (plain.id, plain.question, plain.answer, plain.level, plain.files) == (
        "aaaa-1",
        "What colour is the invented sky?",
        "green",
        "1",
        [],
    )
    attachment = (tmp_path / "bbbb-2.xlsx").absolute()
    assert with_file.files == [attachment]
    assert with_file.question.startswith("Sum the numbers in the sheet.\n\n")
    assert with_file.question.endswith(str(attachment))
    assert with_file.metadata["annotator_metadata"] == {"Steps": "open the file"}


def test_gaia_parquet_loads_the_same_tasks_as_jsonl(tmp_path):
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "parquet").mkdir()
    for folder in ("jsonl", "parquet"):
        (tmp_path / folder / "bbbb-2.xlsx").write_bytes(b"made-up attachment")
    from_jsonl = gaia.load(write_jsonl(tmp_path / "jsonl" / "metadata.jsonl", gaia_rows()))
    from_parquet = gaia.load(write_parquet(tmp_path / "parquet" / "metadata.parquet", gaia_rows()))
    assert [(t.id, t.answer, t.level, t.files[0].name if t.files else None) for t in from_parquet] == [
        (t.id, t.answer, t.level, t.files[0].name if t.files else None) for t in from_jsonl
    ]


def test_gaia_text_only_subset_keeps_gaia_task_ids(tmp_path):
    path = write_json(
        tmp_path / "dev.json",
        [
            {
                "id": "1",
                "task_id": "aaaa-1",
                "Question": "An invented question?",
                "answer": "yes",
                "Level": 3,
                "Annotator_Metadata": "{'Steps': 'think'}",
            },
        ],
    )
    [task] = gaia.load(path)
    assert (task.id, task.question, task.answer, task.level) == ("aaaa-1", "An invented question?", "yes", "3")
    assert task.metadata["subset_id"] == "1"


def test_hle_parquet_drops_questions_with_images_and_keeps_answer_type(tmp_path):
    row = {
        "image": "",
        "image_preview": None,
        "answer_type": "exactMatch",
        "category": "Math",
        "raw_subject": "Algebra",
        "rationale": "",
        "author_name": "x",
        "rationale_image": None,
        "canary": "c",
    }
    path = write_parquet(
        tmp_path / "test.parquet",
        [
            {**row, "id": "q1", "question": "What is an invented number?", "answer": "7"},
            {
                **row,
                "id": "q2",
                "question": "What is in the picture?",
                "answer": "a cat",
                "image": "data:image/png;base64,AAAA",
            },
            {
                **row,
                "id": "q3",
                "question": "Pick one: A or B",
                "answer": "B",
                "answer_type": "multipleChoice",
                "category": "Other",
            },
        ],
    )
    tasks = hle.load(path)
    assert [(t.id, t.level, t.metadata["answer_type"]) for t in tasks] == [
        ("q1", "Math", "exactMatch"),
        ("q3", "Other", "multipleChoice"),
    ]


def test_hle_500_subset(tmp_path):
    path = write_json(
        tmp_path / "test.json",
        [
            {
                "id": "q9",
                "Question": "An invented question?",
                "answer": "no",
                "answer_type": "exactMatch",
                "rationale": "",
                "raw_subject": "Logic",
                "category": "Humanities",
            },
        ],
    )
    [task] = hle.load(path)
    assert (task.id, task.question, task.answer, task.level) == ("q9", "An invented question?", "no", "Humanities")
    assert task.metadata["answer_type"] == "exactMatch"


def test_seal_records_the_file_hash_and_numbers_rows_without_an_id_column(tmp_path):
    path = write_parquet(
        tmp_path / "seal-0.parquet",
        [
            {"question": "Which invented team won?", "answer": "The Owls", "topic": "Sports"},
            {"question": "Who invented nothing?", "answer": "Nobody", "topic": "Science"},
        ],
    )
    tasks = seal.load(path)
    assert [(t.id, t.answer) for t in tasks] == [("1", "The Owls"), ("2", "Nobody")]
    assert {t.metadata["file_sha256"] for t in tasks} == {hashlib.sha256(path.read_bytes()).hexdigest()}
    with_ids = write_parquet(tmp_path / "ids.parquet", [{"id": 17, "question": "Q?", "answer": "A"}])
    assert seal.load(with_ids)[0].id == "17"


def test_a_missing_column_names_the_file_and_the_column(tmp_path):
    path = write_csv(tmp_path / "data.csv", [{"problem": "x", "canary": CANARY}])
    message = load_error(browsecomp.load, path)
    assert str(path) in message and "missing column 'answer'" in message


def test_a_row_that_is_not_base64_names_the_row_and_the_column(tmp_path):
    path = write_csv(
        tmp_path / "data.csv",
        [
            browsecomp_row("An invented question?", "yes"),
            {**browsecomp_row("Another?", "no"), "problem": "not base64 at all!"},
        ],
    )
    assert load_error(browsecomp.load, path) == (
        f"{path} row 2: cannot decrypt 'problem' with the row's canary (not base64)"
    )


def test_a_wrong_canary_is_caught_when_the_text_does_not_decode(tmp_path):
    row = {
        "id": "1",
        "prompt": encrypt_xbench("一个很长的虚构问题，用来检查错误的密钥。", "right canary"),
        "answer": encrypt_xbench("答", "right canary"),
        "reference_steps": "",
        "canary": "wrong canary",
    }
    message = load_error(xbench.load, write_csv(tmp_path / "x.csv", [row]))
    assert "row 1: cannot decrypt 'prompt'" in message and "not UTF-8" in message


def test_a_missing_gaia_attachment_names_the_file_and_the_task(tmp_path):
    path = write_jsonl(tmp_path / "metadata.jsonl", gaia_rows())
    message = load_error(gaia.load, path)
    assert f"{path} row 2" in message and "'bbbb-2.xlsx'" in message and "task bbbb-2" in message


def test_a_row_without_a_required_field_is_named(tmp_path):
    rows = gaia_rows()[:1] + [{"task_id": "cccc-3", "Question": "Q?", "Level": 1, "file_name": ""}]
    message = load_error(gaia.load, write_jsonl(tmp_path / "metadata.jsonl", rows))
    assert message.endswith("metadata.jsonl row 2: no field 'Final answer'")


def test_an_xlsx_that_is_not_a_zip_archive(tmp_path):
    path = tmp_path / "zh.xlsx"
    path.write_text("Topic,Question,Answer,canary\n")
    assert "not a readable zip archive" in load_error(browsecomp.load_zh, path)


@pytest.mark.parametrize(
    ("load", "name", "content", "expected"),
    [
        (browsecomp.load, "data.csv", None, "no such file"),
        (browsecomp.load, "data.csv", b"", "empty file"),
        (xbench.load, "data.csv", b"id,prompt,answer,reference_steps,canary\n", "no rows"),
        (browsecomp.load, "data.csv", b"PAR1\x00\xff\xfe binary", "not UTF-8"),
        (seal.load, "seal-0.parquet", b'{"question": "not parquet"}', "not a readable parquet file"),
        (gaia.load, "metadata.csv", b"task_id\n1\n", "not a GAIA file"),
        (gaia.load, "metadata.jsonl", b"{broken\n", "line 1: not JSON"),
        (hle.load, "test.json", b'{"id": "q1"}', "expected a JSON array"),
    ],
)
def test_wrong_or_empty_files_are_one_line_errors_naming_the_file(tmp_path, load, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    message = load_error(load, path)
    assert message.startswith(str(path)) and expected in message
