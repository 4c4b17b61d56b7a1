"""A local full-text index over your own documents, searched like a web search engine.

`build_index` reads folders and files (`.txt`, `.md`, `.html`, `.pdf`, and JSON / JSONL records
with title / text / url fields), splits long documents into passages so that a hit points at the
part that matches, and saves a BM25 index (bm25s) in a folder. `LocalIndex.load(folder).search(q)`
returns hits in the shape of Serper's `organic[]` (title, link, snippet, position), one per
document, with a snippet cut around the matched words.

    nanbeige index build ~/papers ~/notes --out ~/.local/share/nanbeige/index
    nanbeige index search ~/.local/share/nanbeige/index "attention is all you need"
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from nanbeige.tools import handed_over
from nanbeige.tools.documents import SUFFIXES, IndexBuildError, read_documents, source_files, split_passages
from nanbeige.tools.errors import NanbeigeError

FORMAT = "nanbeige-index/1"
META_FILE = "index.json"
PASSAGES_FILE = "passages.jsonl"
BM25_DIR = "bm25"
TITLE_DIR = "bm25_title"
TITLE_WEIGHT = 0.5  # a title match counts on top of the text score: people are found by their own article
CHUNK = 5000  # passages tokenized between two progress reports
MAX_INDEX_BYTES = 4 * 1024 * handed_over.MIB
"""The largest index folder `LocalIndex.load` reads: all of it is held in memory (its passages several times
their size on disk), and a downloaded folder could claim any size."""
MAX_META_BYTES = handed_over.MIB
PASSAGE_FIELDS = {"doc": int, "title": str, "link": str, "text": str}

Progress = Callable[[str, int, int], None]
"""Called as `progress(stage, done, total)`; stages are "read" (files), "index" (passages), "save"."""


class IndexNotFound(NanbeigeError):
    """There is no index in the given folder."""


class IndexUnreadable(IndexNotFound):
    """The folder holds something other than what `build_index` writes: a link, a FIFO, a file too large,
    a row that is no passage. The folder may have been downloaded or handed over, so it is checked as such."""


@dataclass
class IndexStats:
    """What `build_index` did."""

    out_dir: str
    """The index folder."""
    files: int = 0
    """Source files read."""
    documents: int = 0
    """Documents indexed (a JSON file of records counts one per record)."""
    passages: int = 0
    """Passages indexed; long documents are split into several."""
    unreadable: list[str] = field(default_factory=list)
    """Files that failed to read (damaged, not what their name says, a library missing), each with the
    error; the index holds the rest."""
    skipped: list[str] = field(default_factory=list)
    """What was left out, each with the reason: records or files with no text, files named on their own
    whose type the index does not read, and symbolic links out of a source folder (never read)."""
    seconds: float = 0.0
    """Wall time of the build."""
    bytes_on_disk: int = 0
    """Size of the index folder."""


def default_index_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$NANBEIGE_INDEX`, else `$XDG_DATA_HOME/nanbeige/index`, else `~/.local/share/nanbeige/index`."""
    env = os.environ if env is None else env
    if env.get("NANBEIGE_INDEX"):
        return Path(env["NANBEIGE_INDEX"]).expanduser()
    data_home = Path(env["XDG_DATA_HOME"]).expanduser() if env.get("XDG_DATA_HOME") else Path.home() / ".local/share"
    return data_home / "nanbeige" / "index"


def index_exists(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / META_FILE).is_file()


# ---------------------------------------------------------------- reading sources


# ---------------------------------------------------------------- tokens


def tokenize(texts: list[str], stopwords: str | None = "en") -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords=stopwords, return_ids=False, show_progress=False)


def query_tokens(query: str) -> list[str]:
    """The query's terms; a query made only of stopwords ("The Who") keeps them."""
    return tokenize([query])[0] or tokenize([query], stopwords=None)[0]


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


# ---------------------------------------------------------------- building


def build_index(
    sources: Iterable[str | os.PathLike[str]], out_dir: str | os.PathLike[str], progress: Progress | None = None
) -> IndexStats:
    """Index every document under `sources` into `out_dir`, replacing an index already there.

    The index is written next to `out_dir` and moved into place at the end, so a failed build
    leaves the previous index intact. A file that fails to read is left out and listed in
    `stats.unreadable`; a folder that exists but holds something other than an index is refused."""
    started = time.perf_counter()
    out = Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()) and not index_exists(out):
        raise IndexBuildError(f"{out} exists and is not a nanbeige index; choose an empty or new folder")
    skipped: list[str] = []  # links out of a source folder, not read
    files = source_files(sources, skipped)
    stats = IndexStats(out_dir=str(out), files=len(files), skipped=skipped)
    passages = _collect_passages(files, stats, progress)
    if not passages and stats.unreadable:
        raise IndexBuildError(
            f"no text found to index: {len(stats.unreadable)} of {stats.files} files could not "
            f"be read; the first: {stats.unreadable[0]}"
        )
    if not passages:
        raise IndexBuildError(f"no text found to index (looked for {', '.join(sorted(SUFFIXES))} files)")
    tokens: list[list[str]] = []
    for start in range(0, len(passages), CHUNK):
        tokens += tokenize([f"{p['title']}\n{p['title']}\n{p['text']}" for p in passages[start : start + CHUNK]])
        _report(progress, "index", min(start + CHUNK, len(passages)), len(passages))
    retrievers = {BM25_DIR: bm25s.BM25(), TITLE_DIR: bm25s.BM25()}
    retrievers[BM25_DIR].index(tokens, show_progress=False)
    retrievers[TITLE_DIR].index(tokenize([p["title"] for p in passages]), show_progress=False)
    _save(out, retrievers, passages, stats, progress)
    stats.seconds = time.perf_counter() - started
    stats.bytes_on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return stats


