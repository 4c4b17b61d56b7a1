"""An entity graph over the documents of a local index, and conditional random walks on it.

One node per document of an index built by `nanbeige index build` (its passages grouped again). Document
A links to document B when B's name occurs in A's text: B's title, or its title without a trailing
qualifier in parentheses where no other title starts with the same words ("Basque Country (autonomous
community)" is named "Basque Country"; "Amazon (company)" is not named "Amazon", as "Amazon River" is a
title too), matched whole-word and case-sensitively, never a document's own name. Names shorter than 4
characters are skipped, and so are common words: a name is kept when it has a capital letter or digit
after its first character ("Isaac Newton", "World War II"), or when the corpus writes it capitalised on
its own, mid-sentence, more often than with a lower-case first letter ("Paris", "Buddhism"; not "Water",
"Climate change"). Each link keeps the sentence of A that mentions B: the evidence for the hop.

Names are found by token look-up, not one regex per title: the text is split into words and punctuation,
and at each word the names that start with it are tried longest first, so 10,000 documents take seconds.

    graph = build_graph(load_documents(index_dir))
    for walk in walks(graph, hops=2, seed=0, tries=1000): ...
"""

from __future__ import annotations

import bisect
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nanbeige.tools import handed_over
from nanbeige.tools.errors import NanbeigeError
from nanbeige.tools.index import FORMAT, MAX_META_BYTES, META_FILE, PASSAGES_FILE, passage_of

MIN_NAME_CHARS = 4
MAX_PASSAGES_BYTES = 16 * 1024 * handed_over.MIB  # all of English Wikipedia's text is about 20 GB
_TOKEN = re.compile(r"\w+|[^\w\s]")
_QUALIFIER = re.compile(r"\s+\([^()]*\)$")
# A sentence ends at . ! or ? followed by space and a capital, digit or opening quote, or at a blank line.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'“(\[])|\n\s*\n")


class SynthError(NanbeigeError):
    """The corpus or the question-writing model cannot be used; the message names the fix."""


@dataclass
class Document:
    """One document of the index: its passages joined again."""

    title: str
    """The document's title as the index holds it."""
    link: str
    """Where the document came from (its first passage's link: a URL, or a file URI with an anchor)."""
    text: str
    """The document's whole text."""


@dataclass
class Graph:
    """Documents and the links between them."""

    documents: list[Document]
    """The nodes, by document number."""
    names: list[str | None]
    """The name each document is found by in other texts; None when it has none (too short, a common
    word, or shared with another document)."""
    links: list[dict[int, str]]
    """`links[a][b]`: the sentence of document a that mentions document b (the first such)."""
    inbound: list[int]
    """How many other documents mention each document: low means a rare entity."""
    seconds: float = 0.0
    """Time taken to build the graph."""

    @property
    def edges(self) -> int:
        return sum(len(out) for out in self.links)


def load_documents(index_dir: Path) -> list[Document]:
    """The documents of the index in `index_dir`, their passages grouped again in order."""
    index_dir = Path(index_dir).expanduser()
    fix = f"build one with `nanbeige index build SOURCES... --out {index_dir}`"
    if not index_dir.is_dir():
        raise SynthError(f"no index folder at {index_dir}; {fix}")
    if not (index_dir / META_FILE).is_file() or not (index_dir / PASSAGES_FILE).is_file():
        raise SynthError(f"{index_dir} is not a nanbeige index (no {META_FILE} or {PASSAGES_FILE}); {fix}")
    # The folder may be a downloaded one: its files are read as handed over (no link out, no FIFO, capped).
    try:
        meta = handed_over.read_json_object(index_dir / META_FILE, MAX_META_BYTES, inside=index_dir)
        passages = handed_over.open_file(index_dir / PASSAGES_FILE, MAX_PASSAGES_BYTES, inside=index_dir)
    except (OSError, ValueError) as exc:
        raise SynthError(f"cannot read the index in {index_dir}: {getattr(exc, 'strerror', None) or exc}") from None
    if meta.get("format") != FORMAT:
        raise SynthError(f"{index_dir} holds an index of format {meta.get('format')!r}, not {FORMAT!r}; {fix}")
    documents: dict[int, Document] = {}
    with passages:
        for number, line in enumerate(passages, 1):
            passage = passage_of(line)
            if passage is None:
                raise SynthError(f"{index_dir / PASSAGES_FILE}:{number}: not a passage of a nanbeige index; {fix}")
            document = documents.get(passage["doc"])
            if document is None:
                documents[passage["doc"]] = Document(passage["title"], passage["link"], passage["text"])
            else:
                document.text += "\n\n" + passage["text"]
    return [documents[n] for n in sorted(documents)]


