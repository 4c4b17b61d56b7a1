"""The loop end to end: a scripted model (or a loopback server) and real MCP servers. How a run ends (its
limits, the final-answer and summary turns, a failure) is in test_loop_ends.py."""

from __future__ import annotations

import asyncio
import statistics
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call, render, tokens
from loop_runs import ask, toolbox

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.dialects import OMITTED
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.run.tokens import full_prompt, rebuild_segments
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

pytestmark = pytest.mark.anyio


async def test_calls_tools_then_answers_and_logs_every_turn(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    trajectory, llm = await ask([mcp_call("testkit", "add", {"a": 2, "b": 3}), mcp_answer("5")], path=path)
    assert (trajectory.answer, trajectory.stop_reason) == ("5", "answered")
    assert llm.calls[1][-1] == {"role": "user", "content": "5"}  # the tool result went back as a user message
    system = llm.calls[0][0]["content"]
    assert "Today is: 2026-11-21" in system and "## Server name: testkit" in system
    [saved] = load_trajectories(path)
    assert saved == trajectory
    assert saved.turns[0].tool_results[0].text == "5" and saved.timings["wall_s"] > 0


async def test_tool_errors_reach_the_model_as_errors() -> None:
    trajectory, llm = await ask(
        [mcp_call("testkit", "fail", {"message": "404 page"}), mcp_call("testkit", "nope", {}), mcp_answer("x")]
    )
    assert llm.calls[1][-1]["content"] == "Error executing tool fail: 404 page"
    assert llm.calls[2][-1]["content"].startswith("Unknown tool: 'nope'")  # as the tool gave it: no prefix
    assert [r.is_error for t in trajectory.turns[:2] for r in t.tool_results] == [True, True]


async def test_a_tool_that_times_out_does_not_stop_the_run() -> None:
    trajectory, llm = await ask([mcp_call("testkit", "slow", {"seconds": 60}), mcp_answer("done")])
    assert "timed out" in llm.calls[1][-1]["content"] and trajectory.answer == "done"
    # as the reference harness words a failed call, and with no prefix of ours before it
    assert llm.calls[1][-1]["content"].startswith("Tool call to slow on testkit failed. Error: ")


async def test_a_server_that_dies_mid_run_is_restarted_and_the_run_goes_on() -> None:
    replies = [mcp_call("testkit", "crash", {}), mcp_call("testkit", "add", {"a": 1, "b": 1}), mcp_answer("2")]
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)]) as tools:
        trajectory = await run("q", ScriptedLLM(replies), tools, AgentConfig())
    crashed, added = (t.tool_results[0] for t in trajectory.turns[:2])
    assert crashed.is_error and "was restarted" in crashed.text
    assert (added.text, added.is_error) == ("2", False) and trajectory.answer == "2"


async def test_in_mcp_xml_a_malformed_call_is_rolled_back_and_sampled_again() -> None:
    broken = "<use_mcp_tool>\n<server_name>testkit</server_name>\n<arguments>{}</arguments>\n</use_mcp_tool>"
    trajectory, llm = await ask([broken, mcp_answer("5")])
    assert llm.calls[1] == llm.calls[0]  # the same prompt again: the model never sees its bad reply
    assert trajectory.turns[0].rolled_back and "could not be parsed" in trajectory.turns[0].format_error
    assert (trajectory.stop_reason, trajectory.answer) == ("answered", "5")


async def test_with_rollback_off_a_malformed_call_is_answered_with_a_message() -> None:
    broken = "<use_mcp_tool>\n<server_name>testkit</server_name>\n<arguments>{}</arguments>\n</use_mcp_tool>"
    trajectory, llm = await ask([broken, mcp_answer("5")], AgentConfig(rollback=False, date="2026-11-21"))
    assert "could not be parsed" in llm.calls[1][-1]["content"]
    assert trajectory.turns[0].format_error and not trajectory.turns[0].rolled_back
    assert trajectory.stop_reason == "answered"


async def test_unusable_replies_are_rolled_back_with_no_cap_in_a_row_as_in_the_reference() -> None:
    broken = "<use_mcp_tool><server_name>x</server_name></use_mcp_tool>"
    trajectory, llm = await ask([broken] * 8 + [mcp_answer("5")])
    assert (trajectory.answer, trajectory.stop_reason) == ("5", "answered")
    assert [turn.rolled_back for turn in trajectory.turns] == [True] * 8 + [False, False]  # then the summary turn
    assert all(call == llm.calls[0] for call in llm.calls[:9])  # each sampled again from the same prompt
    # without rollback (the unusable reply is answered with a message) max_format_errors still ends the run
    trajectory, _ = await ask([broken] * 3, AgentConfig(max_format_errors=3, rollback=False, summary_turn=False))
    assert trajectory.stop_reason == "format_errors" and len(trajectory.turns) == 3 and trajectory.answer is None


