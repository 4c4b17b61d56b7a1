"""Multi-hop questions synthesised from your own corpus: random walks over an entity graph, written up by
an LLM, then checked.

    nanbeige synth --corpus INDEX --out questions.jsonl

1. The entity graph of the local index (`trainer/graph.py`): a link A -> B when A's text names B.
2. Seeded random walks of `hops` links from heads that favour rare entities, each step conditioned on
   going somewhere new and rare (see `graph.random_walk`).
3. An OpenAI-compatible chat model reads the walk's evidence sentences and writes one question whose
   answer is the last document's subject or a fact in it, plus the short answer, as JSON.
4. Checks reject, with the reason counted in the summary: a reply that is not such JSON (`malformed`);
   an answer written in the question (`answer_in_question`); an answer the walked documents do not
   support: its words are not in their text and the model, shown them, does not confirm it
   (`unsupported`); a question one document answers alone: the model, shown each walked document by
   itself, gives the answer (`one_document`). An answer matches when GAIA's quasi-exact scorer accepts it
   or the normalised answer appears whole-word in the normalised reply, so borderline cases are rejected.
5. Accepted questions are appended to `out` as JSONL rows `{id, question, answer, supporting}` (what
   `nanbeige collect --questions` reads); rejected ones to `<out>.rejected.jsonl` with the reason.
   A walk's id hashes its documents, and the same seed gives the same walks, so a second run skips every
   walk already accepted or rejected and goes on to `count` accepted questions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import json_repair

from nanbeige.evals.endpoint import CallFailed, chat_text
from nanbeige.evals.files import append_jsonl, drop_torn_line
from nanbeige.evals.gaia_scorer import question_scorer
from nanbeige.tools.endpoint import LOCAL_BASE_URL, LOCAL_MODEL, ChatEndpoint
from nanbeige.trainer.graph import Graph, SynthError, build_graph, first_sentence, load_documents, walks

__all__ = ["SYNTH_ENDPOINT", "SynthError", "synthesize", "walk_id", "parse_question", "rejected_path"]

TRIES_PER_QUESTION = 50  # walk attempts allowed per question wanted, so a hopeless corpus ends
MAX_DOCUMENT_CHARS = 6000  # of one document shown to the model

Progress = Callable[[int, int, int], None]
"""Called as `progress(accepted, count, rejected)` after each walk: questions in the file, questions
wanted, walks rejected in this run."""


SYNTH_ENDPOINT = ChatEndpoint(
    base_url=LOCAL_BASE_URL,
    model=LOCAL_MODEL,
    temperature=0.7,
    max_tokens=2048,
    timeout_s=120.0,
    retries=3,
    retry_wait_s=1.0,
)
"""The question writer's defaults (`nanbeige synth`, NANBEIGE_SYNTH_*): the agent's own model at the local
server; temperature 0.7 for writing questions (the checks always ask at 0)."""


WRITE_PROMPT = """\
You are writing a research question for training a search agent. Below is a chain of documents in which \
each document mentions the next; the sentence that does so is quoted.

{chain}

Write ONE question whose answer is the subject of document {last} ("{last_title}") or a short fact stated \
in its text. The question must need every link of the chain: someone holding only one of these documents \
must not be able to answer it. You may name the subject of document 1; describe every later document only \
through the facts above, never by its title, and do not put the answer in the question. The answer must be \
short: a name, a number, a date or a few words, as written in the documents.

Reply with JSON only: {{"question": "...", "answer": "..."}}"""

ANSWER_PROMPT = """\
Answer the question using only the document below. If this document alone does not give the answer, reply \
with the single word unknown.

Document: {title}
{text}

Question: {question}

Reply with the short answer only."""

SUPPORT_PROMPT = """\
Do the documents below state, or plainly imply, that the answer to the question is "{answer}"?

{documents}

Question: {question}

Reply with the single word yes or no."""


# ---------------------------------------------------------------- the model


async def _chat(client: httpx.AsyncClient, config: ChatEndpoint, prompt: str, temperature: float) -> str:
    """The model's reply text to one user message; raises `SynthError` once the retries are spent."""
    error, tries = "", 0
    for tries in range(1, config.retries + 2):
        if tries > 1:
            await asyncio.sleep(config.retry_wait_s * 2 ** (tries - 2))
        try:
            return (await chat_text(client, config, [{"role": "user", "content": prompt}], temperature)).strip()
        except CallFailed as exc:
            error = str(exc)
            if not exc.retry:
                break
    raise SynthError(
        f"the model at {config.base_url} failed after {tries} tries ({error}); check that the "
        f"server is up and serves {config.model!r} (--base-url, --model)"
    )