def _key(text: str) -> tuple[str, ...]:
    return tuple(_TOKEN.findall(text))


def _candidate_names(documents: list[Document]) -> dict[tuple[str, ...], int]:
    """Each possible name (as tokens) and the one document it names: full titles, then titles without
    their qualifier where no other title starts with the same words ("Amazon (company)" is not named
    "Amazon" while "Amazon River" is a title too; "Mercury (planet)" is not when "Mercury (element)" is)."""
    names: dict[tuple[str, ...], int] = {}
    starts: Counter[tuple[str, ...]] = Counter()  # how many titles start with these tokens
    for n, document in enumerate(documents):
        key = _key(document.title)
        starts.update(key[:i] for i in range(1, len(key) + 1))
        if len(document.title) >= MIN_NAME_CHARS:
            names.setdefault(key, n)
    for n, document in enumerate(documents):
        bare = _QUALIFIER.sub("", document.title)
        if bare != document.title and len(bare) >= MIN_NAME_CHARS and starts[_key(bare)] == 1:
            names[_key(bare)] = n
    return {key: n for key, n in names.items() if key}


def _lowered(key: tuple[str, ...]) -> tuple[str, ...]:
    return (key[0][:1].lower() + key[0][1:],) + key[1:]


def _by_first(keys: Iterable[tuple[str, ...]]) -> dict[str, list[int]]:
    """For each first token, the lengths of the names that start with it, longest first."""
    lengths: dict[str, set[int]] = {}
    for key in keys:
        lengths.setdefault(key[0], set()).add(len(key))
    return {first: sorted(ns, reverse=True) for first, ns in lengths.items()}


def _scan(
    tokens: list[re.Match[str]], names: dict[tuple[str, ...], int], first: dict[str, list[int]]
) -> Iterator[tuple[int, int, int]]:
    """Leftmost-longest name matches: `(name's value, first token, one past the last token)`."""
    words = [m.group() for m in tokens]
    i = 0
    while i < len(words):
        step = 1
        for length in first.get(words[i], ()):
            value = names.get(tuple(words[i : i + length]))
            if value is not None:
                yield value, i, i + length
                step = length
                break
        i += step


def _capitalised(word: str) -> bool:
    return word[:1].isupper()


def _standalone(words: list[str], i: int, j: int) -> bool:
    """Whether the capitalised words `words[i:j]` read as a name of their own: mid-sentence (a capital at
    a sentence start says nothing) and not part of a longer name ("Roman Empire", "Republic of Kenya")."""
    before = words[i - 1] if i else "."
    after = words[j : j + 2]
    if before in {".", "!", "?"} or _capitalised(before) or (after and _capitalised(after[0])):
        return False
    return not (len(after) == 2 and after[0] == "of" and _capitalised(after[1]))


def _proper_names(
    tokens: list[list[re.Match[str]]], candidates: dict[tuple[str, ...], int]
) -> dict[tuple[str, ...], int]:
    """The candidate names that are not common words: those with a capital or digit after the first
    character, and those the corpus writes capitalised on their own more often than in lower case."""
    plain = {key: n for key, n in candidates.items() if not re.search(r"[A-Z0-9]", " ".join(key)[1:])}
    # All names take part in the count so that a longer name ("Atlantic Ocean") hides the shorter ("Ocean").
    lookup = dict(candidates)
    lookup.update({_lowered(key): -1 - n for key, n in plain.items() if _lowered(key) not in candidates})
    counts: Counter[int] = Counter()
    first = _by_first(lookup)
    for text_tokens in tokens:
        words = [m.group() for m in text_tokens]
        counts.update(
            value for value, i, j in _scan(text_tokens, lookup, first) if value < 0 or _standalone(words, i, j)
        )
    return {key: n for key, n in candidates.items() if key not in plain or counts[n] > counts[-1 - n]}