async def test_a_reply_cut_off_ten_times_uses_up_its_turn_as_the_reference_client_gives_up() -> None:
    cut = Completion(message={"role": "assistant", "content": "<think>\nstill thinking"}, finish_reason="length")
    trajectory, llm = await ask(
        [cut] * 10 + [mcp_call("testkit", "add", {"a": 2, "b": 3}), mcp_answer("5")],
        AgentConfig(max_turns=2, date="2026-11-21"),
    )
    assert [t.consumed for t in trajectory.turns[:10]] == [False] * 9 + [True]
    assert all(call == llm.calls[0] for call in llm.calls[:11])  # the history never held a cut-off reply
    # the used-up turn counts: the call is turn 2 of 2, so the run stops at max_turns, not with the answer
    assert trajectory.stop_reason == "max_turns" and trajectory.turns[10].tool_results[0].text == "5"


async def test_an_empty_reply_stays_in_the_history_and_uses_up_its_turn_as_in_the_reference() -> None:
    trajectory, llm = await ask(["", mcp_call("testkit", "add", {"a": 2, "b": 3}), mcp_answer("5"), mcp_answer("5")])
    assert not trajectory.turns[0].rolled_back and trajectory.turns[0].format_error is not None
    assert llm.calls[1][-1] == {"role": "assistant", "content": ""}  # sent again, with nothing after it
    assert (trajectory.answer, trajectory.stop_reason) == ("5", "answered")
    trajectory, _ = await ask(["", mcp_answer("5")], AgentConfig(max_turns=1, date="2026-11-21"))
    assert trajectory.stop_reason == "max_turns"  # the empty reply was the one turn; the summary turn answered


async def test_cut_off_looping_and_refusing_replies_are_rolled_back_not_taken_as_answers() -> None:
    cut = Completion(message={"role": "assistant", "content": "<think>\nstill thinking"}, finish_reason="length")
    looping = "Let me look. " + "I need to search again. " * 40
    refusal = "I\u2019m sorry, but I can\u2019t help with that."
    trajectory, llm = await ask([cut, looping, refusal, mcp_answer("5")])
    reasons = [turn.format_error for turn in trajectory.turns[:3]]
    assert "cut off" in reasons[0] and "repeating" in reasons[1] and "refused" in reasons[2]
    assert all(call == llm.calls[0] for call in llm.calls[:4])  # each sampled again from the same prompt
    assert trajectory.answer == "5"
    # with rollback off they are sent back with a message instead
    trajectory, llm = await ask([cut, looping, mcp_answer("5")], AgentConfig(rollback=False, date="2026-11-21"))
    assert "cut off" in llm.calls[1][-1]["content"] and "repeating" in llm.calls[2][-1]["content"]
    assert trajectory.answer == "5"


async def test_a_reply_that_sends_the_loops_own_note_back_is_no_answer() -> None:
    """A small model may answer with the note it was just sent: that is the runtime's text, not an answer."""
    cut = Completion(message={"role": "assistant", "content": "The answer is"}, finish_reason="length")
    echo = "your reply was cut off at the token limit\nbefore it was finished. Think more briefly."
    config = AgentConfig(dialect="tool-call", rollback=False, summary_turn=False, date="2026-11-21")
    trajectory, llm = await ask([cut, echo, "5"], config)
    assert "repeated the note" in llm.calls[2][-1]["content"]
    assert trajectory.turns[1].format_error is not None
    assert (trajectory.answer, trajectory.stop_reason) == ("5", "answered")
    # nor is it one when asked for the final answer at the turn limit
    trajectory, _ = await ask([cut, echo, echo], replace(config, max_turns=2))
    assert trajectory.answer is None and trajectory.stop_reason == "max_turns"


async def test_the_same_call_made_again_and_again_is_refused_in_the_tool_call_dialect() -> None:
    same = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "again"}'}}
        ],
    }
    trajectory, _ = await ask([same, same, same, "ok"], AgentConfig(dialect="tool-call", date="2026-11-21"))
    results = [t.tool_results[0] for t in trajectory.turns[:3]]
    assert [r.is_error for r in results] == [False, False, True] and "not run again" in results[2].text
    # mcp-xml follows the reference harness, which refuses only a repeated search query
    call = mcp_call("testkit", "echo", {"text": "again"})
    trajectory, _ = await ask([call, call, call, mcp_answer("ok")])
    assert [t.tool_results[0].is_error for t in trajectory.turns[:3]] == [False, False, False]


async def test_keep_k_hides_old_results_from_the_model_but_the_log_keeps_them() -> None:
    replies = [mcp_call("testkit", "echo", {"text": f"result {i}"}) for i in range(6)] + [mcp_answer("done")]
    trajectory, llm = await ask(replies, AgentConfig(keep_tool_results=2))
    last_request = [m["content"] for m in llm.calls[-2] if m["role"] == "user"][1:]  # the call that answered
    assert last_request == [OMITTED] * 4 + ["result 4", "result 5"]
    assert [t.tool_results[0].text for t in trajectory.turns[:6]] == [f"result {i}" for i in range(6)]


