"""Reading benchmark files from disk, and the two decryptions the encrypted benchmarks use.

Every reader returns the file's records as plain dicts and turns anything wrong with the file into a one-line
`LoadError` that names the file, and the row when one row is at fault. Rows are numbered from 1 in file order,
not counting a header.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import posixpath
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path, PurePath
from typing import Any
from xml.etree import ElementTree

import pyarrow as pa
import pyarrow.parquet as pq

from nanbeige.agent.trajectory.trajectory_file import redact_json_line, usable_secrets
from nanbeige.evals.tasks import LoadError, read_data
from nanbeige.tools import handed_over

Row = dict[str, Any]


def decrypt_browsecomp(ciphertext: str, canary: str) -> str:
    """BrowseComp and BrowseComp-ZH: XOR with the SHA-256 digest of the canary, repeated over the bytes."""
    return _xor(_b64(ciphertext), hashlib.sha256(canary.encode("utf-8")).digest()).decode("utf-8")


def decrypt_xbench(ciphertext: str, canary: str) -> str:
    """xBench-DeepSearch: XOR with the canary's own UTF-8 bytes, repeated (no hashing)."""
    return _xor(_b64(ciphertext), canary.encode("utf-8")).decode("utf-8")


def _b64(text: str) -> bytes:
    # whitespace is dropped (as the upstream decoders do); any other stray character is an error, not skipped
    return base64.b64decode("".join(text.split()), validate=True)


def _xor(data: bytes, key: bytes) -> bytes:
    if not key:
        raise ValueError("empty key")
    return bytes(byte ^ key[i % len(key)] for i, byte in enumerate(data))


def decrypt_cell(
    path: Path, number: int, row: Row, column: str, canary: str, decrypt: Callable[[str, str], str]
) -> str:
    """The row's `column` decrypted with the row's canary."""
    ciphertext = text_cell(path, number, row, column)
    try:
        return decrypt(ciphertext, canary)
    except ValueError as error:
        # both failures are ValueErrors (binascii.Error, UnicodeDecodeError); a wrong canary mostly gives non-UTF-8
        reason = "not UTF-8 after decryption" if isinstance(error, UnicodeDecodeError) else "not base64"
        raise LoadError(f"{path} row {number}: cannot decrypt '{column}' with the row's canary ({reason})") from None


def text_cell(path: Path, number: int, row: Row, column: str) -> str:
    """The row's value in `column` as text; a missing or empty value is an error."""
    value = optional_text_cell(path, number, row, column)
    if not value.strip():
        raise LoadError(f"{path} row {number}: '{column}' is empty")
    return value


def optional_text_cell(path: Path, number: int, row: Row, column: str) -> str:
    """The row's value in `column` as text, "" when empty; a row without the field at all is an error."""
    if column not in row:
        raise LoadError(f"{path} row {number}: no field '{column}'")
    value = row[column]
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise LoadError(f"{path} row {number}: '{column}' is a {type(value).__name__}, expected text")
    return str(value)