def _sentence(text: str, ends: list[int], start: int, end: int) -> str:
    """The sentence (or sentences, when a name spans a false sentence break) holding `text[start:end]`."""
    first = bisect.bisect_right(ends, start)
    last = bisect.bisect_left(ends, end)
    begin = ends[first - 1] if first else 0
    stop = ends[last] if last < len(ends) else len(text)
    return " ".join(text[begin:stop].split())


def build_graph(documents: list[Document]) -> Graph:
    """The entity graph of `documents` (see the module docstring for what makes a link)."""
    started = time.perf_counter()
    tokens = [list(_TOKEN.finditer(d.text)) for d in documents]
    names = _proper_names(tokens, _candidate_names(documents))
    name_of: list[str | None] = [None] * len(documents)
    for key, n in names.items():
        # The readable form of the name: the title, or the title without its qualifier.
        title = documents[n].title
        name_of[n] = title if _key(title) == key else _QUALIFIER.sub("", title)
    first = _by_first(names)
    links: list[dict[int, str]] = [{} for _ in documents]
    inbound = [0] * len(documents)
    for a, (document, text_tokens) in enumerate(zip(documents, tokens)):
        ends: list[int] | None = None
        for b, i, j in _scan(text_tokens, names, first):
            start, end = text_tokens[i].start(), text_tokens[j - 1].end()
            # Tokens ignore spacing; only the name as written counts ("D.C.", not "D. C.").
            if b == a or b in links[a] or document.text[start:end] != name_of[b]:
                continue
            if ends is None:
                ends = [m.end() for m in _SENTENCE_END.finditer(document.text)]
            links[a][b] = _sentence(document.text, ends, start, end)
            inbound[b] += 1
    return Graph(documents, name_of, links, inbound, time.perf_counter() - started)


# ---------------------------------------------------------------- walks


def random_walk(graph: Graph, head: int, hops: int, rng: random.Random) -> list[int] | None:
    """A walk of `hops` links from `head`, or None when it gets stuck before that.

    Each step goes to a document not yet visited and not mentioned by any earlier document of the walk
    (else the question could skip the hop), choosing rare entities more often: a target is weighted by
    one over the number of documents that mention it, so "Europe" is seldom the way on."""
    walk = [head]
    for _ in range(hops):
        earlier = {b for a in walk[:-1] for b in graph.links[a]}
        choices = [b for b in graph.links[walk[-1]] if b not in walk and b not in earlier]
        if not choices:
            return None
        walk.append(rng.choices(choices, weights=[1 / graph.inbound[b] for b in choices])[0])
    return walk


def walks(graph: Graph, hops: int, seed: int, tries: int) -> Iterator[list[int]]:
    """The walks of `hops` links found in `tries` attempts, always the same for the same seed.

    Heads are documents with at least one link, weighted toward less-mentioned entities (one over one
    plus the number of documents that mention it), so questions do not all start from the same hubs."""
    heads = [a for a, out in enumerate(graph.links) if out]
    if not heads:
        raise SynthError(
            "the corpus has no links between its documents (no document's text names another's "
            "title), so no multi-hop walk exists; index documents that mention each other"
        )
    weights = [1 / (1 + graph.inbound[a]) for a in heads]
    rng = random.Random(seed)
    for _ in range(tries):
        walk = random_walk(graph, rng.choices(heads, weights=weights)[0], hops, rng)
        if walk is not None:
            yield walk


def first_sentence(text: str) -> str:
    """The text's first sentence (for a record with a description, the description)."""
    return " ".join(_SENTENCE_END.split(text, maxsplit=1)[0].split())
