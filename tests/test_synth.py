"""Question synthesis: the entity graph of the real Wikipedia summaries corpus (ovos, read from the installed
package and indexed here), seeded walks on it, and `synthesize` against a loopback model that writes,
answers and confirms as scripted."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply
from test_index import ovos_summaries

from nanbeige.tools.index import build_index
from nanbeige.trainer.graph import Graph, build_graph, load_documents, random_walk, walks
from nanbeige.trainer.synth import (
    ANSWER_PROMPT,
    SUPPORT_PROMPT,
    SYNTH_ENDPOINT,
    WRITE_PROMPT,
    SynthError,
    parse_question,
    rejected_path,
    synthesize,
)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ovos") / "index"
    build_index([ovos_summaries()], out)
    return out


@pytest.fixture(scope="module")
def graph(index_dir: Path) -> Graph:
    return build_graph(load_documents(index_dir))


def doc(graph: Graph, title: str) -> int:
    return next(n for n, d in enumerate(graph.documents) if d.title == title)


# ---------------------------------------------------------------- the graph


def test_graph_of_the_wikipedia_corpus(graph: Graph) -> None:
    print(
        f"\nentity graph: {len(graph.documents)} documents, {graph.edges} links, "
        f"{sum(1 for out in graph.links if out)} with links out, built in {graph.seconds:.2f} s"
    )
    assert len(graph.documents) == 10033 and graph.edges > 10_000
    assert sum(1 for out in graph.links if out) > 3000 and sum(graph.inbound) == graph.edges
    for a, out in enumerate(graph.links):
        assert a not in out
        for b, evidence in out.items():
            assert graph.names[b] in evidence and len(graph.names[b]) >= 4
    einstein = graph.links[doc(graph, "Albert Einstein")]
    assert "1921 Nobel Prize in Physics" in einstein[doc(graph, "Nobel Prize")]
    # Names: proper names kept, common words dropped, qualifiers dropped only where the name is unambiguous.
    assert graph.names[doc(graph, "Paris")] == "Paris" and graph.names[doc(graph, "Isaac Newton")] == "Isaac Newton"
    assert graph.names[doc(graph, "Water")] is None and graph.names[doc(graph, "Photosynthesis")] is None
    assert graph.names[doc(graph, "Basque Country (autonomous community)")] == "Basque Country"
    assert graph.names[doc(graph, "Amazon (company)")] is None  # "Amazon" could be the river
    assert graph.names[doc(graph, "Art")] is None  # shorter than 4 characters
    assert graph.documents[doc(graph, "Paris")].link.endswith("summaries_en-us.json#Paris")


def test_walks_are_seeded_new_and_long_enough(graph: Graph) -> None:
    first = list(walks(graph, hops=2, seed=7, tries=300))
    assert first == list(walks(graph, hops=2, seed=7, tries=300)) and len(first) > 100
    assert first != list(walks(graph, hops=2, seed=8, tries=300))
    for walk in first:
        assert len(walk) == 3 and len(set(walk)) == 3
        assert walk[1] in graph.links[walk[0]] and walk[2] in graph.links[walk[1]]
        assert walk[2] not in graph.links[walk[0]]  # no shortcut past the middle document
    longer = list(walks(graph, hops=4, seed=7, tries=100))
    assert longer and all(len(w) == 5 and len(set(w)) == 5 for w in longer)
    stuck = next(n for n, out in enumerate(graph.links) if not out)
    assert random_walk(graph, stuck, 2, random.Random(0)) is None  # nowhere to go: dropped


def test_parse_question() -> None:
    assert parse_question('```json\n{"question": "Who?", "answer": "Ada"}\n```') == ("Who?", "Ada")
    assert parse_question('Sure. {"question": "How many?", "answer": 3,}') == ("How many?", "3")
    assert parse_question('{"question": "Who?"}') is None
    assert parse_question("no JSON at all") is None
    assert parse_question('{"question": "", "answer": "x"}') is None


# ---------------------------------------------------------------- synthesize


MODES = ("good", "shortcut", "unsupported", "malformed")


class ScriptedModel:
    """Writes questions in turn as good, answerable from one document, unsupported and malformed, and
    answers the checks as each question's mode says."""

    def __init__(self) -> None:
        self.written: list[tuple[str, ...]] = []  # each written walk's titles
        self.answers: dict[str, str] = {}

    def __call__(self, request: dict[str, Any]) -> Reply | str:
        prompt = request["messages"][-1]["content"]
        if prompt.startswith(WRITE_PROMPT[:60]):
            assert request["temperature"] == 0.7
            titles = tuple(re.findall(r"^Document \d+: (.+)$", prompt, re.MULTILINE))
            self.written.append(titles)
            mode = MODES[(len(self.written) - 1) % len(MODES)]
            if mode == "malformed":
                return "I would rather not."
            question = f"[{mode}] Which entity ends chain {len(self.written)}?"
            answer = "Zorblax Quintavious" if mode == "unsupported" else re.sub(r" \(.*\)$", "", titles[-1])
            self.answers[question] = answer
            return "```json\n" + json.dumps({"question": question, "answer": answer}) + "\n```"
        assert request["temperature"] == 0.0
        question = re.search(r"^Question: (.+)$", prompt, re.MULTILINE).group(1)
        mode = re.match(r"\[(\w+)\]", question).group(1)
        if prompt.startswith(SUPPORT_PROMPT[:40]):
            return "yes" if mode == "good" else "No."
        assert prompt.startswith(ANSWER_PROMPT[:40])
        return self.answers[question] if mode == "shortcut" else "unknown"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.anyio
