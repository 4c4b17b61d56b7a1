"""GAIA: the validation split (`metadata.jsonl` or `metadata.parquet`, attachments in the same folder) and the
103-question text-only subset (WebThinker's `dev.json`, a JSON array).

    tasks = load("GAIA/2023/validation")       # the folder, or the metadata file itself
    tasks = load("WebThinker/data/GAIA/dev.json")
"""

from __future__ import annotations

from pathlib import Path

from nanbeige.evals.files import optional_text_cell, read_json_array, read_jsonl, read_parquet, text_cell
from nanbeige.evals.tasks import LoadError, Task

VALIDATION_COLUMNS = ["task_id", "Question", "Level", "Final answer", "file_name"]
METADATA_NAMES = ["metadata.jsonl", "metadata.parquet"]
ATTACHMENT_NOTE = "\n\nThe file this question refers to is at: {path}"


def load(path: str | Path) -> list[Task]:
    """GAIA questions from `metadata.jsonl`, `metadata.parquet`, the folder holding one, or the text-only `dev.json`."""
    path = Path(path)
    if not path.exists():
        raise LoadError(f"{path}: no such file or folder")
    if path.is_dir():
        path = _metadata_in(path)
    if path.suffix == ".jsonl":
        return _validation(path, read_jsonl(path))
    if path.suffix == ".parquet":
        return _validation(path, read_parquet(path, VALIDATION_COLUMNS, optional=["Annotator Metadata"]))
    if path.suffix == ".json":
        return _text_only(path, read_json_array(path))
    raise LoadError(f"{path}: not a GAIA file (expected metadata.jsonl, metadata.parquet or the text-only dev.json)")


def _metadata_in(folder: Path) -> Path:
    for name in METADATA_NAMES:
        if (folder / name).is_file():
            return folder / name
    raise LoadError(f"{folder}: no {' or '.join(METADATA_NAMES)} in this folder")


def _validation(path: Path, rows: list[dict]) -> list[Task]:
    # absolute, not resolved: attachments in a Hugging Face cache are symlinks to blobs without their extension
    folder = path.parent.absolute()
    tasks = []
    for number, row in enumerate(rows, 1):
        task_id = text_cell(path, number, row, "task_id")
        question = text_cell(path, number, row, "Question")
        files = []
        file_name = optional_text_cell(path, number, row, "file_name").strip()
        if file_name:
            attachment = _attachment(path, number, folder, file_name, task_id)
            files = [attachment]
            question += ATTACHMENT_NOTE.format(path=attachment)
        tasks.append(
            Task(
                id=task_id,
                question=question,
                answer=text_cell(path, number, row, "Final answer"),
                level=text_cell(path, number, row, "Level"),
                files=files,
                metadata={"annotator_metadata": row.get("Annotator Metadata")},
            )
        )
    return tasks


def _attachment(path: Path, number: int, folder: Path, file_name: str, task_id: str) -> Path:
    """The attachment a row names, which must lie in the data folder: the agent may upload it to its
    sandbox and read it, so a row must not point it at any other file of this machine."""
    attachment = folder / file_name
    inside = not Path(file_name).is_absolute() and ".." not in Path(file_name).parts
    if not inside or not attachment.resolve().is_relative_to(_allowed_root(folder)):
        raise LoadError(
            f"{path} row {number}: attachment '{file_name}' of task {task_id} is outside the data "
            f"folder {folder}; attachments are read only from there"
        )
    if not attachment.is_file():
        raise LoadError(
            f"{path} row {number}: attachment '{file_name}' of task {task_id} is missing (looked for {attachment})"
        )
    return attachment


def _allowed_root(folder: Path) -> Path:
    """Where the data folder's files may lead once links are followed: the folder itself, or, in a
    Hugging Face cache (`.../snapshots/REV/...` beside `.../blobs/`), the dataset's cache folder, as
    the snapshot's files are links to its blobs."""
    parts = folder.parts
    if "snapshots" in parts:
        repo = Path(*parts[: len(parts) - 1 - parts[::-1].index("snapshots")])
        if (repo / "blobs").is_dir():
            return repo.resolve()
    return folder.resolve()


def _text_only(path: Path, rows: list[dict]) -> list[Task]:
    """The subset keeps GAIA's task_id, so results line up with the full validation split."""
    return [
        Task(
            id=text_cell(path, number, row, "task_id"),
            question=text_cell(path, number, row, "Question"),
            answer=text_cell(path, number, row, "answer"),
            level=text_cell(path, number, row, "Level"),
            metadata={
                "subset_id": text_cell(path, number, row, "id"),
                "annotator_metadata": row.get("Annotator_Metadata"),
            },
        )
        for number, row in enumerate(rows, 1)
    ]
