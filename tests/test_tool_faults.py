"""A long run goes on through tool servers that keep crashing or hanging: each failure is an error
result the model reads, the server is restarted within the run's budget (`max_restarts`), then its
calls fail at once with a clear message, and other runs sharing the toolbox keep their tools."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import TEST_SERVER
from fake_openai import mcp_answer, mcp_call

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.restarts import RESTART_CREDIT_CALLS, Restarts
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall

pytestmark = pytest.mark.anyio
# The call timeout where a hang must be waited out: ample for the calls that answer (milliseconds; the
# first call to a server just started takes a tenth of a second on a busy machine), short to wait out.
CALL_TIMEOUT_S = 2.0


def model(turns: int, faulty: str, every: int) -> ScriptedLLM:
    """Calls `faulty` every `every` turns and `pid` otherwise, then answers after `turns`."""

    def reply(messages: list[dict]) -> str:
        step = sum(m["role"] == "assistant" for m in messages)
        if step >= turns:
            return mcp_answer("done")
        tool = faulty if step % every == every - 1 else "pid"
        return mcp_call("testkit", tool, {}, thought=f"Step {step}.")

    return ScriptedLLM([], default=reply, record=False)


def results(trajectory) -> list[tuple[str, str]]:
    return [(turn.tool_calls[0].name, turn.tool_results[0].text) for turn in trajectory.turns if turn.tool_calls]


async def test_a_server_that_keeps_crashing_is_restarted_within_the_budget_then_fails_fast() -> None:
    config = AgentConfig(max_turns=40, summary_turn=False)
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], max_restarts=3) as toolbox:
        started = time.monotonic()
        trajectory = await run("q", model(30, "crash", every=4), toolbox, config)
        took = time.monotonic() - started
    assert trajectory.stop_reason == "answered" and trajectory.answer == "done"
    calls = results(trajectory)
    crashes = [text for name, text in calls if name == "crash"]
    assert len(crashes) == 7
    assert all("was restarted" in text for text in crashes[:3])  # the budget: three restarts
    assert all("it was already restarted 3 times" in text for text in crashes[3:])
    # between crashes the restarted server answers; once the budget is spent nothing does, quickly
    pids = [text for name, text in calls[:15] if name == "pid"]
    assert all(text.isdigit() for text in pids) and len(set(pids)) == 4
    assert all("not available" in text for name, text in calls[16:] if name == "pid")
    # quickly: far less than one start (60 s) or call (300 s) timeout, the least any wait for a dead server costs
    assert took < min(toolbox.start_timeout_s, toolbox.call_timeout_s)


@pytest.mark.slow
async def test_a_server_that_hangs_is_restarted_and_then_fails_fast() -> None:
    """A call that outlives its timeout on a server that no longer answers anything: the server is
    restarted (within the budget); once the budget is spent, calls fail at once instead of each
    waiting out the timeout."""
    config = AgentConfig(max_turns=40, summary_turn=False)
    spec = ServerSpec(name="testkit", command=TEST_SERVER)
    async with Toolbox([spec], max_restarts=1, call_timeout_s=CALL_TIMEOUT_S) as toolbox:
        trajectory = await run("q", model(24, "hang", every=3), toolbox, config)
    assert trajectory.stop_reason == "answered" and trajectory.answer == "done"
    calls = results(trajectory)
    hangs = [text for name, text in calls if name == "hang"]
    assert len(hangs) == 8
    assert "timed out after 2 s" in hangs[0] and "stopped responding and was restarted" in hangs[0]
    assert "timed out after 2 s" in hangs[1] and "already restarted once" in hangs[1]
    after = calls[6:]  # from the second hang on, nothing is waited for
    assert all("not responding" in text and "already restarted once" in text for _, text in after)
    # without the check, each of these 17 calls would wait out the timeout on a dead server, and say so
    assert not any("timed out" in text for _, text in after)
    pids = [text for name, text in calls[:5] if name == "pid"]
    assert all(text.isdigit() for text in pids) and len(set(pids)) == 2


@pytest.mark.slow
async def test_a_run_whose_budget_is_spent_does_not_take_the_tools_from_the_others() -> None:
    async with Toolbox(
        [ServerSpec(name="testkit", command=TEST_SERVER)], max_restarts=1, call_timeout_s=CALL_TIMEOUT_S
    ) as toolbox:
        spent = Restarts()
        await toolbox.call(ToolCall("testkit", "hang", {}), spent)  # restarted, with run one's budget
        hung = await toolbox.call(ToolCall("testkit", "hang", {}), spent)  # hangs it again: not restarted
        assert "not responding" in hung.text
        others = [Restarts() for _ in range(3)]
        answers = await asyncio.gather(
            *(toolbox.call(ToolCall("testkit", "echo", {"text": "hi"}), budget) for budget in others)
        )
        # one of the other runs restarted it; the call that saw it hung is told to call again
        again = await asyncio.gather(
            *(toolbox.call(ToolCall("testkit", "echo", {"text": "hi"}), budget) for budget in others)
        )
        still = await toolbox.call(ToolCall("testkit", "echo", {"text": "hi"}), spent)
    assert sum(budget.total.get("testkit", 0) for budget in others) == 1 and spent.total == {"testkit": 1}
    assert all(answer.is_error for answer in answers)
    assert [answer.text for answer in again] == ["hi"] * 3
    # the server others restarted serves it too, at once: a call sent to the hung one would have waited out
    # the timeout and come back as an error (calls are not retried), not with the answer
    assert (still.text, still.is_error) == ("hi", False)


@pytest.mark.slow
async def test_a_server_whose_calls_keep_timing_out_is_restarted_though_it_still_answers() -> None:
    """Calls stuck in the server's worker threads: it still lists its tools, but three calls in a
    row that time out make it count as hung."""
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], call_timeout_s=CALL_TIMEOUT_S) as toolbox:
        before = (await toolbox.call(ToolCall("testkit", "pid", {}))).text
        stuck = [await toolbox.call(ToolCall("testkit", "slow", {"seconds": 60})) for _ in range(3)]
        after = (await toolbox.call(ToolCall("testkit", "pid", {}))).text
    assert [("timed out after 2 s" in r.text, "restarted" in r.text) for r in stuck] == [
        (True, False),
        (True, False),
        (True, True),
    ]
    assert after.isdigit() and after != before


async def test_a_server_that_crashes_now_and_then_is_restarted_for_as_long_as_it_works_in_between() -> None:
    """The budget follows progress: once a restarted server has answered RESTART_CREDIT_CALLS calls, its
    next crash is restarted again, however many came before (a budget of one restart per run would
    have left the run without the tool after the second crash)."""
    every = RESTART_CREDIT_CALLS + 2
    budget = Restarts()
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], max_restarts=1) as toolbox:
        texts = [
            (await toolbox.call(ToolCall("testkit", "flaky", {"every": every, "text": "t"}), budget)).text
            for _ in range(4 * every)
        ]
    crashes = [text for text in texts if not text.endswith(" t")]
    assert len(crashes) == 4 and all("was restarted" in text for text in crashes)
    assert budget.total == {"testkit": 4}
    answered = [text.split() for text in texts if text.endswith(" t")]
    assert len(answered) == 4 * (every - 1) and len({pid for pid, _, _ in answered}) == 4


async def test_a_server_that_dies_again_before_making_progress_stops_being_restarted() -> None:
    """Restarts in a row without RESTART_CREDIT_CALLS answers between them use up the budget."""
    every = RESTART_CREDIT_CALLS - 2
    budget = Restarts()
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], max_restarts=2) as toolbox:
        texts = [
            (await toolbox.call(ToolCall("testkit", "flaky", {"every": every, "text": "t"}), budget)).text
            for _ in range(4 * every)
        ]
    assert budget.total == {"testkit": 2}
    first_refusal = next(i for i, text in enumerate(texts) if "already restarted" in text)
    assert first_refusal == 3 * every - 1  # the third crash: two restarts in a row, no progress between
    assert all("already restarted 2 times in this run without answering" in text for text in texts[first_refusal:])