@pytest.mark.slow
async def test_synthesize_accepts_rejects_and_resumes(index_dir: Path, graph: Graph, tmp_path: Path) -> None:
    model = ScriptedModel()
    out = tmp_path / "questions.jsonl"
    calls: list[tuple[int, int, int]] = []
    with FakeOpenAI(model, api_key="sk-secret") as server:
        config = replace(SYNTH_ENDPOINT, base_url=server.base_url, model="writer", api_key="sk-secret")
        summary = await synthesize(
            index_dir, out, config, count=2, seed=3, concurrency=1, progress=lambda *args: calls.append(args)
        )
        assert summary["walks"] == 5 and summary["accepted"] == 2 and summary["in_file"] == 2
        assert summary["rejected"] == {"one_document": 1, "unsupported": 1, "malformed": 1}
        assert summary["documents"] == 10033 and summary["edges"] == graph.edges and not summary["exhausted"]
        assert calls[-1] == (2, 2, 3) and "sk-secret" not in repr(config) + json.dumps(summary)
        assert {r["model"] for r in server.requests} == {"writer"}

        rows = read_jsonl(out)
        assert [r["question"] for r in rows] == [
            "[good] Which entity ends chain 1?",
            "[good] Which entity ends chain 5?",
        ]
        titles = {d.title: n for n, d in enumerate(graph.documents)}
        for row, written in zip(rows, [model.written[0], model.written[4]]):
            assert set(row) == {"id", "question", "answer", "supporting"} and re.fullmatch(r"[0-9a-f]{16}", row["id"])
            walk = [titles[s["title"]] for s in row["supporting"]]
            assert tuple(s["title"] for s in row["supporting"]) == written and len(walk) == 3
            for k, supporting in enumerate(row["supporting"]):
                assert supporting["link"] == graph.documents[walk[k]].link
                if k < 2:
                    assert graph.names[walk[k + 1]] in supporting["evidence"]
            assert row["supporting"][-1]["evidence"] is None
            assert row["answer"] == re.sub(r" \(.*\)$", "", row["supporting"][-1]["title"])
        rejected = {r["reason"]: r for r in read_jsonl(rejected_path(out))}
        assert set(rejected) == {"one_document", "unsupported", "malformed"}
        assert rejected["one_document"]["walk"][0] in rejected["one_document"]["detail"]  # the first document
        assert rejected["unsupported"]["answer"] == "Zorblax Quintavious"
        assert "I would rather not" in rejected["malformed"]["detail"]

        # A second run goes on to 3 questions: nothing done before is written up again.
        before = len(model.written)
        summary = await synthesize(index_dir, out, config, count=3, seed=3, concurrency=3)
        assert summary["skipped"] >= 5 and summary["accepted"] == 1 and summary["in_file"] == 3
        assert not set(model.written[before:]) & set(model.written[:before])
        rows = read_jsonl(out)
        assert len(rows) == 3 and len({r["id"] for r in rows}) == 3
        assert len(read_jsonl(rejected_path(out))) == summary["walks"] - 1 + 3

        # A third run with nothing left to do asks nothing, and cuts off a line torn by a crash.
        with open(out, "a", encoding="utf-8") as f:
            f.write('{"id": "0123456789abcdef", "quest')
        asked = len(server.requests)
        summary = await synthesize(index_dir, out, config, count=3, seed=3)
        assert summary["walks"] == 0 and summary["accepted"] == 0 and len(server.requests) == asked
        assert read_jsonl(out) == rows