def check_columns(path: Path, present: Iterable[str], required: Iterable[str]) -> None:
    present = list(present)
    missing = [name for name in required if name not in present]
    if missing:
        names = f"column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
        raise LoadError(f"{path}: missing {names} (columns: {', '.join(present)})")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def drop_torn_line(path: Path) -> None:
    """Cut off a last line left half-written by a kill, so every line reads as JSON and the next one
    starts on a line of its own (what that line held is simply done again)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as file:
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.seek(0)
            file.truncate(file.read().rfind(b"\n") + 1)


def append_jsonl(path: Path, row: dict[str, object], secrets: list[str] | None = None) -> None:
    """Append one row as a JSON line, synced to disk before returning: a finished piece of work is
    never lost to a crash after it. Each of `secrets` (keys, 8 characters or more) becomes `[REDACTED]`."""
    drop_torn_line(path)
    line = redact_json_line(json.dumps(row, ensure_ascii=False).encode(), usable_secrets(secrets))
    with open(path, "ab") as file:
        file.write(line + b"\n")
        file.flush()
        os.fsync(file.fileno())


def first_link(folder: Path) -> Path | None:
    """The first symbolic link found below `folder` (not the folder itself, which its user named), or None.
    `os.walk` lists a linked folder without entering it."""
    for root, folders, names in os.walk(folder):
        for name in sorted(folders + names):
            if os.path.islink(os.path.join(root, name)):
                return Path(root, name)
    return None


def write_inside(folder: Path, relative: PurePath, data: bytes) -> None:
    """Write `folder / relative` (a relative path without `..`), refusing (OSError) one with a symbolic link
    below `folder` on the way, which could lead it anywhere: the folders on the way are resolved before any
    is made, and the file itself is opened without following a link."""
    target = folder / relative
    if target.parent.resolve() != folder.resolve().joinpath(*relative.parts[:-1]):
        raise OSError(f"a symbolic link on the way to {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def _existing_file(path: Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"{path}: no such file")
    return path


def _some_rows(path: Path, rows: list[Row]) -> list[Row]:
    if not rows:
        raise LoadError(f"{path}: no rows (an empty file, or a header alone)")
    return rows


def _read_text(path: Path, encoding: str = "utf-8") -> str:
    try:
        return read_data(_existing_file(path)).decode(encoding)
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise LoadError(f"{path} line {line}: not UTF-8 text (byte {error.start}); is this the right file?") from None
    except OSError as error:
        raise LoadError(f"{path}: cannot read ({error.strerror or error})") from None
    except handed_over.HandedOverError as error:
        raise LoadError(str(error)) from None


def read_csv(path: Path, required: Iterable[str], encoding: str = "utf-8") -> list[Row]:
    """CSV rows with a header; `encoding="utf-8-sig"` drops a leading byte-order mark."""
    text = _read_text(path, encoding)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [name.strip() for name in reader.fieldnames or []]
        if not header:
            raise LoadError(f"{path}: no header row (empty file)")
        reader.fieldnames = header
        rows = list(reader)
    except csv.Error as error:
        raise LoadError(f"{path}: not a valid CSV file ({error})") from None
    check_columns(path, header, required)
    return _some_rows(path, rows)


def read_jsonl(path: Path) -> list[Row]:
    """One JSON object per line; blank lines are skipped."""
    rows = []
    for line_number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise LoadError(f"{path} line {line_number}: not JSON ({error.msg})") from None
        except RecursionError:  # a hostile file: Python's parser recurses once per level
            raise LoadError(f"{path} line {line_number}: nested too deeply to be a row") from None
        if not isinstance(row, dict):
            raise LoadError(f"{path} line {line_number}: not a JSON object")
        rows.append(row)
    return _some_rows(path, rows)


def read_json_array(path: Path) -> list[Row]:
    """A file holding one JSON array of objects."""
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise LoadError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:
        raise LoadError(f"{path}: nested too deeply to be a list of rows") from None
    if not isinstance(data, list):
        raise LoadError(f"{path}: expected a JSON array of questions, found a {type(data).__name__}")
    for number, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise LoadError(f"{path} row {number}: not a JSON object")
    return _some_rows(path, data)


def read_parquet(path: Path, required: Iterable[str], optional: Iterable[str] = ()) -> list[Row]:
    """The rows of a parquet file, reading only the named columns (HLE's images are large)."""
    path = _existing_file(path)
    try:
        present = pq.read_schema(path).names
        check_columns(path, present, required)
        columns = list(required) + [name for name in optional if name in present]
        return _some_rows(path, pq.read_table(path, columns=columns).to_pylist())
    except (pa.ArrowException, OSError) as error:
        raise LoadError(f"{path}: not a readable parquet file ({_first_line(error)})") from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


XLSX = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
RELATIONSHIP_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
PACKAGE_RELATIONSHIP = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"


def read_xlsx(path: Path, required: Iterable[str]) -> list[Row]:
    """The first worksheet of an .xlsx workbook as rows keyed by its header row, without any spreadsheet library."""
    path = _existing_file(path)
    try:
        with zipfile.ZipFile(path) as archive:
            shared = _shared_strings(archive)
            sheet = ElementTree.fromstring(archive.read(_first_sheet_name(archive)))
    except (zipfile.BadZipFile, zlib.error, EOFError):
        raise LoadError(f"{path}: not an .xlsx workbook (not a readable zip archive)") from None
    except KeyError as error:
        raise LoadError(f"{path}: not an .xlsx workbook ({error.args[0]})") from None
    except ElementTree.ParseError as error:
        raise LoadError(f"{path}: broken .xlsx workbook (bad XML: {error})") from None
    except OSError as error:
        raise LoadError(f"{path}: cannot read ({error.strerror or error})") from None
    grid = [_sheet_row(path, row, shared) for row in sheet.iter(f"{XLSX}row")]
    grid = [cells for cells in grid if any(value.strip() for value in cells.values())]
    if not grid:
        raise LoadError(f"{path}: no rows (empty worksheet)")
    header = {column: name.strip() for column, name in grid[0].items()}
    check_columns(path, header.values(), required)
    return _some_rows(path, [{name: cells.get(column, "") for column, name in header.items()} for cells in grid[1:]])


def _first_sheet_name(archive: zipfile.ZipFile) -> str:
    """The zip member holding the workbook's first sheet, found through the workbook's relationships."""
    workbook = ElementTree.fromstring(archive.read("xl/workbook.xml"))
    first = workbook.find(f"{XLSX}sheets/{XLSX}sheet")
    if first is None:
        raise KeyError("the workbook lists no worksheet")
    relations = ElementTree.fromstring(archive.read("xl/_rels/workbook.xml.rels"))
    for relation in relations.iter(PACKAGE_RELATIONSHIP):
        if relation.get("Id") == first.get(RELATIONSHIP_ID):
            target = relation.get("Target", "")
            # targets are relative to xl/, or absolute from the package root
            return target.lstrip("/") if target.startswith("/") else posixpath.normpath(f"xl/{target}")
    raise KeyError("the first worksheet has no relationship entry")


def _shared_strings(archive: zipfile.ZipFile) -> list[str]:
    if "xl/sharedStrings.xml" not in archive.namelist():
        return []  # a workbook of inline strings and numbers needs none
    table = ElementTree.fromstring(archive.read("xl/sharedStrings.xml"))
    # an entry is one <t>, or rich-text runs <r><t>; phonetic hints (<rPh>) are not part of the text
    return [
        "".join(t.text or "" for t in item.findall(f"{XLSX}t") + item.findall(f"{XLSX}r/{XLSX}t"))
        for item in table.iter(f"{XLSX}si")
    ]


def _sheet_row(path: Path, row: ElementTree.Element, shared: list[str]) -> dict[int, str]:
    """One worksheet row as {column index: text}; empty cells are simply absent from the XML."""
    cells = {}
    column = -1
    for cell in row.iter(f"{XLSX}c"):
        reference = cell.get("r")
        column = _column_index(reference) if reference else column + 1
        kind = cell.get("t", "n")
        if kind == "inlineStr":
            cells[column] = "".join(t.text or "" for t in cell.iter(f"{XLSX}t"))
            continue
        value = cell.findtext(f"{XLSX}v")
        if value is None:
            continue
        if kind == "s":
            try:
                value = shared[int(value)]
            except (ValueError, IndexError):
                raise LoadError(f"{path} cell {reference}: shared string {value!r} is not in the table") from None
        cells[column] = value
    return cells


def _column_index(reference: str) -> int:
    """0 for `A1`, 1 for `B12`, 26 for `AA3`."""
    index = 0
    for letter in reference.rstrip("0123456789").upper():
        index = index * 26 + ord(letter) - ord("A") + 1
    return index - 1