def parse_question(text: str) -> tuple[str, str] | None:
    """`(question, answer)` from the writer's reply (JSON, perhaps in a code fence or slightly broken),
    or None when it holds no such pair."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match is None:
        return None
    value = json_repair.loads(match.group())
    if not isinstance(value, dict):
        return None
    question, answer = value.get("question"), value.get("answer")
    if not isinstance(question, str) or not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        return None
    question, answer = question.strip(), str(answer).strip()
    return (question, answer) if question and answer else None


# ---------------------------------------------------------------- matching


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _contains(text: str, words: str) -> bool:
    """Whether the normalised `words` appear whole-word in the normalised `text`."""
    needle = _normalise(words)
    return bool(needle) and f" {needle} " in f" {_normalise(text)} "


def _same_answer(reply: str, answer: str) -> bool:
    """Whether a single-document reply gives the proposed answer: GAIA's quasi-exact match, or the answer
    written inside a longer reply."""
    if _normalise(reply) in ("", "unknown"):
        return False
    return question_scorer(reply, answer) or _contains(reply, answer)


# ---------------------------------------------------------------- one walk


def walk_id(graph: Graph, walk: list[int]) -> str:
    """A stable id for a walk: a hash of its documents' titles in order (unchanged when the corpus moves)."""
    titles = "\n".join(graph.documents[n].title for n in walk)
    return hashlib.sha1(titles.encode("utf-8")).hexdigest()[:16]