async def test_with_rollback_off_a_reply_without_a_boxed_answer_is_sent_back() -> None:
    config = AgentConfig(rollback=False, summary_turn=False, date="2026-11-21")
    trajectory, llm = await ask(["Let me search for that first.", mcp_answer("5")], config)
    assert "neither a tool call nor a final answer" in llm.calls[1][-1]["content"]
    assert (trajectory.answer, len(trajectory.turns)) == ("5", 2)


async def test_unusable_replies_do_not_push_tool_results_out_of_view() -> None:
    replies = [mcp_call("testkit", "echo", {"text": "kept"}), "no call", "still no call", mcp_answer("x")]
    _, llm = await ask(replies, AgentConfig(keep_tool_results=1, rollback=False, date="2026-11-21"))
    assert "kept" in [m["content"] for m in llm.calls[3]]  # the last call before the summary turn


async def test_tool_call_dialect_end_to_end_over_http() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 20, "b": 22}'}}
    with FakeOpenAI([Reply(content="", tool_calls=[call]), "<think>\nDone.\n</think>\n\nIt is 42."]) as server:
        llm = OpenAIChat(LLMConfig(base_url=server.base_url, model="fake-model"))
        async with toolbox() as tools:
            trajectory = await run("q", llm, tools, AgentConfig(dialect="tool-call"))
        await llm.aclose()
    first, second = server.requests
    assert any(t["function"]["name"] == "add" for t in first["tools"])
    assert second["messages"][-2]["tool_calls"] == [call]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert trajectory.answer == "It is 42."


async def test_token_exact_turns_over_http_rebuild_what_the_server_saw(tmp_path: Path) -> None:
    replies = [mcp_call("testkit", "echo", {"text": f"page {i} " * 20}) for i in range(50)] + [mcp_answer("done")]
    path = tmp_path / "run.jsonl"
    with FakeOpenAI(replies, default=mcp_answer("done"), vllm=True) as server:  # the summary: the answer again
        llm = OpenAIChat(LLMConfig(base_url=server.base_url, model="fake-model"))
        writer = TrajectoryWriter(path)
        async with toolbox() as tools:
            await run("q", llm, tools, AgentConfig(keep_tool_results=5, max_turns=60), writer)
        writer.close()
        await llm.aclose()
    [saved] = load_trajectories(path)
    assert saved.answer == "done" and len(saved.turns) == 52
    for turn, request in zip(saved.turns, server.requests):
        assert full_prompt(saved.turns, turn.index) == tokens(render(request["messages"]))
        assert turn.completion_ids == tokens(turn.assistant["content"])
        assert len(turn.logprobs) == len(turn.completion_ids)
    segments = rebuild_segments(saved.turns)
    assert len(segments) > 40  # keep-5 rewrites the history, so most turns start a new segment
    stored = sum(len(t.prompt_delta_ids) for t in saved.turns)
    sent = sum(len(full_prompt(saved.turns, t.index)) for t in saved.turns)
    assert stored < sent / 5


async def test_a_600_turn_run_keeps_time_and_memory_per_turn_flat(tmp_path: Path) -> None:
    turns = 600
    replies = [mcp_call("testkit", "echo", {"text": f"finding number {i}"}) for i in range(turns)] + [mcp_answer("ok")]
    llm = ScriptedLLM(replies, record=False)
    path = tmp_path / "long.jsonl"
    writer = TrajectoryWriter(path)
    stamps: list[float] = []
    tracemalloc.start()
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)]) as tools:
        before = tracemalloc.get_traced_memory()[0]
        # stamped in CPU time of this process (the loop, the model, the log): the runtime's own work per turn,
        # which load elsewhere on the machine does not change as it changes the seconds a turn takes
        trajectory = await run(
            "q",
            llm,
            tools,
            AgentConfig(max_turns=turns + 1),
            writer,
            on_event=lambda kind, data: kind == "turn" and stamps.append(time.process_time()),
        )
        grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    writer.close()
    assert trajectory.stop_reason == "answered" and len(trajectory.turns) == turns + 1
    per_turn = [b - a for a, b in zip(stamps, stamps[1:])]
    first, last = statistics.median(per_turn[:100]), statistics.median(per_turn[-100:])
    assert last < 3 * first, f"turns got slower: {first * 1000:.2f} ms -> {last * 1000:.2f} ms"
    assert grown < 4 * path.stat().st_size, f"memory grew {grown} bytes for a {path.stat().st_size}-byte log"


