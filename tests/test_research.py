"""`nanbeige research`: attempts that end without an answer are summarised and restarted from the
notes, attempts are capped, the time limit spans them all, and the report cites only what the run
read. End to end: the model scripted over loopback HTTP, search from a loopback Serper, pages
scraped from a loopback site through the built-in servers."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply, mcp_call
from fake_search_apis import FakeSerper
from fake_site import Site

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import ModelError
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.cli.research import research
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories, read_records

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
QUESTION = "How many Earth days are two Martian years?"
NOTES = "Established: one Martian year is 687 Earth days (the article page). Remaining: double it."
EXTRACT = "One Martian year lasts 687 Earth days. <script>alert('pwned')</script>"
SUMMARY_OPENING = "You worked on the question below"
INVENTED = "https://invented.example.org/mars"


def search_results(site: Site) -> dict[str, list[dict[str, str]]]:
    return {
        "Martian year length": [
            {"title": "The Orbit of Mars", "link": site.url("/article"), "snippet": "Mars orbits the Sun."},
            {"title": "Mars facts", "link": "https://example.com/mars-facts", "snippet": "A year on Mars: 687 days."},
            {"title": "Mars rovers", "link": "https://example.com/rovers", "snippet": "Curiosity landed in 2012."},
        ]
    }


def model(site: Site) -> Any:
    """Attempt 1 searches, scrapes, then runs out of turns without a box; asked for notes, it writes
    NOTES; attempt 2, given the notes, answers at once, naming two URLs it saw and one it made up."""
    final = (
        f"<think>\nThe notes say 687 days.\n</think>\n\nTwo Martian years are 1374 days: see "
        f"{site.url('/article')} and https://example.com/mars-facts (also {INVENTED}). \\boxed{{1374}}"
    )

    def reply(request: dict) -> Reply:
        messages = request["messages"]
        first = messages[0]["content"]
        if first.startswith("Your task is to read the web page"):  # the scrape server's extraction call
            return Reply(content=EXTRACT)
        if first.startswith(SUMMARY_OPENING):
            return Reply(content=f"<think>\nWhat did I find?\n</think>\n\n{NOTES}")
        if NOTES in messages[1]["content"]:
            return Reply(content=final)
        if "no more tools can be used" in messages[-1]["content"]:
            return Reply(content="<think>\nNot sure yet.\n</think>\n\nI could not finish.")
        step = sum(m["role"] == "assistant" for m in messages)
        return Reply(
            content=[
                mcp_call("search_and_scrape_webpage", "google_search", {"q": "Martian year length"}),
                mcp_call(
                    "jina_scrape_llm_summary",
                    "scrape_and_extract_info",
                    {"url": site.url("/article"), "info_to_extract": "length of a Martian year"},
                ),
            ][min(step, 1)]
        )

    return reply


def run_research(
    tmp_path: Path, site: Site, server: FakeOpenAI, serper: FakeSerper, *args: str
) -> subprocess.CompletedProcess[str]:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.py"  # the standard library's BROWSER hook: a command, %s the address
    browser.write_text(f"import sys\nopen({str(opened)!r}, 'a').write(sys.argv[1] + '\\n')\n")
    env = {
        **os.environ,
        "NANBEIGE_ALLOW_PRIVATE_URLS": "1",
        "SERPER_API_KEY": serper.api_key,
        "SERPER_BASE_URL": serper.url,
        "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
        "NANBEIGE_RUNS_DIR": str(tmp_path),
        "BROWSER": f"{sys.executable} {browser} %s",
    }
    for name in ("SEARXNG_URL", "JINA_API_KEY", "E2B_API_KEY", "NANBEIGE_SEARCH_BACKEND", "NANBEIGE_CONFIG"):
        env.pop(name, None)
    question, stdin = (["-"], QUESTION) if "--cache" in args else ([QUESTION], None)  # one run reads stdin
    return subprocess.run(
        [
            NANBEIGE,
            "research",
            *question,
            "--base-url",
            server.base_url,
            "--max-turns",
            "2",
            "--trajectory",
            str(tmp_path / "run.jsonl"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=tmp_path,
        input=stdin,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One research run (it takes seconds: three tool servers start), shared by the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("research")
    with Site() as site, FakeSerper(results=search_results(site)) as serper, FakeOpenAI(model(site)) as server:
        result = run_research(
            tmp_path,
            site,
            server,
            serper,
            "--attempts",
            "3",
            "--report",
            str(tmp_path / "report.md"),
            "--open",
            "--cache",
            str(tmp_path / "tools.sqlite"),
        )
    return {"result": result, "path": tmp_path, "requests": server.requests, "site": site}


def test_an_attempt_that_runs_out_of_turns_is_summarised_and_the_next_answers(finished: dict[str, Any]) -> None:
    result, path = finished["result"], finished["path"]
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1374\n"
    first, second = load_trajectories(path / "run.jsonl")
    assert (first.stop_reason, first.answer) == ("max_turns", None)
    assert (second.stop_reason, second.answer) == ("answered", "1374")
    assert first.group_id == second.group_id == first.id  # the research's id: its first attempt's
    assert first.question == QUESTION and second.question.startswith(QUESTION) and NOTES in second.question
    assert (path / "tools.sqlite").stat().st_size > 0  # the question came on stdin, the tool results went to --cache
    prompts = [
        r["messages"][0]["content"]
        for r in finished["requests"]
        if r["messages"][0]["content"].startswith(SUMMARY_OPENING)
    ]
    assert len(prompts) == 1  # one summary, of the failed attempt; none after the answer
    assert QUESTION in prompts[0] and "it reached the turn limit" in prompts[0]
    assert "scrape_and_extract_info" in prompts[0] and "687 Earth days" in prompts[0]  # the attempt's transcript
    (summary,) = [r for r in read_records(path / "run.jsonl") if r["type"] == "attempt_summary"]
    assert (summary["trajectory_id"], summary["next_trajectory_id"]) == (first.id, second.id)  # the link
    assert summary["summary"] == NOTES and summary["error"] is None
    assert "attempt 1 of 3: no answer (max_turns)" in result.stderr and "attempt 2 of 3" in result.stderr


def test_the_report_cites_exactly_the_pages_read_with_their_passages(finished: dict[str, Any]) -> None:
    path, site = finished["path"], finished["site"]
    report = (path / "report.md").read_text()
    sources = report.split("## Sources\n", 1)[1].split("## The run", 1)[0]
    items = re.split(r"\n+(?=\d+\. )", sources.strip())
    # the scraped page with its extract; the search result the answer names, with its snippet; nothing else
    assert items == [
        f"1. [The Orbit of Mars]({site.url('/article')})\n\n"
        "   > One Martian year lasts 687 Earth days. &lt;script&gt;alert('pwned')&lt;/script&gt;",  # HTML disarmed
        "2. [Mars facts](https://example.com/mars-facts) (search result)\n\n   > A year on Mars: 687 days.",
    ]
    assert "<script>" not in report
    assert "rovers" not in report  # a search result nobody used
    assert INVENTED not in sources  # named by the model, never read: not a citation
    reasoning = report.split("## Reasoning in brief\n", 1)[1].split("##", 1)[0]
    assert f"{site.url('/article')} [1]" in reasoning and "https://example.com/mars-facts [2]" in reasoning
    assert f"{INVENTED})" in reasoning and "The notes say" not in reasoning  # no number; no <think> text
    assert "**Question:** How many Earth days are two Martian years?" in report
    assert "## Answer\n\n1374\n" in report


def test_the_html_report_escapes_a_hostile_passage_and_opens_in_the_browser(finished: dict[str, Any]) -> None:
    path = finished["path"]
    page = (path / "report.html").read_text()
    assert "<script" not in page.lower()
    assert "One Martian year lasts 687 Earth days. &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert "default-src 'none'" in page  # the browser loads nothing, runs nothing
    assert "<link" not in page and " src=" not in page and "@import" not in page and "url(" not in page
    assert (path / "opened.txt").read_text() == (path / "report.html").resolve().as_uri() + "\n"


class Model(ScriptedLLM):
    """Never answers: a tool call every turn; asked for notes, writes some. `delay_s(messages)` sets
    how long each reply takes."""

    def __init__(self, delay_s: Any = lambda messages: 0.0, guess: bool = False):
        super().__init__([], default=self.reply)
        self.delay_s, self.guess = delay_s, guess

    def reply(self, messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"].startswith(SUMMARY_OPENING):
            return f"Notes {sum(m[0]['content'].startswith(SUMMARY_OPENING) for m in self.calls)}."
        if self.guess and "no more tools can be used" in messages[-1]["content"]:
            return f"A guess: \\boxed{{{len(self.calls)}}}"
        return mcp_call("search_and_scrape_webpage", "google_search", {"q": f"query {len(self.calls)}"})

    async def complete(self, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Completion:
        await asyncio.sleep(self.delay_s(messages))
        return await super().complete(messages, *args, **kwargs)


@pytest.mark.anyio
async def test_attempts_are_capped_and_each_retry_carries_all_earlier_notes(tmp_path: Path) -> None:
    llm, writer = Model(), TrajectoryWriter(tmp_path / "run.jsonl")
    result = await research(QUESTION, llm, None, AgentConfig(max_turns=1), writer, attempts=3)
    writer.close()
    assert [t.stop_reason for t in result.attempts] == ["max_turns"] * 3
    assert result.answer is None
    assert result.summaries == ["Notes 1.", "Notes 2."]  # the last attempt is not summarised: nothing follows it
    assert sum(c[0]["content"].startswith(SUMMARY_OPENING) for c in llm.calls) == 2
    third = result.attempts[2].question
    assert "[Attempt 1]\nNotes 1." in third and "[Attempt 2]\nNotes 2." in third
    links = [
        (r["trajectory_id"], r["next_trajectory_id"])
        for r in read_records(tmp_path / "run.jsonl")
        if r["type"] == "attempt_summary"
    ]
    ids = [t.id for t in load_trajectories(tmp_path / "run.jsonl")]  # the summary records are skipped
    assert links == [(ids[0], ids[1]), (ids[1], ids[2])] and ids == [t.id for t in result.attempts]
    assert {t.group_id for t in result.attempts} == {ids[0]}


@pytest.mark.anyio
async def test_a_budget_spans_all_attempts(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    result = await research(
        QUESTION, Model(), None, AgentConfig(max_turns=2, budgets={"tool_calls": 3}), writer, attempts=3
    )
    writer.close()
    # the first attempt used 2 of the 3 tool calls; the second got the 1 left, used it, and was the last
    assert [t.stop_reason for t in result.attempts] == ["max_turns", "budget"]
    assert [t.usage["tool_calls"] for t in result.attempts] == [2, 1]


@pytest.mark.anyio
async def test_a_guess_forced_at_the_turn_limit_does_not_end_the_research_but_the_last_one_stands(
    tmp_path: Path,
) -> None:
    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    result = await research(QUESTION, Model(guess=True), None, AgentConfig(max_turns=1), writer, attempts=2)
    writer.close()
    first, second = result.attempts
    assert (first.stop_reason, first.answer) == ("max_turns", "2")  # guessed, then summarised and restarted
    assert len(result.summaries) == 1
    assert (second.stop_reason, second.answer) == ("max_turns", "5")
    assert result.answer == "5"


@pytest.mark.anyio
async def test_the_time_limit_spans_all_attempts(tmp_path: Path) -> None:
    # each reply takes 0.2 s, but attempt 2's never comes: only the research's time limit ends it
    slow_once_noted = Model(lambda messages: 3600.0 if "[Attempt 1]" in messages[-1]["content"] else 0.2)
    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    before = time.time()
    result = await research(
        QUESTION, slow_once_noted, None, AgentConfig(max_turns=1, timeout_s=3.0), writer, attempts=5
    )
    writer.close()
    first, second = result.attempts  # no third attempt: the time was spent
    assert first.stop_reason == "max_turns" and second.stop_reason == "timeout"
    limits = [attempt.limits["timeout_s"] for attempt in result.attempts]
    # Told apart by how the limits relate to the times things took, not by how long those were, which
    # depends on the machine. Each attempt had all that was left of the 3 s when it started (its
    # start time is taken just after): no less...
    for attempt, limit in zip(result.attempts, limits):
        assert 3.0 - (attempt.started_at - before) - 0.01 <= limit <= 3.0
    # ... and no more: attempt 1's time and its summary's (a 0.2 s reply) were gone for attempt 2
    assert limits[1] <= limits[0] - first.timings["wall_s"] - 0.2
    # the research ended at its limit (give or take a busy machine's delay), not at the never-coming reply
    assert first.timings["wall_s"] + second.timings["wall_s"] < 3.0 + 5


@pytest.mark.anyio
async def test_when_the_summary_call_fails_the_next_attempt_starts_afresh_and_the_failure_is_recorded(
    tmp_path: Path,
) -> None:
    call = mcp_call("search_and_scrape_webpage", "google_search", {"q": "mars"})
    llm = ScriptedLLM(
        [call, call, ModelError("server said 503"), "<think>ok</think>\\boxed{1374}"],
        default="<think>ok</think>\\boxed{1374}",
    )
    writer, notices = TrajectoryWriter(tmp_path / "run.jsonl"), []
    result = await research(QUESTION, llm, None, AgentConfig(max_turns=1), writer, attempts=3, notice=notices.append)
    writer.close()
    assert [t.stop_reason for t in result.attempts] == ["max_turns", "answered"] and result.answer == "1374"
    assert result.attempts[1].question == QUESTION and result.summaries == []
    assert "summary failed: server said 503; the next attempt starts without it" in notices
    (record,) = [r for r in read_records(tmp_path / "run.jsonl") if r["type"] == "attempt_summary"]
    assert (record["summary"], record["error"]) == (None, "server said 503")
    assert record["next_trajectory_id"] == result.attempts[1].id
