"""The rows of a dataset's file (JSONL, JSON, parquet, or the arrow files `datasets` writes), read one at a time
with where each is, for the code problem converters (`code_formats.py`): a dataset's shard can be gigabytes, so
a table is read a batch at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nanbeige.evals.tasks import LoadError, read_data


def rows_of(path: Path) -> Iterator[tuple[str, Any]]:
    """Each row of a JSONL, JSON (a list of rows), parquet or arrow file, with where it is (`file:line` or
    `file: row N`); a line that is not JSON comes as the `LoadError` that says so."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".arrow"):
        yield from table_rows(path, suffix)
        return
    try:
        text = read_data(path).decode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a file `read_data` refuses
        raise LoadError(f"{path}: cannot read the problems: {exc}") from None
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except (ValueError, RecursionError):
            raise LoadError(f"{path}: not JSON (a .json file holds a list of rows; one row a line is .jsonl)") from None
        if not isinstance(rows, list):
            raise LoadError(f"{path}: a .json file must hold a list of rows")
        yield from ((f"{path}: row {n}", row) for n, row in enumerate(rows, 1))
        return
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may stand in a JSON string
        if line.strip():
            yield f"{path}:{number}", json_or_error(line, f"{path}:{number}")


def json_or_error(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return LoadError(f"{where}: not JSON")


def table_rows(path: Path, suffix: str) -> Iterator[tuple[str, Any]]:
    """Parquet (or the arrow stream files `datasets` writes) a batch at a time: a dataset's shard can be
    gigabytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = suffix.lstrip(".")
    number = 0
    try:
        if kind == "parquet":
            batches: Any = pq.ParquetFile(path).iter_batches(batch_size=64)
        else:
            batches = pa.ipc.open_stream(pa.memory_map(str(path)))
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield f"{path}: row {number}", row
    except (OSError, pa.ArrowException) as exc:
        raise LoadError(f"{path}: cannot read it as {kind}: {str(exc)[:200]}") from None
