"""An endpoint that trickles, lies or floods costs a run only time, and bounded time: every model call has
a deadline from the request to the reply's last byte (keep-alive pings do not extend it), a reply has size
caps, a 200 that is no completion is a failure, and in token mode the ids must spell the reply's text. Each
such failure takes the endpoint out of a pool, as one that is down, and the run goes on at another. The
bad endpoints are real loopback servers (`hostile_endpoints.py`) beside healthy fakes (`fake_openai.py`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer
from hostile_endpoints import HostileEndpoint, endless_line, garbage, oversized, trickle
from test_pool import NANBEIGE

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.model_server import EndpointUnavailable, UnusableReply
from nanbeige.agent.backends.pool import EndpointPool, member_config
from nanbeige.agent.backends.stream import MAX_REPLY_BYTES
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
BOUND_S = 30.0  # far past what each call should take; today's code waits here instead of forever


def pool_of(*urls: str, **config: Any) -> EndpointPool:
    base = LLMConfig(base_url=urls[0], model="fake-model", retry_wait_s=0.05, **config)
    return EndpointPool([OpenAIChat(member_config(base, url)) for url in urls], base)


async def pooled(urls: list[str], streamed: bool, **config: Any) -> tuple[Any, float]:
    """The first call of a fresh pool over `urls` (it goes to the first), and the seconds it took."""
    pool = pool_of(*urls, **config)
    started = time.monotonic()
    try:
        async with asyncio.timeout(BOUND_S):
            completion = await pool.complete(MESSAGES, on_text=(lambda text: None) if streamed else None)
        return completion, time.monotonic() - started
    finally:
        await pool.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True], ids=["a byte every 0.5 s", "a keep-alive ping every 0.3 s"])
async def test_a_run_on_an_endpoint_that_trickles_goes_on_at_a_healthy_one_at_the_deadline(streamed: bool) -> None:
    with HostileEndpoint(trickle(0.3 if streamed else 0.5)) as slow, FakeOpenAI([], default="4") as healthy:
        completion, took = await pooled([slow.base_url, healthy.base_url], streamed, timeout_s=1.0)
    assert completion.message["content"] == "4" and completion.endpoint == healthy.base_url
    assert slow.requests and 1.0 <= took < 10  # each attempt there ended at its 1 s deadline


@pytest.mark.anyio
async def test_keep_alive_pings_do_not_extend_the_deadline_of_a_lone_endpoint() -> None:
    with HostileEndpoint(trickle(0.2)) as slow:
        llm = OpenAIChat(LLMConfig(base_url=slow.base_url, model="fake-model", timeout_s=1.0, max_attempts=1))
        started = time.monotonic()
        try:
            with pytest.raises(EndpointUnavailable, match=r"model call timed out after 1 s"):
                async with asyncio.timeout(BOUND_S):
                    await llm.complete(MESSAGES, on_text=lambda text: None)
        finally:
            await llm.aclose()
    assert time.monotonic() - started < 5


def test_ask_over_a_pool_with_a_slowloris_answers_from_the_healthy_endpoint(tmp_path: Path) -> None:
    """The deadline is `--request-timeout`; `ask` gives the first run to the first `--base-url`."""
    with HostileEndpoint(trickle(0.5)) as slow, FakeOpenAI([], default=mcp_answer("4")) as healthy:
        started = time.monotonic()
        done = subprocess.run(
            [NANBEIGE, "ask", "--no-default-servers", "--request-timeout", "1", "--trajectory"]
            + [str(tmp_path / "run.jsonl"), "--base-url", slow.base_url, "--base-url", healthy.base_url, "What is 4?"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "300"},
        )
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    [trajectory] = load_trajectories(tmp_path / "run.jsonl")
    assert trajectory.answer == "4" and {turn.endpoint for turn in trajectory.turns} == {healthy.base_url}
    assert slow.requests and took < 60
    assert f"{slow.base_url} 0 requests, 1 failures" in done.stderr  # the pool's summary line


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_an_endpoint_answering_200_with_no_completion_is_taken_out_and_the_run_moves(streamed: bool) -> None:
    with HostileEndpoint(garbage) as liar, FakeOpenAI([], default="4") as healthy:
        pool = pool_of(liar.base_url, healthy.base_url)
        try:
            answers = [await pool.complete(MESSAGES, on_text=(lambda t: None) if streamed else None) for _ in range(4)]
        finally:
            await pool.aclose()
    assert [(a.message["content"], a.endpoint) for a in answers] == [("4", healthy.base_url)] * 4
    assert len(liar.requests) == 1  # taken out for its cooldown after the first: later runs never go there
    assert "not a chat completion" in pool.endpoints[0].problem or "unusable reply" in pool.endpoints[0].problem


@pytest.mark.anyio
async def test_an_event_line_that_never_ends_is_an_endpoint_failure_read_in_linear_time() -> None:
    """100 MB on one line: past the line cap (16 MB) the stream is given up; the line is grown in place,
    not copied again for every 64 KB that comes (which took minutes)."""
    with HostileEndpoint(endless_line) as flood, FakeOpenAI([], default="4") as healthy:
        completion, took = await pooled([flood.base_url, healthy.base_url], streamed=True)
        sent = flood.sent
    assert completion.endpoint == healthy.base_url and took < 20
    assert sent < 60 * 2**20  # the client hung up at the cap, not at the end


@pytest.mark.anyio
async def test_a_body_past_the_size_cap_is_an_endpoint_failure_and_is_not_read_whole() -> None:
    with HostileEndpoint(oversized(160 * 2**20)) as flood, FakeOpenAI([], default="4") as healthy:
        completion, _ = await pooled([flood.base_url, healthy.base_url], streamed=False)
        sent = flood.sent
        lone = OpenAIChat(LLMConfig(base_url=flood.base_url, model="fake-model", max_attempts=1))
        try:
            with pytest.raises(UnusableReply, match="a reply longer than 64 MB"):
                await lone.complete(MESSAGES)
        finally:
            await lone.aclose()
    assert completion.endpoint == healthy.base_url
    assert sent < MAX_REPLY_BYTES + 64 * 2**20  # what the socket buffers held past the cap, not 160 MB


def token_server(tokenizer: Any, spell: Any) -> FakeOpenAI:
    """A vLLM fake in token mode whose reply's ids are `spell(text)`'s tokens."""
    return FakeOpenAI(
        [],
        default=Reply(mcp_answer("4")),
        vllm=True,
        tokenize=lambda text: tokenizer(spell(text), add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )


@pytest.mark.anyio
async def test_token_mode_refuses_ids_that_do_not_spell_the_reply_and_the_pool_moves_the_run(tokenizer: Any) -> None:
    from nanbeige.agent.backends.token_mode import TokenModeChat

    def lie(text: str) -> str:  # the text says 4; the ids, what training would learn, say 5
        return text.replace("{4}", "{5}")

    with token_server(tokenizer, lie) as liar, token_server(tokenizer, lambda text: text) as honest:
        lone = TokenModeChat(LLMConfig(base_url=liar.base_url, model="fake-model"), tokenizer)
        try:
            with pytest.raises(UnusableReply, match=r"token ids that do not spell its reply.*\\\\boxed\{5\}"):
                await lone.complete(MESSAGES)
        finally:
            await lone.aclose()
        base = LLMConfig(base_url=liar.base_url, model="fake-model")
        first = TokenModeChat(member_config(base, liar.base_url), tokenizer)
        pool = EndpointPool([first, first.at(member_config(base, honest.base_url))], base)
        try:
            completion = await pool.complete(MESSAGES, conversation=pool.new_conversation())
        finally:
            await pool.aclose()
    assert completion.endpoint == honest.base_url and "\\boxed{4}" in completion.message["content"]
    spelled = tokenizer.decode(completion.completion_ids, skip_special_tokens=False)
    assert spelled == completion.message["content"] + "<|im_end|>"


def test_a_model_list_that_trickles_fails_the_probe_at_its_deadline() -> None:
    """What every command asks each endpoint first (`probe_server`): bounded in all, not per byte."""
    from nanbeige.agent.backends.model_server import ModelUnavailable, probe_server

    with HostileEndpoint(garbage, list_every_s=0.3) as slow:
        started = time.monotonic()
        with pytest.raises(ModelUnavailable, match="ReadTimeout"):
            probe_server(slow.base_url, None, timeout=1.0)
    assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_a_judge_that_trickles_or_floods_its_answer_fails_the_call() -> None:
    """The judge's and critic's calls (`--request-timeout` of `judge`) are bounded in all, and in size, too."""
    import httpx

    from nanbeige.evals.endpoint import CallFailed, chat_text
    from nanbeige.tools.endpoint import ChatEndpoint

    with HostileEndpoint(trickle(0.3)) as slow:
        endpoint = ChatEndpoint(base_url=slow.base_url, model="fake-model", timeout_s=1.0)
        started = time.monotonic()
        async with httpx.AsyncClient() as client:
            with pytest.raises(CallFailed, match="did not answer within 1 s"):
                async with asyncio.timeout(BOUND_S):
                    await chat_text(client, endpoint, MESSAGES)
    assert time.monotonic() - started < 5
    with HostileEndpoint(oversized(160 * 2**20)) as flood:
        endpoint = ChatEndpoint(base_url=flood.base_url, model="fake-model", timeout_s=60.0)
        async with httpx.AsyncClient() as client:
            with pytest.raises(CallFailed, match="a reply longer than 64 MB"):
                await chat_text(client, endpoint, MESSAGES)
        assert flood.sent < MAX_REPLY_BYTES + 64 * 2**20


def test_the_deadline_is_held_to_its_range_on_the_command_line_and_in_the_api() -> None:
    """A deadline of NaN would never pass, one of 0 would fail every call: both are refused before anything starts."""
    from nanbeige.agent.api import with_overrides
    from nanbeige.agent.run.run_config import RunSettings

    for value in ("nan", "0"):
        done = subprocess.run(
            [NANBEIGE, "ask", "--request-timeout", value, "What is 4?"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and "--request-timeout" in done.stderr and "Traceback" not in done.stderr
        with pytest.raises(ValueError, match="request_timeout must be"):
            with_overrides(RunSettings(), {"request_timeout": float(value)})
    assert with_overrides(RunSettings(), {"request_timeout": 5.0}).llm.timeout_s == 5.0


def test_evals_request_timeout_is_the_judges_deadline_as_well_as_the_agents(tmp_path: Path) -> None:
    from nanbeige.agent.cli.command_options import EVAL
    from nanbeige.agent.cli.commands import eval_config
    from nanbeige.agent.cli.options import RUN_OPTIONS, run_settings
    from nanbeige.evals.benchmarks import BENCHMARKS
    from nanbeige.evals.judges import JUDGE_ENDPOINT

    flags = {name: default for name, (_, default) in (RUN_OPTIONS | EVAL).items()}
    flags |= {"data": tmp_path, "out_dir": tmp_path}
    bench = next(iter(BENCHMARKS.values()))
    assert eval_config(bench, flags).judge.timeout_s == JUDGE_ENDPOINT.timeout_s
    given = flags | {"request_timeout": 7.0}
    assert eval_config(bench, given).judge.timeout_s == 7.0 and run_settings(given).llm.timeout_s == 7.0


@pytest.mark.anyio
async def test_an_endless_line_in_small_pieces_is_refused_at_its_cap_in_linear_time() -> None:
    """16 MB of one line in 100-byte pieces: each piece is added in place, not by copying the line so far
    (which is 160,000 copies of up to 16 MB)."""
    import httpx

    from nanbeige.agent.backends.stream import MAX_LINE_BYTES, StreamError, read_stream

    async def one_line() -> Any:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
        while True:
            yield b"a" * 100

    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=one_line())
    started = time.monotonic()
    with pytest.raises(StreamError, match=f"an event line longer than {MAX_LINE_BYTES // 2**20} MB"):
        async with asyncio.timeout(BOUND_S):
            await read_stream(response, lambda text: None)
    assert time.monotonic() - started < 10


def test_token_ids_may_run_past_the_text_only_by_what_vllm_leaves_out_of_it(tokenizer: Any) -> None:
    """A stop string and the rest of the token that completed it; the bytes of a character a length cut split.
    Anything more the ids say is refused."""
    from nanbeige.agent.backends.completion import Completion
    from nanbeige.agent.backends.token_mode import check_spelling

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def reply(text: str, token_ids: list[int], finish: str) -> Completion:
        return Completion({"role": "assistant", "content": text}, finish_reason=finish, completion_ids=token_ids)

    first_byte_of_e_acute = tokenizer.convert_tokens_to_ids("Ã")  # é is 0xC3 0xA9; byte-level BPE writes 0xC3 as Ã
    fine = [
        reply("It is 5", ids("It is 5</x>"), "stop"),  # stopped on the stop string "</x>"
        reply("Caf", ids("Caf") + [first_byte_of_e_acute], "length"),  # cut inside "é"
    ]
    for completion in fine:
        check_spelling(tokenizer, completion, [], ["</x>"])
    lies = [
        reply("It is 5", ids("It is 5</x> and then more"), "stop"),
        reply("Caf", ids("Caf") + [first_byte_of_e_acute], "stop"),
        reply("It is 5", ids("It is 6"), "length"),
        reply("It is 5", ids("It is 5") + [10**9], "stop"),
    ]
    for completion in lies:
        with pytest.raises(UnusableReply):
            check_spelling(tokenizer, completion, [], ["</x>"])


@pytest.mark.anyio
async def test_an_endpoint_that_lists_its_models_but_never_answers_well_is_left_alone_longer_each_time() -> None:
    """Its probe (`GET /models`) succeeds after every cooldown; each failure before a call on it succeeds
    doubles the cooldown, so it costs a run a failed call every 30 s, 60 s, 120 s, ... rather than every 30 s."""
    now = [0.0]
    with HostileEndpoint(garbage) as liar, FakeOpenAI([], default="4") as healthy:
        pool = pool_of(liar.base_url, healthy.base_url)
        pool.clock = lambda: now[0]
        tried = []
        try:
            for at in (0, 31, 62, 92, 153, 213):
                now[0] = float(at)
                assert (await pool.complete(MESSAGES)).endpoint == healthy.base_url
                tried.append(len(liar.requests))
        finally:
            await pool.aclose()
    # asked at 0; after 30 s at 31; after 60 s not at 62 but at 92; after 120 s not at 153 but at 213
    assert tried == [1, 2, 2, 3, 3, 4]


def test_loops_request_timeout_is_the_critics_deadline_too() -> None:
    from nanbeige.agent.cli.train_commands import judging
    from nanbeige.agent.cli.train_options import LOOP_COMMAND
    from nanbeige.trainer.critic import CRITIC_ENDPOINT

    flags = {name: default for name, (_, default) in LOOP_COMMAND.items()}
    assert judging(flags).critic.timeout_s == CRITIC_ENDPOINT.timeout_s
    assert judging(flags | {"request_timeout": 7.0}).critic.timeout_s == 7.0