def _report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _collect_passages(files: list[Path], stats: IndexStats, progress: Progress | None) -> list[dict[str, Any]]:
    passages: list[dict[str, Any]] = []
    for n, path in enumerate(files, start=1):
        for document in _read(path, stats):
            texts = [(link, text) for link, section in document["sections"] for text in split_passages(section)]
            if not texts:
                stats.skipped.append(f"{path}: a document with no text ({document['title'] or 'untitled'})")
                continue
            passages += [
                {"doc": stats.documents, "title": document["title"], "link": link, "text": text} for link, text in texts
            ]
            stats.documents += 1
        _report(progress, "read", n, len(files))
    stats.passages = len(passages)
    return passages


def _read(path: Path, stats: IndexStats) -> list[dict[str, Any]]:
    """The documents in one file; none, noted in `stats`, when its type is not one the index reads
    (only a file named on its own gets here: a folder walk passes them by) or it fails to read."""
    if path.suffix.lower() not in SUFFIXES:
        stats.skipped.append(f"{path}: not a type the index reads ({', '.join(sorted(SUFFIXES))})")
        return []
    try:
        return read_documents(path)
    except Exception as exc:  # json raises ValueError, a damaged PDF almost anything, a missing library ImportError
        stats.unreadable.append(f"{path}: {type(exc).__name__}: {exc}")
        return []


def _save(
    out: Path,
    retrievers: dict[str, bm25s.BM25],
    passages: list[dict[str, Any]],
    stats: IndexStats,
    progress: Progress | None,
) -> None:
    _report(progress, "save", 0, 1)
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for name, retriever in retrievers.items():
        retriever.save(str(building / name), show_progress=False)
    with open(building / PASSAGES_FILE, "w", encoding="utf-8") as f:
        for passage in passages:
            f.write(json.dumps(passage, ensure_ascii=False) + "\n")
    meta = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stats": asdict(stats)}
    (building / META_FILE).write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        building.rename(out)
        shutil.rmtree(old)
    else:
        building.rename(out)
    _report(progress, "save", 1, 1)


# ---------------------------------------------------------------- searching


class LocalIndex:
    """A loaded index: BM25 matrices over passages (title and text) and over titles alone, and the
    passages they point at."""

    def __init__(self, path: Path, retriever: bm25s.BM25, titles: bm25s.BM25, passages: list[dict[str, Any]]):
        self.path = path
        self.retriever = retriever
        self.titles = titles
        self.passages = passages

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LocalIndex:
        """The index in folder `path`, which may come from anyone: it is checked (no link, FIFO or device in
        it, its size capped) before bm25s opens its files, and its own files are read as handed over."""
        path = Path(path).expanduser()
        if not index_exists(path):
            raise IndexNotFound(f"no index in {path}; build one with `nanbeige index build SOURCES... --out {path}`")
        fix = f"rebuild it with `nanbeige index build SOURCES... --out {path}`"
        try:
            handed_over.check_folder(path, MAX_INDEX_BYTES)
            meta = handed_over.read_json_object(path / META_FILE, MAX_META_BYTES, inside=path)
            if meta.get("format") != FORMAT:
                raise IndexUnreadable(f"{path} holds an index of format {meta.get('format')!r}, not {FORMAT!r}; {fix}")
            passages = _read_passages(path / PASSAGES_FILE, path)
        except (OSError, ValueError) as exc:
            said = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
            raise IndexUnreadable(f"cannot read the index in {path}: {said}; {fix}") from None
        try:
            retriever = bm25s.BM25.load(str(path / BM25_DIR), show_progress=False)
            titles = bm25s.BM25.load(str(path / TITLE_DIR), show_progress=False)
        except Exception as exc:  # noqa: BLE001 - bm25s reading a damaged or foreign folder: any of its errors
            said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise IndexUnreadable(f"cannot read the BM25 index in {path}: {said}; {fix}") from None
        if not _fits(retriever, len(passages)) or not _fits(titles, len(passages)):
            raise IndexUnreadable(f"{path}: the BM25 index and {PASSAGES_FILE} do not match; {fix}")
        return cls(path, retriever, titles, passages)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int = 10, offset: int = 0) -> list[dict[str, Any]]:
        """The best `k` documents after the first `offset`, as Serper-style organic hits.

        Phrases in double quotes must appear as written (ignoring case and punctuation)."""
        terms = [t for t in query_tokens(query) if t in self.retriever.vocab_dict]
        if not terms or k <= 0:
            return []
        scores = self.retriever.get_scores(terms)
        title_terms = [t for t in terms if t in self.titles.vocab_dict]
        if title_terms:
            scores = scores + TITLE_WEIGHT * self.titles.get_scores(title_terms)
        phrases = [" ".join(words(p)) for p in re.findall(r'"([^"]+)"', query) if words(p)]
        hits: list[dict[str, Any]] = []
        seen: set[int] = set()
        for i in _ranked(scores, limit=max(200, 20 * (offset + k))):
            passage = self.passages[i]
            if passage["doc"] in seen or not all(p in " ".join(words(passage["text"])) for p in phrases):
                continue
            seen.add(passage["doc"])
            hits.append(passage)
            if len(hits) == offset + k:
                break
        highlight = set(terms) | {w for p in phrases for w in p.split()}
        return [
            {"title": p["title"], "link": p["link"], "snippet": make_snippet(p["text"], highlight), "position": n}
            for n, p in enumerate(hits[offset:], start=offset + 1)
        ]