async def test_a_search_query_already_used_is_not_run_again_in_mcp_xml() -> None:
    from mcp.server.mcpserver import MCPServer

    web = MCPServer(name="search_and_scrape_webpage")

    @web.tool()
    def google_search(q: str) -> str:
        return f"results for {q}"

    def google(q: str) -> str:
        return mcp_call("search_and_scrape_webpage", "google_search", {"q": q})

    llm = ScriptedLLM([google("nanbeige"), google("nanbeige 3B"), google("nanbeige"), mcp_answer("x")])
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)]) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21"))
    first, second, third = (turn.tool_results[0].text for turn in trajectory.turns[:3])
    assert (first, second) == ("results for nanbeige", "results for nanbeige 3B")  # both new queries ran
    assert third == (
        "The query 'nanbeige' was already searched in an earlier google_search call. Search with a "
        "different query or keywords."
    )  # not run: what the model reads instead
    assert llm.calls[3][-1]["content"] == third  # no "Error:" prefix, as the reference sends it


async def test_a_deep_search_conversation_is_pinned_by_a_golden_rendering() -> None:
    """A search, the same search again (answered as already used), a malformed call (rolled back),
    an answer, and the summary turn: every message the model was sent, in order, as a golden file."""
    from mcp.server.mcpserver import MCPServer

    web = MCPServer(name="search_and_scrape_webpage")

    @web.tool()
    def google_search(q: str) -> str:
        """Search the web."""
        return f'{{"organic": [{{"title": "{q}", "link": "https://example.org/{len(q)}"}}]}}'

    def google(q: str) -> str:
        return mcp_call("search_and_scrape_webpage", "google_search", {"q": q}, thought=f"Search {q}.")

    broken = "<think>\nCall it.\n</think>\n\n<use_mcp_tool>\n<server_name>search_and_scrape_webpage</server_name>"
    llm = ScriptedLLM(
        [
            google("Mongolia capital"),
            google("Mongolia capital"),
            broken,
            mcp_answer("Ulaanbaatar"),
            mcp_answer("Ulaanbaatar"),
        ]
    )
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)]) as tools:
        trajectory = await run("What is the capital of Mongolia?", llm, tools, AgentConfig(date="2026-11-21"))
    assert [t.rolled_back for t in trajectory.turns] == [False, False, True, False, False]
    assert (trajectory.answer, trajectory.stop_reason) == ("Ulaanbaatar", "answered")
    rendered = "".join(
        f"=== call {number}\n" + "".join(f"--- {m['role']}\n{m['content']}\n" for m in messages)
        for number, messages in enumerate(llm.calls)
    )
    golden = Path(__file__).parent / "golden" / "deep_search_conversation.txt"
    assert rendered == golden.read_text()  # a deliberate change of the flow rewrites the file by hand


async def test_a_query_whose_call_failed_may_be_searched_again_but_a_tools_own_error_counts() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    web = MCPServer(name="search_and_scrape_webpage")
    calls = []

    @web.tool()
    async def google_search(q: str) -> str:
        calls.append(q)
        if len(calls) == 1:
            await asyncio.sleep(5)  # past the call timeout: the call failed, as the reference's manager fails it
        if q == "venus":
            raise ToolError("HTTP 503")  # the tool's own error answer: a search that was made
        return f"results for {q}"

    def search(q: str) -> str:
        return mcp_call("search_and_scrape_webpage", "google_search", {"q": q})

    llm = ScriptedLLM(
        [
            search("mars"),
            search("mars"),
            search("mars"),
            search("venus"),
            search("venus"),
            mcp_answer("x"),
            mcp_answer("x"),
        ]
    )
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)], call_timeout_s=1.0) as tools:
        trajectory = await run("q", llm, tools, AgentConfig(date="2026-11-21"))
    results = [turn.tool_results[0].text for turn in trajectory.turns[:5]]
    assert results[0].startswith("Tool call to google_search on search_and_scrape_webpage failed.")
    assert results[1] == "results for mars" and "already searched" in results[2]  # the failed call did not count
    assert "already searched" in results[4] and calls == ["mars", "mars", "venus"]


async def test_an_empty_search_is_never_a_repeat() -> None:
    from mcp.server.mcpserver import MCPServer

    web = MCPServer(name="search_and_scrape_webpage")

    @web.tool()
    def google_search(q: str) -> str:
        return f"results for '{q}'"

    empty = mcp_call("search_and_scrape_webpage", "google_search", {"q": ""})
    async with Toolbox([ServerSpec(name="search_and_scrape_webpage", server=web)]) as tools:
        trajectory = await run(
            "q", ScriptedLLM([empty, empty, mcp_answer("x"), mcp_answer("x")]), tools, AgentConfig(date="2026-11-21")
        )
    assert [t.tool_results[0].text for t in trajectory.turns[:2]] == ["results for ''"] * 2  # both ran
