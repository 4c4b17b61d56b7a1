"""How a run of the loop ends: at its limits (turns, context, time), with the final-answer or summary turn
that asks for the answer, after a model failure, or cancelled."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fake_openai import mcp_answer, mcp_call
from loop_runs import ask, toolbox

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import ContextOverflow, LLMConfig, ModelError
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.dialects import OMITTED
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, end_record, load_trajectories

pytestmark = pytest.mark.anyio


async def test_rolled_back_replies_cannot_loop_forever_max_turns_bounds_them() -> None:
    broken = "<use_mcp_tool><server_name>x</server_name></use_mcp_tool>"
    trajectory, _ = await ask([broken] * 300, AgentConfig(max_turns=3, date="2026-11-21"))
    assert trajectory.stop_reason == "max_turns"
    assert sum(turn.rolled_back for turn in trajectory.turns) == 3 + 200  # max_turns + the reference's 200 more


async def test_at_max_turns_one_last_call_without_tools_asks_for_the_answer() -> None:
    calls = [mcp_call("testkit", "echo", {"text": str(i)}) for i in range(3)]
    trajectory, llm = await ask([*calls, mcp_answer("best guess")], AgentConfig(max_turns=3))
    assert (trajectory.stop_reason, trajectory.answer, len(trajectory.turns)) == ("max_turns", "best guess", 4)
    final = trajectory.turns[-1]
    assert final.instruction and "FINAL ANSWER" in llm.calls[-1][-1]["content"]
    assert "What is 2+3?" in final.instruction
    # as the reference does, the trailing tool result is dropped: the request follows the last call itself
    assert llm.calls[-1][-2] == {"role": "assistant", "content": calls[2]}
    assert final.omitted_latest_results is True
    trajectory, llm = await ask(
        [*calls, mcp_answer("best guess")], AgentConfig(max_turns=3, summary_turn=False, date="2026-11-21")
    )
    assert trajectory.answer == "best guess" and llm.calls[-1][-2]["content"] == "2"  # without it: all shown
    assert trajectory.turns[-1].omitted_latest_results is False


async def test_before_the_context_overflows_the_answer_is_requested() -> None:
    def growing(prompt_tokens: int) -> Completion:
        call = mcp_call("testkit", "echo", {"text": str(prompt_tokens)})
        return Completion(
            message={"role": "assistant", "content": call},
            usage={"prompt_tokens": prompt_tokens, "completion_tokens": 100},
        )

    replies = [growing(1000), growing(5000), growing(12000), mcp_answer("from what I found")]
    config = AgentConfig(max_context=16000, context_reserve=1000)
    trajectory, llm = await ask(replies, config, llm_config=LLMConfig(model="scripted", max_tokens=4000))
    # after the third turn: 12000 + 100 + new results + 4000 reply + 1000 reserve > 16000
    ended = (trajectory.stop_reason, trajectory.answer, len(trajectory.turns))
    assert ended == ("context_limit", "from what I found", 4)
    # 16000 - ~12100 left less than the 4000 wanted for the answer: the newest result made way, and that is recorded
    assert trajectory.turns[-1].omitted_latest_results is True
    assert not any(turn.omitted_latest_results for turn in trajectory.turns[:-1])
    # the last reply gets only the room that is left
    assert llm.max_tokens[:3] == [None] * 3 and llm.max_tokens[-1] < 16000 - 12100


async def test_when_the_server_says_the_prompt_is_too_long_the_answer_is_requested_without_the_newest_result() -> None:
    replies = [
        mcp_call("testkit", "echo", {"text": "old"}),
        mcp_call("testkit", "echo", {"text": "huge"}),
        ContextOverflow("maximum context length is 8192 tokens"),
        mcp_answer("from the old result"),
    ]
    trajectory, llm = await ask(replies, AgentConfig(keep_tool_results=-1))
    assert (trajectory.stop_reason, trajectory.answer) == ("context_limit", "from the old result")
    final_request = [m["content"] for m in llm.calls[-1] if m["role"] == "user"]
    assert final_request[1] == "old" and "FINAL ANSWER" in final_request[2] and len(final_request) == 3
    trajectory, llm = await ask(
        replies[:2] + [ContextOverflow("too long"), mcp_answer("x")],
        AgentConfig(keep_tool_results=-1, summary_turn=False, date="2026-11-21"),
    )
    final_request = [m["content"] for m in llm.calls[-1] if m["role"] == "user"]
    assert final_request[1] == "old" and final_request[2] == OMITTED and "FINAL ANSWER" in final_request[3]
    assert trajectory.turns[-1].omitted_latest_results is True  # recorded: the model did not read "huge"


async def test_at_the_context_limit_the_summary_turn_steps_back_a_whole_turn_as_the_reference() -> None:
    """The reference's check trips after turn n: it drops result n and reply n, then (as at its turn limit)
    result n-1, so the summary prompt follows reply n-1."""
    replies = [mcp_call("testkit", "echo", {"text": f"result {i} " + "x" * 3000}) for i in range(20)]
    replies.append(mcp_answer("x"))
    trajectory, llm = await ask(
        replies, AgentConfig(max_context=24000, date="2026-11-21"), llm_config=LLMConfig(max_tokens=4096)
    )
    assert trajectory.stop_reason == "context_limit"
    n = len([t for t in trajectory.turns if t.tool_calls])
    summary = llm.calls[-1]
    assert summary[-1]["content"] == trajectory.turns[-1].instruction
    assert f"result {n - 2}" in summary[-2]["content"]  # reply n-1 (0-based n-2) is the last message before it
    assert summary[-3]["content"] == OMITTED or f"result {n - 3} " in summary[-3]["content"]  # result n-2
    assert not any(f"result {n - 1} " in (m["content"] or "") for m in summary)  # neither reply n nor its result
    assert trajectory.turns[-1].omitted_latest_results


async def test_without_a_setting_or_a_server_the_context_is_what_the_model_was_trained_to() -> None:
    trajectory, _ = await ask([mcp_answer("5")] * 2)
    assert trajectory.limits["max_context"] == 262144


async def test_a_final_answer_reply_that_calls_a_tool_gives_no_answer() -> None:
    calls = [mcp_call("testkit", "echo", {"text": "a"})]
    trajectory, _ = await ask([*calls, mcp_call("testkit", "echo", {"text": "b"})], AgentConfig(max_turns=1))
    assert trajectory.stop_reason == "max_turns" and trajectory.answer is None
    assert trajectory.turns[-1].instruction and trajectory.turns[-1].format_error


async def test_in_mcp_xml_a_reply_without_a_call_ends_the_loop_and_the_summary_turn_asks_for_the_answer() -> None:
    trajectory, llm = await ask(["Let me think about that.", mcp_answer("5")])
    assert llm.calls[1][-2] == {"role": "assistant", "content": "Let me think about that."}
    request = llm.calls[1][-1]["content"]
    assert "FINAL ANSWER" in request and "This is the end of the task" in request
    assert (trajectory.stop_reason, trajectory.answer, len(trajectory.turns)) == ("answered", "5", 2)


async def test_the_summary_answer_is_the_last_box_anywhere_and_else_the_latest_one_seen() -> None:
    boxed_in_reasoning = "<think>\nIt must be \\boxed{Ulaanbaatar}.\n</think>\n\nDone."
    trajectory, _ = await ask([mcp_answer("Ulan Bator"), boxed_in_reasoning])
    assert trajectory.answer == "Ulaanbaatar"  # read anywhere in the summary reply, reasoning included
    trajectory, _ = await ask([mcp_answer("Ulan Bator"), "I am done."])
    assert trajectory.answer == "Ulan Bator" and trajectory.turns[-1].format_error  # the latest box of the run
    assert trajectory.error is None


async def test_when_the_summary_call_fails_only_a_boxed_answer_counts() -> None:
    trajectory, _ = await ask([mcp_answer("5"), ModelError("server gone")])
    assert (trajectory.answer, trajectory.error) == ("5", "server gone")
    trajectory, _ = await ask(["Let me think about it.", ModelError("server gone")])
    assert trajectory.answer is None  # not the text of a reply that gave no answer


async def test_the_summary_turn_shows_one_result_fewer_as_its_prompt_is_one_of_the_k() -> None:
    replies = [mcp_call("testkit", "echo", {"text": f"result {i}"}) for i in range(6)] + [mcp_answer("x")] * 2
    trajectory, llm = await ask(replies, AgentConfig(keep_tool_results=5, date="2026-11-21"))
    shown = [m["content"] for m in llm.calls[6] if m["content"].startswith("result")]
    assert shown == [f"result {i}" for i in range(1, 6)]  # the last call with tools: the 5 newest
    summary = [m["content"] for m in llm.calls[-1] if m["content"].startswith("result")]
    assert summary == [f"result {i}" for i in range(2, 6)]  # the summary turn: 4, as the reference shows


async def test_a_model_failure_ends_the_run_with_the_reason(tmp_path: Path) -> None:
    trajectory, _ = await ask(
        [mcp_call("testkit", "echo", {"text": "a"}), ModelError("HTTP 503: overloaded")], path=tmp_path / "run.jsonl"
    )
    assert (trajectory.stop_reason, trajectory.error) == ("model_error", "HTTP 503: overloaded")
    [saved] = load_trajectories(tmp_path / "run.jsonl")
    assert saved.stop_reason == "model_error" and len(saved.turns) == 1


async def test_the_wall_clock_limit_is_a_stop_reason() -> None:
    trajectory, _ = await ask([mcp_call("testkit", "slow", {"seconds": 0.8})] * 5, AgentConfig(timeout_s=0.5))
    assert trajectory.stop_reason == "timeout"


async def test_a_resumed_run_with_no_time_left_asks_nothing_though_its_last_turn_answered(tmp_path: Path) -> None:
    """Killed after the answer, before the summary turn, with its time used up: the answer stands, the run
    stops at its time limit, and neither the summary turn nor any other call is made."""
    path = tmp_path / "run.jsonl"
    config = AgentConfig(timeout_s=60.0, date="2026-11-21")
    await ask([mcp_call("testkit", "echo", {"text": "a"}), mcp_answer("5")], config, path=path)
    lines = path.read_text().splitlines()  # start, the call, the answer, the summary turn, end
    [whole] = load_trajectories(path)
    whole.turns, whole.answer, whole.stop_reason, whole.timings = whole.turns[:2], None, "interrupted", {"wall_s": 75.0}
    path.write_text("\n".join([*lines[:3], json.dumps(end_record(whole))]) + "\n")
    [cut] = load_trajectories(path)
    llm = ScriptedLLM([mcp_answer("6")])
    writer = TrajectoryWriter(path)
    resumed = await run(cut.question, llm, None, config, writer, resume_from=cut)
    writer.close()
    assert (resumed.stop_reason, resumed.answer, len(resumed.turns), llm.calls) == ("timeout", "5", 2, [])
    [saved] = load_trajectories(path)
    assert (saved.stop_reason, saved.answer) == ("timeout", "5") and saved.timings["wall_s"] >= 75.0


async def test_cancelling_a_run_closes_its_trajectory_as_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    thinking = asyncio.Event()

    class Hanging(ScriptedLLM):
        async def complete(self, messages, tools=None, max_tokens=None, conversation=None):  # noqa: ANN001, ANN201
            if len(self.calls) == 1:
                thinking.set()
                await asyncio.sleep(3600)
            return await super().complete(messages, tools, max_tokens, conversation)

    writer = TrajectoryWriter(path)
    async with toolbox() as tools:
        task = asyncio.create_task(
            run("q", Hanging([mcp_call("testkit", "echo", {"text": "a"})]), tools, AgentConfig(), writer)
        )
        # cancelled while the model thinks about turn 2, however long turn 1 took
        await asyncio.wait_for(thinking.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    writer.close()
    [saved] = load_trajectories(path)
    assert saved.stop_reason == "interrupted" and len(saved.turns) == 1