def _fits(retriever: bm25s.BM25, passages: int) -> bool:
    """Whether a loaded BM25 matrix scores exactly `passages` rows and every term points into it: a search
    indexes the passages by its rows, so a foreign matrix would fail there, not here."""
    scores = retriever.scores
    try:
        indptr, indices = scores["indptr"], scores["indices"]
        terms = [t for term, t in retriever.vocab_dict.items() if term]  # bm25s adds "" with no column
        return (
            scores["num_docs"] == passages
            and len(indptr) >= 1
            and len(scores["data"]) == len(indices) == int(indptr[-1])
            and bool(np.all(np.diff(indptr) >= 0))
            and (len(indices) == 0 or 0 <= int(indices.min()) and int(indices.max()) < passages)
            and all(isinstance(t, int) and 0 <= t < len(indptr) - 1 for t in terms)
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


def _read_passages(path: Path, folder: Path) -> list[dict[str, Any]]:
    """The passages file's rows, each checked to be a passage (document number, title, link, text)."""
    passages = []
    with handed_over.open_file(path, MAX_INDEX_BYTES, inside=folder) as file:
        for number, line in enumerate(file, 1):
            passage = passage_of(line)
            if passage is None:
                raise IndexUnreadable(f"{path}:{number}: not a passage of a nanbeige index; rebuild the index")
            passages.append(passage)
    return passages


def passage_of(line: bytes) -> dict[str, Any] | None:
    """A line of the passages file as the passage it is (document number, title, link, text), or None when it
    is not one: the file may come from anyone."""
    try:
        passage = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(passage, dict) or not all(isinstance(passage.get(k), t) for k, t in PASSAGE_FIELDS.items()):
        return None
    return passage


def _ranked(scores: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the passages that match at all (score > 0), best first, at most `limit` of them."""
    matching = np.flatnonzero(scores > 0)
    if len(matching) > limit:
        matching = matching[np.argpartition(-scores[matching], limit)[:limit]]
    return matching[np.argsort(-scores[matching], kind="stable")]


def make_snippet(text: str, terms: set[str], max_chars: int = 300) -> str:
    """The stretch of `text` (about `max_chars` long) holding the most distinct query terms."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    spans = list(re.finditer(r"\w+", text))
    matches = [i for i, m in enumerate(spans) if m.group().lower() in terms]
    best, best_count = 0, -1
    for start in [0] + [max(0, i - 4) for i in matches]:  # a few words of lead-in before a match
        end = _end_within(spans, start, max_chars)
        count = len({spans[j].group().lower() for j in matches if start <= j < end})
        if count > best_count:
            best, best_count = start, count
    end = _end_within(spans, best, max_chars)
    snippet = text[spans[best].start() : spans[end - 1].end()]
    prefix = "..." if best > 0 else ""
    suffix = "..." if end < len(spans) else text[spans[-1].end() :].strip()
    return f"{prefix}{snippet}{suffix}"


def _end_within(spans: list[re.Match[str]], start: int, max_chars: int) -> int:
    """One past the last word that keeps the text from word `start` within `max_chars`."""
    end = start + 1
    while end < len(spans) and spans[end].end() - spans[start].start() <= max_chars:
        end += 1
    return end


def search_index(index_dir: str | os.PathLike[str], query: str, k: int = 10) -> list[dict[str, Any]]:
    """Load the index in `index_dir` and search it once (for `nanbeige index search`)."""
    return LocalIndex.load(index_dir).search(query, k)
