"""Writers for benchmark files in their official formats, filled with made-up questions, for the loader tests.

The encrypt functions are the inverse of the published decryptions, written here independently of `evals.files`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import pyarrow as pa
import pyarrow.parquet as pq


def _xor(data: bytes, key: bytes) -> bytes:
    return bytes(byte ^ key[i % len(key)] for i, byte in enumerate(data))


def encrypt_browsecomp(plaintext: str, canary: str) -> str:
    key = hashlib.sha256(canary.encode("utf-8")).digest()
    return base64.b64encode(_xor(plaintext.encode("utf-8"), key)).decode("ascii")


def encrypt_xbench(plaintext: str, canary: str) -> str:
    return base64.b64encode(_xor(plaintext.encode("utf-8"), canary.encode("utf-8"))).decode("ascii")


def write_csv(path: Path, rows: list[dict], encoding: str = "utf-8") -> Path:
    with open(path, "w", newline="", encoding=encoding) as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def write_json(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
RELS = "http://schemas.openxmlformats.org/package/2006/relationships"
DOC_RELS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def write_xlsx(path: Path, rows: list[list]) -> Path:
    """A one-sheet workbook laid out as Excel writes it. A cell is a string (stored in the shared-string table),
    a `("inlineStr", text)` or `("str", text)` pair for the other two string kinds, or None (left out of the XML,
    as Excel leaves out empty cells)."""
    shared: list[str] = []
    sheet_rows = []
    for row_number, row in enumerate(rows, 1):
        cells = []
        for column, value in enumerate(row):
            reference = f"{chr(ord('A') + column)}{row_number}"
            if value is None:
                continue
            if isinstance(value, str):
                shared.append(value)
                cells.append(f'<c r="{reference}" t="s"><v>{len(shared) - 1}</v></c>')
            elif value[0] == "inlineStr":
                cells.append(f'<c r="{reference}" t="inlineStr"><is><t>{escape(value[1])}</t></is></c>')
            else:
                cells.append(f'<c r="{reference}" t="str"><f>A1</f><v>{escape(value[1])}</v></c>')
        sheet_rows.append(f'<row r="{row_number}">{"".join(cells)}</row>')
    strings = "".join(f"<si><t>{escape(text)}</t></si>" for text in shared)
    members = {
        "[Content_Types].xml": (
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/></Types>'
        ),
        "_rels/.rels": (
            f'<Relationships xmlns="{RELS}"><Relationship Id="rId1" Target="xl/workbook.xml" '
            f'Type="{DOC_RELS}/officeDocument"/></Relationships>'
        ),
        "xl/workbook.xml": (
            f'<workbook xmlns="{MAIN}" xmlns:r="{DOC_RELS}"><sheets>'
            '<sheet name="Sheet1" sheetId="1" r:id="rId3"/></sheets></workbook>'
        ),
        # neither the sheet's relationship id nor its part name is the usual one: the reader must follow the link
        "xl/_rels/workbook.xml.rels": (
            f'<Relationships xmlns="{RELS}">'
            f'<Relationship Id="rId1" Type="{DOC_RELS}/sharedStrings" Target="sharedStrings.xml"/>'
            f'<Relationship Id="rId3" Type="{DOC_RELS}/worksheet" Target="worksheets/questions.xml"/>'
            "</Relationships>"
        ),
        "xl/sharedStrings.xml": f'<sst xmlns="{MAIN}" count="{len(shared)}">{strings}</sst>',
        "xl/worksheets/questions.xml": (
            f'<worksheet xmlns="{MAIN}"><sheetData>{"".join(sheet_rows)}</sheetData></worksheet>'
        ),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, xml in members.items():
            archive.writestr(name, '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n' + xml)
    return path