def _chain(graph: Graph, walk: list[int]) -> str:
    """The walk as the writer sees it: each document's title and first sentence, the sentence that leads on,
    and the last document's text (where the answer is)."""
    parts = []
    for k, n in enumerate(walk):
        document = graph.documents[n]
        lines = [f"Document {k + 1}: {document.title}", f"About it: {first_sentence(document.text)}"]
        if k + 1 < len(walk):
            lines.append(f'It mentions document {k + 2} in: "{graph.links[n][walk[k + 1]]}"')
        else:
            lines.append(f"Its text: {document.text[:MAX_DOCUMENT_CHARS]}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


async def _check(
    client: httpx.AsyncClient, config: ChatEndpoint, graph: Graph, walk: list[int], question: str, answer: str
) -> tuple[str, str] | None:
    """`(reason, detail)` when the question fails a check, else None. Cheap checks go first."""
    if _contains(question, answer):
        return "answer_in_question", f"the question states the answer {answer!r}"
    documents = [graph.documents[n] for n in walk]
    if not any(_contains(d.text, answer) for d in documents):
        listing = "\n\n".join(f"Document: {d.title}\n{d.text[:MAX_DOCUMENT_CHARS]}" for d in documents)
        prompt = SUPPORT_PROMPT.format(answer=answer, documents=listing, question=question)
        reply = await _chat(client, config, prompt, temperature=0.0)
        if not _normalise(reply).startswith("yes"):
            return (
                "unsupported",
                f"{answer!r} is not in the walked documents and the model did not confirm it (it said {reply[:80]!r})",
            )
    for document in documents:
        prompt = ANSWER_PROMPT.format(title=document.title, text=document.text[:MAX_DOCUMENT_CHARS], question=question)
        reply = await _chat(client, config, prompt, temperature=0.0)
        if _same_answer(reply, answer):
            return "one_document", f"{document.title!r} alone answers it ({reply[:80]!r})"
    return None


def _row(graph: Graph, walk: list[int], question: str, answer: str) -> dict[str, Any]:
    """An accepted question as `collect` reads it; each supporting document carries the sentence that
    mentions the next one (None for the last)."""
    supporting = [
        {
            "title": graph.documents[n].title,
            "link": graph.documents[n].link,
            "evidence": graph.links[n][walk[k + 1]] if k + 1 < len(walk) else None,
        }
        for k, n in enumerate(walk)
    ]
    return {"id": walk_id(graph, walk), "question": question, "answer": answer, "supporting": supporting}


async def _attempt(
    client: httpx.AsyncClient, config: ChatEndpoint, graph: Graph, walk: list[int]
) -> tuple[dict[str, Any], str | None]:
    """One walk written up and checked: `(row, None)` when accepted, `(rejection record, reason)` when not."""
    last = graph.documents[walk[-1]]
    prompt = WRITE_PROMPT.format(chain=_chain(graph, walk), last=len(walk), last_title=last.title)
    reply = await _chat(client, config, prompt, temperature=config.temperature)
    record: dict[str, Any] = {"id": walk_id(graph, walk), "walk": [graph.documents[n].title for n in walk]}
    parsed = parse_question(reply)
    if parsed is None:
        return record | {"reason": "malformed", "detail": f"no question/answer JSON in {reply[:300]!r}"}, "malformed"
    question, answer = parsed
    failed = await _check(client, config, graph, walk, question, answer)
    if failed is None:
        return _row(graph, walk, question, answer), None
    reason, detail = failed
    return record | {"reason": reason, "detail": detail, "question": question, "answer": answer}, reason


# ---------------------------------------------------------------- files and the run


def rejected_path(out: Path) -> Path:
    """Where the rejected walks of `out` go, each with its reason: `questions.jsonl` ->
    `questions.jsonl.rejected.jsonl`."""
    return out.with_name(out.name + ".rejected.jsonl")


def _read_ids(path: Path) -> set[str]:
    """The ids of the rows in a JSONL file."""
    ids: set[str] = set()
    if not path.is_file():
        return ids
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.add(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            continue
    return ids


def _fresh(
    graph: Graph, hops: int, seed: int, count: int, done: set[str], summary: dict[str, Any]
) -> Iterator[list[int]]:
    """The seed's walks, less those accepted or rejected before (counted as skipped) and repeats."""
    for walk in walks(graph, hops, seed, tries=count * TRIES_PER_QUESTION):
        key = walk_id(graph, walk)
        if key in done:
            summary["skipped"] += 1
            continue
        done.add(key)
        yield walk


def _new_summary(graph: Graph, in_file: int) -> dict[str, Any]:
    """The run's summary before its first walk: the graph's size and the questions already in the file."""
    return {
        "documents": len(graph.documents),
        "edges": graph.edges,
        "graph_seconds": round(graph.seconds, 3),
        "walks": 0,
        "skipped": 0,
        "accepted": 0,
        "in_file": in_file,
        "rejected": Counter(),
        "exhausted": False,
    }


def _record(row: dict[str, Any], reason: str | None, out: Path, rejected_file: Path, summary: dict[str, Any]) -> None:
    """Append an attempt's row to the questions file when accepted, else to the rejected file, and count it."""
    if reason is None:
        append_jsonl(out, row)
        summary["accepted"] += 1
        summary["in_file"] += 1
    else:
        append_jsonl(rejected_file, row)
        summary["rejected"][reason] += 1


async def _run_workers(worker: Callable[[httpx.AsyncClient], Awaitable[None]], concurrency: int) -> None:
    """`concurrency` workers sharing one HTTP client, until each returns."""
    async with httpx.AsyncClient() as client:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(max(1, concurrency)):
                    group.create_task(worker(client))
        except ExceptionGroup as errors:
            # One line for the user, not a group: the first failure says what to fix.
            raise errors.exceptions[0] from None


async def synthesize(
    index_dir: Path,
    out: Path,
    config: ChatEndpoint,
    count: int,
    hops: int = 2,
    seed: int = 0,
    concurrency: int = 4,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write up to `count` accepted questions of `hops` links into `out` (JSONL, appended, resumable).

    Returns the summary: graph size, walks tried, walks skipped (done before), questions accepted in this
    run and in the file, rejections by reason, whether the walks ran out, seconds. Raises `SynthError`
    for an index that is missing or not an index, a corpus without links, or a model that keeps failing
    (rows written so far stay)."""
    started = time.perf_counter()
    if hops < 1 or count < 0:
        raise SynthError(f"hops must be at least 1 and count not negative (got hops={hops}, count={count})")
    graph = build_graph(load_documents(Path(index_dir)))
    out, rejected_file = Path(out), rejected_path(Path(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_line(out)
    drop_torn_line(rejected_file)
    accepted_ids = _read_ids(out)
    summary = _new_summary(graph, len(accepted_ids))
    pending = _fresh(graph, hops, seed, count, accepted_ids | _read_ids(rejected_file), summary)
    in_flight = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal in_flight
        # Take a walk only while the accepted and in-flight ones may fall short of `count`: no wasted calls.
        while summary["in_file"] + in_flight < count:
            walk = next(pending, None)
            if walk is None:
                summary["exhausted"] = True
                return
            summary["walks"] += 1
            in_flight += 1
            try:
                row, reason = await _attempt(client, config, graph, walk)
            finally:
                in_flight -= 1
            _record(row, reason, out, rejected_file, summary)
            if progress is not None:
                progress(summary["in_file"], count, sum(summary["rejected"].values()))

    await _run_workers(worker, concurrency)
    summary["rejected"] = dict(summary["rejected"])
    summary["seconds"] = round(time.perf_counter() - started, 3)
    return summary