def small_corpus(root: Path, linked: bool) -> Path:
    root.mkdir()
    other = "the Marrow Bay lighthouse" if linked else "a lighthouse"
    (root / "kestrel.md").write_text(f"# Kestrel Island\n\nKestrel Island faces {other} across the strait.\n")
    (root / "marrow.md").write_text("# Marrow Bay\n\nMarrow Bay was charted in 1790 by a whaling crew.\n")
    build_index([root], root.parent / f"{root.name}-index")
    return root.parent / f"{root.name}-index"


@pytest.mark.anyio
async def test_synthesize_errors(tmp_path: Path) -> None:
    config = replace(SYNTH_ENDPOINT, base_url=f"http://127.0.0.1:{free_port()}/v1", retries=1, retry_wait_s=0.0)
    missing = tmp_path / "no-such-index"
    with pytest.raises(SynthError, match=rf"no index folder at {re.escape(str(missing))}.*nanbeige index build"):
        await synthesize(missing, tmp_path / "q.jsonl", config, count=1)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not an index")
    with pytest.raises(SynthError, match=r"notes is not a nanbeige index.*nanbeige index build"):
        await synthesize(tmp_path / "notes", tmp_path / "q.jsonl", config, count=1)
    with pytest.raises(SynthError, match="no links between its documents"):
        await synthesize(small_corpus(tmp_path / "unlinked", linked=False), tmp_path / "q.jsonl", config, count=1)

    linked = small_corpus(tmp_path / "linked", linked=True)
    with pytest.raises(SynthError, match=r"failed after 2 tries \(unreachable"):
        await synthesize(linked, tmp_path / "q.jsonl", config, count=1, hops=1)
    with FakeOpenAI([], default=Reply(status=503)) as server:
        config = replace(SYNTH_ENDPOINT, base_url=server.base_url, api_key="sk-secret", retries=2, retry_wait_s=0.0)
        with pytest.raises(SynthError, match=r"failed after 3 tries \(HTTP 503") as error:
            await synthesize(linked, tmp_path / "q.jsonl", config, count=1, hops=1)
        assert len(server.requests) == 3 and "sk-secret" not in str(error.value)
    assert not (tmp_path / "q.jsonl").exists()  # nothing accepted, nothing written


def test_the_synth_command_reports_a_missing_corpus_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    nanbeige = str(Path(sys.executable).parent / "nanbeige")
    result = subprocess.run(
        [nanbeige, "synth", "--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "q.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "no index folder" in line and "nanbeige index build" in line
    assert not (tmp_path / "q.jsonl").exists()


def synth_command(*args: str) -> Any:
    import subprocess
    import sys

    nanbeige = str(Path(sys.executable).parent / "nanbeige")
    return subprocess.run([nanbeige, "synth", *args], capture_output=True, text=True, timeout=60)


def test_rejected_walks_go_to_the_out_file_name_with_rejected_jsonl_added() -> None:
    # as docs/rollouts.md says: `<out>.rejected.jsonl`, next to the questions
    assert rejected_path(Path("data/questions.jsonl")) == Path("data/questions.jsonl.rejected.jsonl")
    assert rejected_path(Path("questions")) == Path("questions.rejected.jsonl")


def test_the_synth_command_fails_when_it_writes_no_question(tmp_path: Path) -> None:
    linked = small_corpus(tmp_path / "linked", linked=True)  # one link: a single walk of one hop
    out = tmp_path / "q.jsonl"
    with FakeOpenAI([], default="I would rather not.") as server:  # every write-up is malformed
        result = synth_command(
            "--corpus", str(linked), "--out", str(out), "--count", "1", "--hops", "1", "--base-url", server.base_url
        )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "no question written" in line and "rejected (malformed 1)" in line
    assert str(rejected_path(out)) in line  # where to see why
    assert not out.exists() and len(read_jsonl(rejected_path(out))) == 1

    # Run again: the one walk was tried already, so nothing new can be written either.
    with FakeOpenAI([], default="I would rather not.") as server:
        again = synth_command(
            "--corpus", str(linked), "--out", str(out), "--count", "1", "--hops", "1", "--base-url", server.base_url
        )
    assert again.returncode == 1 and server.requests == []
    [line] = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert "no question written" in line and "--seed" in line
