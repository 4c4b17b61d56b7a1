"""Documents for the local index, read from your files: text, Markdown, HTML, PDF, and JSON / JSONL
records with title / text / url fields; and long texts split into passages, so that a search hit
points at the part that matches."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nanbeige.tools.errors import NanbeigeError

TEXT_SUFFIXES = {".txt", ".md", ".markdown"}
HTML_SUFFIXES = {".html", ".htm"}
RECORD_SUFFIXES = {".json", ".jsonl"}
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | RECORD_SUFFIXES | {".pdf"}
PASSAGE_WORDS = 200
TITLE_KEYS = ("title", "name", "heading", "headline")
TEXT_KEYS = ("text", "content", "contents", "body", "extract", "abstract", "summary", "passage")
URL_KEYS = ("url", "link", "href", "uri", "source_url")


class IndexBuildError(NanbeigeError):
    """The sources cannot be indexed (nothing readable found, or the output folder is not an index)."""


def source_files(sources: Iterable[str | os.PathLike[str]], skipped: list[str] | None = None) -> list[Path]:
    """Every indexable file under the given files and folders, in a stable order. A file named on its own is
    read as named. In a folder, a symbolic link that leads out of it (to a file or a folder) is not read and
    is said in `skipped`: a downloaded corpus may hold a link to the user's private files, which would
    otherwise become what the model reads. A link to a file inside the folder is read (once, with the file
    it names); a linked folder is not entered, so that a link cannot loop."""
    files: list[Path] = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_dir():
            files += _folder_files(path, [] if skipped is None else skipped)
        elif path.is_file():
            files.append(path)
        else:
            raise IndexBuildError(f"source not found: {path}")
    return files


def _folder_files(folder: Path, skipped: list[str]) -> list[Path]:
    root = folder.resolve()
    found: dict[Path, Path] = {}  # each file's real place -> the path it is read from
    for where, folders, names in os.walk(folder):  # followlinks=False: a linked folder is not entered
        here = Path(where)
        folders[:] = [name for name in folders if not name.startswith(".")]  # hidden ones, as ls hides them
        for name in folders:
            if (here / name).is_symlink() and not (here / name).resolve().is_relative_to(root):
                skipped.append(f"{here / name}: a symbolic link out of {folder}; not read")
        for name in names:
            path = here / name
            if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                continue
            real = path.resolve()
            if path.is_symlink() and not real.is_relative_to(root):
                skipped.append(f"{path}: a symbolic link out of {folder}; not read")
            elif real.is_file():  # not a link that leads nowhere, nor a FIFO or a device
                found.setdefault(real, real if path.is_symlink() else path)
    return sorted(found.values())


def read_documents(path: Path) -> list[dict[str, Any]]:
    """The documents in one file: dicts with `title` and `sections`, a list of `(link, text)`.

    A PDF has one section per page (its link ends in `#page=N`); other files have one."""
    suffix = path.suffix.lower()
    if suffix in RECORD_SUFFIXES:
        return read_records(path)
    if suffix == ".pdf":
        return [_read_pdf(path)]
    if suffix in HTML_SUFFIXES:
        return [_read_html(path)]
    if suffix in TEXT_SUFFIXES:
        text = path.read_text(encoding="utf-8", errors="replace")
        return [{"title": _text_title(text) or path.stem, "sections": [(path.resolve().as_uri(), text)]}]
    raise IndexBuildError(f"{path}: unsupported file type (use {', '.join(sorted(SUFFIXES))})")


def _text_title(text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line if len(line) <= 120 else None
    return None


def _read_html(path: Path) -> dict[str, Any]:
    import trafilatura  # slow to import; only builds need it

    html = path.read_text(encoding="utf-8", errors="replace")
    meta = trafilatura.extract_metadata(html)
    text = trafilatura.extract(html, output_format="txt", favor_recall=True) or trafilatura.html2txt(html)
    link = meta.url if meta and meta.url and meta.url.startswith(("http://", "https://")) else path.resolve().as_uri()
    return {"title": (meta.title if meta and meta.title else None) or path.stem, "sections": [(link, text)]}


def _read_pdf(path: Path) -> dict[str, Any]:
    import pypdf

    reader = pypdf.PdfReader(path)
    title = reader.metadata.title if reader.metadata and reader.metadata.title else None
    uri = path.resolve().as_uri()
    sections = [(f"{uri}#page={n}", page.extract_text() or "") for n, page in enumerate(reader.pages, start=1)]
    return {"title": title or path.stem, "sections": sections}


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records from a JSON list, a JSON object of records keyed by id or title, or JSONL lines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".jsonl":
        items: Iterable[tuple[str, Any]] = (
            (str(n), json.loads(line)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()
        )
    else:
        data = json.loads(text)
        if isinstance(data, dict):
            items = data.items()
        elif isinstance(data, list):
            items = ((str(n), record) for n, record in enumerate(data, start=1))
        else:
            raise IndexBuildError(f"{path}: expected a JSON list or object of records")
    uri = path.resolve().as_uri()
    return [record_document(record, f"{uri}#{quote(key, safe='')}") for key, record in items]


def _first(record: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def record_document(record: Any, fallback_link: str) -> dict[str, Any]:
    """One JSON record as a document; no sections when it has no text."""
    if not isinstance(record, dict):
        return {"title": "", "sections": []}
    title, text = _first(record, TITLE_KEYS), _first(record, TEXT_KEYS)
    description = _first(record, ("description",))
    if description and text and description not in text:
        text = f"{description}.\n\n{text}"  # e.g. "English polymath (1642–1727)": who or what it is
    text = text or description
    if not text:
        return {"title": title or "", "sections": []}
    link = _first(record, URL_KEYS) or fallback_link
    return {"title": title or " ".join(text.split()[:8]), "sections": [(link, text)]}


def split_passages(text: str, max_words: int = PASSAGE_WORDS) -> list[str]:
    """Consecutive paragraphs grouped into passages of at most about `max_words` words."""
    passages: list[str] = []
    current: list[str] = []
    count = 0
    for paragraph in re.split(r"\n\s*\n", text):
        for piece in _pieces(" ".join(paragraph.split()), max_words):
            words = len(piece.split())
            if current and count + words > max_words:
                passages.append("\n\n".join(current))
                current, count = [], 0
            current.append(piece)
            count += words
    if current:
        passages.append("\n\n".join(current))
    return passages


def _pieces(paragraph: str, max_words: int) -> list[str]:
    """A paragraph cut at sentence ends (or, for run-on text, every `max_words` words)."""
    if not paragraph or len(paragraph.split()) <= max_words:
        return [paragraph] if paragraph else []
    pieces: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        words = sentence.split()
        pieces += [" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words)]
    return pieces
