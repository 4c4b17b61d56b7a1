"""The tool-result cache (`--cache`, `--replay`): canonical keys, what is and is not recorded, `ask`
answered from the cache without reaching the search API, replay offline and its loud misses. Many runs
and processes on one file are `tests/test_cache_sharing.py`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, created_sandbox, mcp_answer, mcp_call
from fake_search_apis import FakeSerper

from nanbeige.agent.toolbox.cache import ReplayMiss, ToolCache, canonical_arguments
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
SEARCH = "search_and_scrape_webpage"


def rows(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT server, tool, arguments FROM tool_results ORDER BY arguments").fetchall()


# ---------------------------------------------------------------- keys and what is recorded


def test_arguments_in_any_order_or_spacing_make_one_key() -> None:
    assert canonical_arguments({"b": 1, "a": 2}) == canonical_arguments({"a": 2, "b": 1}) == '{"a":2,"b":1}'
    assert (
        canonical_arguments({"q": "Zürich", "n": {"y": [1, 2], "x": None}}) == '{"n":{"x":null,"y":[1,2]},"q":"Zürich"}'
    )
    assert canonical_arguments({"a": 1}) != canonical_arguments({"a": "1"})


@pytest.mark.anyio
async def test_a_recorded_answer_is_served_for_the_same_call_in_another_key_order(tmp_path: Path) -> None:
    cache = await ToolCache.open(tmp_path / "cache.sqlite")
    assert await cache.lookup(SEARCH, "google_search", {"q": "mars", "num": 3}) is None
    await cache.record(SEARCH, "google_search", {"q": "mars", "num": 3}, '{"organic": []}', False)
    assert await cache.lookup(SEARCH, "google_search", {"num": 3, "q": "mars"}) == ('{"organic": []}', False)
    assert await cache.lookup(SEARCH, "google_search", {"num": 4, "q": "mars"}) is None
    assert await cache.lookup("other", "google_search", {"q": "mars", "num": 3}) is None
    assert cache.summary() == "cache: 1 hit, 3 misses"
    await cache.aclose()


@pytest.mark.anyio
async def test_failures_are_replayed_but_a_live_run_asks_the_tool_again(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    cache = await ToolCache.open(path)
    outage = json.dumps({"success": False, "error": "HTTP 429", "results": []}, indent=2)
    await cache.record(SEARCH, "google_search", {"q": "busy"}, outage, False)
    await cache.record("web", "fetch", {"url": "https://example.com/gone"}, "404 Not Found", True)
    assert await cache.lookup(SEARCH, "google_search", {"q": "busy"}) is None
    assert await cache.lookup("web", "fetch", {"url": "https://example.com/gone"}) is None
    await cache.aclose()
    replay = await ToolCache.open(path, replay=True)
    assert await replay.lookup(SEARCH, "google_search", {"q": "busy"}) == (outage, False)
    assert await replay.lookup("web", "fetch", {"url": "https://example.com/gone"}) == ("404 Not Found", True)
    with pytest.raises(ReplayMiss, match=r'no answer for fetch on server web with arguments \{"url":"x"\}'):
        await replay.lookup("web", "fetch", {"url": "x"})
    await replay.aclose()


@pytest.mark.anyio
async def test_timeouts_are_not_recorded_and_tool_errors_are(tmp_path: Path) -> None:
    cache = await ToolCache.open(tmp_path / "cache.sqlite")
    # ample for the calls that answer (milliseconds, a tenth of a second on a busy machine), never for the slow one
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], call_timeout_s=2.0, cache=cache) as tools:
        slow = await tools.call(ToolCall("testkit", "slow", {"seconds": 60}))
        failed = await tools.call(ToolCall("testkit", "fail", {"message": "no such page"}))
        added = await tools.call(ToolCall("testkit", "add", {"a": 2, "b": 40}))
        again = await tools.call(ToolCall("testkit", "add", {"b": 40, "a": 2}))
    await cache.aclose()
    assert slow.is_error and "timed out" in slow.text and failed.is_error
    assert (again.text, again.cached, added.cached) == ("42", True, False)
    assert [(tool, arguments) for _, tool, arguments in rows(tmp_path / "cache.sqlite")] == [
        ("add", '{"a":2,"b":40}'),
        ("fail", '{"message":"no such page"}'),
    ]


@pytest.mark.anyio
async def test_results_are_recorded_whole_and_cut_to_each_runs_limit(tmp_path: Path) -> None:
    cache = await ToolCache.open(tmp_path / "cache.sqlite")
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], max_result_chars=100, cache=cache) as tools:
        first = await tools.call(ToolCall("testkit", "big", {"n": 500}))
        tools.max_result_chars = 1000
        wider = await tools.call(ToolCall("testkit", "big", {"n": 500}))
    await cache.aclose()
    assert first.truncated and first.text.startswith("x" * 100) and "[Result truncated]" in first.text
    assert (wider.text, wider.truncated, wider.cached) == ("x" * 500, False, True)


# ---------------------------------------------------------------- `nanbeige ask`


def web_model(query_args: dict[str, object]) -> Callable[[dict], Reply]:
    """Searches with `query_args`, makes a sandbox and runs Python in it, then answers 42 (again in the summary
    turn)."""

    def reply(request: dict) -> Reply:
        step = sum(m["role"] == "assistant" for m in request["messages"])
        script = [
            lambda: mcp_call(SEARCH, "google_search", query_args),
            lambda: mcp_call("tool-python", "create_sandbox", {}),
            lambda: mcp_call(
                "tool-python",
                "run_python_code",
                {"code_block": "print(6 * 7)", "sandbox_id": created_sandbox(request["messages"])},
            ),
            lambda: mcp_answer("42"),
        ]
        return Reply(content=script[min(step, len(script) - 1)]())

    return reply


def ask(
    tmp_path: Path, model: FakeOpenAI, trajectory: Path, *flags: str, serper: FakeSerper | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
        "NANBEIGE_RUNS_DIR": str(tmp_path),
        "NANBEIGE_INDEX": str(tmp_path / "no-index"),
    }
    for name in (
        "SERPER_API_KEY",
        "SERPER_BASE_URL",
        "SEARXNG_URL",
        "JINA_API_KEY",
        "E2B_API_KEY",
        "NANBEIGE_SEARCH_BACKEND",
    ):
        env.pop(name, None)
    if serper is not None:
        env |= {"SERPER_API_KEY": serper.api_key, "SERPER_BASE_URL": serper.url}
    return subprocess.run(
        [
            NANBEIGE,
            "ask",
            "What is six times seven?",
            "--base-url",
            model.base_url,
            "--trajectory",
            str(trajectory),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def tool_results(trajectory: Path) -> list[dict]:
    turns = [json.loads(line) for line in trajectory.read_text().splitlines() if '"type":"turn"' in line]
    return [result for turn in turns for result in turn["tool_results"]]


def end_record(trajectory: Path) -> dict:
    return json.loads(trajectory.read_text().splitlines()[-1])


@pytest.mark.slow
def test_a_second_ask_reads_the_search_from_the_cache_and_replay_needs_no_backend(tmp_path: Path) -> None:
    cache = tmp_path / "tools.sqlite"
    with FakeSerper() as serper:
        with FakeOpenAI(web_model({"q": "six times seven", "num": 3})) as model:
            first = ask(tmp_path, model, tmp_path / "first.jsonl", "--cache", str(cache), serper=serper)
        assert first.returncode == 0, first.stderr
        assert len(serper.requests) == 1
        with FakeOpenAI(web_model({"num": 3, "q": "six times seven"})) as model:  # same call, other key order
            second = ask(tmp_path, model, tmp_path / "second.jsonl", "--cache", str(cache), serper=serper)
        assert second.returncode == 0, second.stderr
        assert len(serper.requests) == 1  # the search API was not asked again
    assert first.stdout == second.stdout == "42\n"
    assert "cache: 0 hits, 1 miss" in first.stderr and "cache: 1 hit, 0 misses" in second.stderr
    searched, _, computed = tool_results(tmp_path / "first.jsonl")
    served, _, recomputed = tool_results(tmp_path / "second.jsonl")
    assert "six times seven - page 1" in searched["text"] and not searched["cached"]
    assert served["text"] == searched["text"] and served["cached"]
    assert "42" in computed["text"] and "42" in recomputed["text"]  # the sandbox ran both times
    assert not computed["cached"] and not recomputed["cached"]
    assert rows(cache) == [(SEARCH, "google_search", '{"num":3,"q":"six times seven"}')]

    # No Serper key, no index, no network: the replay reads the search from the file.
    with FakeOpenAI(web_model({"q": "six times seven", "num": 3})) as model:
        replayed = ask(tmp_path, model, tmp_path / "replay.jsonl", "--cache", str(cache), "--replay")
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == "42\n" and "search is off" not in replayed.stderr
    search, _, python = tool_results(tmp_path / "replay.jsonl")
    assert (search["text"], search["cached"]) == (searched["text"], True)
    assert "42" in python["text"] and not python["cached"]
    assert end_record(tmp_path / "replay.jsonl")["stop_reason"] == "answered"


@pytest.mark.slow
def test_a_replay_miss_stops_the_run_and_the_command_fails(tmp_path: Path) -> None:
    cache = tmp_path / "tools.sqlite"
    with FakeSerper() as serper, FakeOpenAI(web_model({"q": "six times seven"})) as model:
        assert ask(tmp_path, model, tmp_path / "first.jsonl", "--cache", str(cache), serper=serper).returncode == 0
    with FakeOpenAI(web_model({"q": "seven times six"})) as model:
        missed = ask(tmp_path, model, tmp_path / "replay.jsonl", "--cache", str(cache), "--replay")
    assert missed.returncode == 1 and missed.stdout == ""
    error = missed.stderr.strip().splitlines()[-1]
    assert error.startswith("error: no answer (stop reason replay_miss)")
    assert (
        'no answer for google_search on server search_and_scrape_webpage with arguments {"q":"seven times six"}'
        in missed.stderr.replace("\n", "")
    )
    end = end_record(tmp_path / "replay.jsonl")
    assert end["stop_reason"] == "replay_miss" and end["answer"] is None and "seven times six" in end["error"]


@pytest.mark.slow
def test_a_run_stopped_by_a_replay_miss_is_resumed_live_into_the_same_cache(tmp_path: Path) -> None:
    cache = tmp_path / "tools.sqlite"
    with FakeSerper() as serper, FakeOpenAI(web_model({"q": "six times seven"})) as model:
        assert ask(tmp_path, model, tmp_path / "first.jsonl", "--cache", str(cache), serper=serper).returncode == 0
    with FakeOpenAI(web_model({"q": "seven times six"})) as model:
        assert ask(tmp_path, model, tmp_path / "run.jsonl", "--cache", str(cache), "--replay").returncode == 1
        with FakeSerper() as serper:  # resumed live, with the cache: what the replay missed is searched
            env = {
                **os.environ,
                "SERPER_API_KEY": serper.api_key,
                "SERPER_BASE_URL": serper.url,
                "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
            }
            resumed = subprocess.run(
                [NANBEIGE, "resume", str(tmp_path / "run.jsonl"), "--base-url", model.base_url, "--cache", str(cache)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            searched = len(serper.requests)
    assert resumed.returncode == 0 and resumed.stdout == "42\n", resumed.stderr
    assert searched == 1 and end_record(tmp_path / "run.jsonl")["stop_reason"] == "answered"
    assert ("search_and_scrape_webpage", "google_search", '{"q":"seven times six"}') in rows(cache)  # recorded now


def test_replay_without_a_cache_file_is_a_usage_error(tmp_path: Path) -> None:
    with FakeOpenAI([mcp_answer("1")]) as model:
        no_flag = ask(tmp_path, model, tmp_path / "t.jsonl", "--replay")
        no_file = ask(tmp_path, model, tmp_path / "t.jsonl", "--replay", "--cache", str(tmp_path / "none.sqlite"))
    assert no_flag.returncode == 2
    assert no_flag.stderr.strip() == "error: --replay needs --cache PATH: the cache file to answer tool calls from"
    assert no_file.returncode == 1 and "there is no cache file" in no_file.stderr
    assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "none.sqlite").exists()


def test_a_file_that_is_not_a_cache_is_refused_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "notes.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    with FakeOpenAI([mcp_answer("1")]) as model:
        result = ask(
            tmp_path,
            model,
            tmp_path / "t.jsonl",
            "--cache",
            str(other),
            "--no-default-servers",
            "--mcp",
            f"testkit={' '.join(TEST_SERVER)}",
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot use {other} as a tool-result cache: it is another SQLite file, not a tool-result cache"
    )
