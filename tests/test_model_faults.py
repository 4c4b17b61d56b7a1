"""A long run rides out a model server that restarts or sheds load: the client retries within a
budget of time (`LLMConfig.max_retry_s`), honouring Retry-After, and the run goes on."""

from __future__ import annotations

import email.utils
import time

import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call

from nanbeige.agent.backends.llm import LLMConfig, ModelError, OpenAIChat
from nanbeige.agent.run.loop import AgentConfig, run

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
# Backoff shrunk for tests: the first wait 20 ms, doubling up to 200 ms.
FAST = {"retry_wait_s": 0.02, "max_retry_wait_s": 0.2}


def client(base_url: str, **overrides: object) -> OpenAIChat:
    return OpenAIChat(LLMConfig(base_url=base_url, model="fake-model", **(FAST | overrides)))


def turns_then_answer(turns: int, fault_at: int, fault) -> callable:
    """A model that calls a tool each turn, answers after `turns`, and at model call `fault_at`
    (counting every request that reached it) does `fault(server)` first."""
    count = iter(range(10**6))

    def reply(request: dict) -> Reply | str:
        call = next(count)
        if call == fault_at:
            return fault()
        step = sum(m["role"] == "assistant" for m in request["messages"])
        return mcp_call("testkit", "echo", {"text": f"step {step}"}) if step < turns else mcp_answer("done")

    return reply


async def test_a_run_rides_out_a_model_server_restart() -> None:
    """The server crashes while answering turn 4 (that request is cut), refuses connections for
    two seconds, and comes back on the same port: the run waits and answers."""
    holder: dict[str, FakeOpenAI] = {}

    def crash() -> Reply:
        holder["server"].outage(2.0)
        return Reply(content="never sent")

    with FakeOpenAI(turns_then_answer(8, 4, crash)) as server:
        holder["server"] = server
        llm = client(server.base_url, max_retry_s=30.0)
        started = time.monotonic()
        trajectory = await run("q", llm, None, AgentConfig(summary_turn=False))
        await llm.aclose()
    assert trajectory.stop_reason == "answered" and trajectory.answer == "done", trajectory.error
    assert len(trajectory.turns) == 9
    assert time.monotonic() - started >= 2.0  # it waited for the server, not around it
    # the turn that was in flight when the server died was asked again: waited for, it took over 2 s
    assert max(turn.latency_s for turn in trajectory.turns) >= 2.0


async def test_a_storm_of_429s_is_waited_out_as_retry_after_says() -> None:
    """Eight refusals in a row, each with Retry-After: every wait is the one asked for (not less,
    and not a longer backoff of its own), in seconds or as an HTTP date; then the call succeeds."""
    seconds = [0.3, 0.1, 0.2, 0.1, 0.3, 0.1, 0.2]
    refusals = [Reply(status=429, headers={"Retry-After": str(s)}) for s in seconds]
    at = time.time() + 2.0
    refusals.append(Reply(status=429, headers={"Retry-After": email.utils.formatdate(at, usegmt=True)}))
    with FakeOpenAI(refusals + ["ok"]) as server:
        # a backoff of its own would wait 30 s or more: past the call's 20 s budget, so it would give up instead
        llm = client(server.base_url, retry_wait_s=30.0, max_retry_wait_s=30.0, max_retry_s=20.0)
        wall_started = time.time() - time.monotonic()  # to place the HTTP date on the monotonic clock
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message["content"] == "ok" and len(server.requests) == 9
    received = [request["_received"] for request in server.requests]
    gaps = [later - earlier for earlier, later in zip(received, received[1:])]
    # never less than asked (a busy machine only adds to a wait); more only by a request's round trip,
    # milliseconds, where a backoff of its own would have added 30 s
    for asked, gap in zip(seconds, gaps):
        assert asked - 0.01 <= gap < asked + 1.0, (seconds, gaps)
    date_names = email.utils.parsedate_to_datetime(email.utils.formatdate(at, usegmt=True)).timestamp()
    assert received[-1] + wall_started >= date_names - 0.05  # not before the date it named
    assert gaps[-1] < 2.0 + 1.0


async def test_retry_after_is_capped() -> None:
    with FakeOpenAI([Reply(status=503, headers={"Retry-After": "3600"}), "ok"]) as server:
        llm = client(server.base_url, max_retry_after_s=0.2)
        started = time.monotonic()
        assert (await llm.complete(MESSAGES)).message["content"] == "ok"
        await llm.aclose()
    # the cap's 0.2 s and a few round trips: not the 3600 s asked, nor the default cap's 60 s
    assert 0.2 <= time.monotonic() - started < 10


async def test_the_retry_budget_is_time_and_then_the_run_stops_with_the_reason() -> None:
    """Refused for longer than `max_retry_s`: the call gives up at its budget, not at a count of
    attempts, and the run stops with stop reason `model_error` and the server's words."""
    overloaded = Reply(status=503, body={"error": {"message": "engine overloaded"}})
    budget, longest_wait = 2.0, 0.05  # waits short beside the budget: many attempts fit, even on a busy machine
    with FakeOpenAI([mcp_call("testkit", "echo", {"text": "x"})], default=overloaded) as server:
        llm = client(server.base_url, max_retry_s=budget, max_retry_wait_s=longest_wait)
        started = time.monotonic()
        trajectory = await run("q", llm, None, AgentConfig(summary_turn=False))
        took = time.monotonic() - started
        await llm.aclose()
    assert trajectory.stop_reason == "model_error" and "HTTP 503: engine overloaded" in trajectory.error
    assert len(trajectory.turns) == 1
    assert len(server.requests) > 6  # more attempts than the old fixed five: the budget is time
    # it stops once the next wait would end past the budget, so not before the budget less one wait;
    # and not long after (without the budget it would retry for the default 300 s)
    assert budget - longest_wait <= took < budget + 10


async def test_an_attempt_limit_still_holds_when_set() -> None:
    with FakeOpenAI([], default=Reply(status=503)) as server:
        llm = client(server.base_url, max_attempts=3)
        with pytest.raises(ModelError, match="HTTP 503"):
            await llm.complete(MESSAGES)
        await llm.aclose()
    assert len(server.requests) == 3
