"""Servers that do not stream as vLLM does, over real loopback HTTP: one that ignores `"stream": true`
and answers with the whole completion as JSON, one that refuses `stream_options`, one that refuses
`stream` itself, and one that goes silent in the middle of a stream. The reply is read by what the
server sent (its Content-Type), the refused field is left out from then on, and silence longer than
the request timeout is a timeout, asked again like any other."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer

from nanbeige.agent.backends.llm import LLMConfig, ModelError, OpenAIChat
from nanbeige.agent.backends.refusals import RequestShape
from nanbeige.agent.backends.stream import StreamError, read_stream

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+3?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
# a reply with all a whole body can carry: split-off reasoning, text, a tool call and its finish reason
# (`content` is what the fake counts usage and token ids from)
FULL = Reply(
    content="Let me add.",
    message={
        "role": "assistant",
        "content": "Let me add.",
        "reasoning_content": "2 and 3 make 5.",
        "tool_calls": [CALL],
    },
    finish_reason="tool_calls",
)
NO_STREAM_OPTIONS = "Unrecognized request argument supplied: stream_options"
NO_STREAMING = "Streaming is not supported by this endpoint"
NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def client(base_url: str, **overrides: Any) -> OpenAIChat:
    config = LLMConfig(base_url=base_url, model="fake-model", retry_wait_s=0.01, max_retry_wait_s=0.05)
    return OpenAIChat(dataclasses.replace(config, **overrides))


def same(a: Any, b: Any) -> bool:
    """Two completions are the same reply (the time each took aside)."""
    return dataclasses.replace(a, latency_s=0) == dataclasses.replace(b, latency_s=0)


# ---------------------------------------------------------------- a whole JSON body for a streamed request


@pytest.mark.parametrize("vllm", [False, True], ids=["openai", "vllm-token-fields"])
async def test_a_whole_json_answer_to_a_streamed_request_is_the_completion_it_would_be_unstreamed(vllm: bool) -> None:
    with FakeOpenAI([FULL, FULL], vllm=vllm, streams=False) as server:
        llm = client(server.base_url)
        plain = await llm.complete(MESSAGES)
        pieces: list[str] = []
        streamed = await llm.complete(MESSAGES, on_text=pieces.append)
        await llm.aclose()
    assert server.requests[1]["stream"] is True  # asked to stream, and answered whole
    assert same(streamed, plain)
    assert streamed.message["tool_calls"] == [CALL] and streamed.finish_reason == "tool_calls"
    assert streamed.usage["completion_tokens"] == len("Let me add.")
    if vllm:
        assert streamed.completion_ids and len(streamed.logprobs) == len(streamed.completion_ids)
        assert streamed.prompt_ids
    # the view still sees the reply, all at once, its reasoning marked as a stream marks it
    assert "".join(pieces) == "<think>\n2 and 3 make 5.\n</think>\n\nLet me add."


async def test_a_whole_body_that_is_an_error_says_the_servers_words() -> None:
    error = Reply(message={"role": "assistant", "content": "unused"})
    with FakeOpenAI([error], streams=False) as server:
        server.completion = lambda request, reply: {"error": {"message": "the engine died", "type": "internal"}}
        llm = client(server.base_url)
        with pytest.raises(ModelError, match="the engine died"):
            await llm.complete(MESSAGES, on_text=lambda text: None)
        await llm.aclose()


WHOLE = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "5"}, "finish_reason": "stop"}]}'
EVENTS = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "5"}, "finish_reason": null}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json; charset=utf-8", WHOLE),
        ("text/event-stream; charset=utf-8", EVENTS),
        ("", b"\n " + WHOLE),
        ("text/plain", WHOLE),
        ("", EVENTS),
        ("text/plain", EVENTS),
    ],
    ids=["json", "events", "no-type-json", "plain-json", "no-type-events", "plain-events"],
)
async def test_the_content_type_says_how_to_read_and_where_it_says_neither_the_body_does(
    content_type: str, body: bytes
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    pieces: list[str] = []
    read = await read_stream(httpx.Response(200, content=body, headers=headers), pieces.append)
    assert read["choices"][0]["message"]["content"] == "5" and read["choices"][0]["finish_reason"] == "stop"
    assert pieces == ["5"]


async def test_an_answer_that_is_neither_events_nor_json_is_an_unusable_reply_in_one_line() -> None:
    page = b"<html><body>502 Bad Gateway</body></html>"
    with pytest.raises(StreamError, match=r"neither events nor JSON \(text/html\): b'<html><body>502"):
        await read_stream(httpx.Response(200, content=page, headers={"content-type": "text/html"}), lambda text: None)


# ---------------------------------------------------------------- refused fields


@pytest.mark.parametrize(
    ("status", "message", "left_out"),
    [
        (400, NO_STREAM_OPTIONS, {"stream_options"}),
        (422, "body.stream_options: Extra inputs are not permitted", {"stream_options"}),
        (400, NO_STREAMING, {"stream", "stream_options"}),  # the options mean nothing without the stream
        (400, "'stream' is not a valid parameter", {"stream", "stream_options"}),
        (400, "Unrecognized request argument supplied: return_token_ids", {"extras"}),
        (400, "the upstream model is unavailable", set()),  # "upstream" names no field
        (500, NO_STREAMING, set()),  # not a refusal of the request: a server error
    ],
)
def test_a_refusal_leaves_out_exactly_the_parts_it_names(status: int, message: str, left_out: set[str]) -> None:
    shape = RequestShape(extras=True)
    dropped = shape.drop_refused(
        httpx.Response(status, json={"error": {"message": message}}), ("extras", "stream_options", "stream")
    )
    assert dropped is bool(left_out)
    assert {part for part in ("extras", "stream_options", "stream") if not getattr(shape, part)} == left_out


async def test_a_server_that_refuses_stream_options_streams_without_them_from_then_on() -> None:
    with FakeOpenAI(["It is 5.", "Still 5."], refuses={"stream_options": NO_STREAM_OPTIONS}) as server:
        llm = client(server.base_url)
        pieces: list[str] = []
        first = await llm.complete(MESSAGES, on_text=pieces.append)
        second = await llm.complete(MESSAGES, on_text=pieces.append)
        await llm.aclose()
    assert (first.message["content"], second.message["content"]) == ("It is 5.", "Still 5.")
    assert first.finish_reason == "stop"
    sent = [(r.get("stream"), "stream_options" in r) for r in server.requests]
    assert sent == [(True, True), (True, False), (True, False)]  # refused once, then never sent again
    assert len(pieces) > 2  # still streamed, a piece at a time


async def test_a_server_that_refuses_stream_is_asked_unstreamed_from_then_on() -> None:
    with FakeOpenAI([FULL, FULL, FULL], vllm=True, refuses={"stream": NO_STREAMING}) as server:
        llm = client(server.base_url)
        plain = await llm.complete(MESSAGES)
        pieces: list[str] = []
        first = await llm.complete(MESSAGES, on_text=pieces.append)
        second = await llm.complete(MESSAGES, on_text=pieces.append)
        await llm.aclose()
    assert same(first, plain) and same(second, plain)
    streamed = [("stream" in r, "stream_options" in r) for r in server.requests]
    assert streamed == [(False, False), (True, True), (False, False), (False, False)]
    assert all(r.get("return_token_ids") for r in server.requests)  # vLLM's own fields were never dropped
    assert "".join(pieces) == 2 * "<think>\n2 and 3 make 5.\n</think>\n\nLet me add."


async def test_a_refusal_naming_no_optional_field_is_the_servers_error_asked_once() -> None:
    refusal = Reply(status=400, body={"error": {"message": "messages.1.role: must be user or assistant"}})
    with FakeOpenAI([refusal]) as server:
        llm = client(server.base_url)
        with pytest.raises(ModelError, match="HTTP 400: messages.1.role: must be user or assistant"):
            await llm.complete(MESSAGES, on_text=lambda text: None)
        await llm.aclose()
    assert len(server.requests) == 1 and "stream_options" in server.requests[0]


# ---------------------------------------------------------------- a stream that goes silent


async def test_a_stream_silent_longer_than_the_request_timeout_is_asked_again() -> None:
    answer = mcp_answer("5")
    with FakeOpenAI([Reply(content=answer, stall_after=3, stall_s=30), answer]) as server:
        llm = client(server.base_url, timeout_s=1.0)
        pieces: list[str] = []
        started = time.monotonic()
        completion = await llm.complete(MESSAGES, on_text=pieces.append)
        took = time.monotonic() - started
        await llm.aclose()
    assert completion.message["content"] == answer and completion.finish_reason == "stop"
    assert len(server.requests) == 2
    assert 1.0 <= took < 15  # waited out the timeout once, not the 30 s of silence
    said = "".join(pieces)
    assert said.index("no whole reply from the server within 1 s: asking again") < said.rindex(answer)  # told


async def test_a_server_that_always_goes_silent_is_a_timeout_error_at_the_retry_budget() -> None:
    silent = Reply(content=mcp_answer("5"), stall_after=2, stall_s=30)
    with FakeOpenAI([], default=silent) as server:
        llm = client(server.base_url, timeout_s=0.5, max_retry_s=2.0)
        started = time.monotonic()
        with pytest.raises(ModelError, match=r"model call timed out after 0.5 s \(no whole reply by then\)"):
            await llm.complete(MESSAGES, on_text=lambda text: None)
        took = time.monotonic() - started
        await llm.aclose()
    assert len(server.requests) >= 2  # asked again, like any timeout
    assert took < 15


# ---------------------------------------------------------------- token mode


async def test_token_mode_reads_a_whole_json_answer_to_its_streamed_request(tokenizer: Any) -> None:
    from nanbeige.agent.backends.token_mode import TokenModeChat

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeOpenAI(["It is 5.", "It is 5."], tokenize=tokenize, stop_id=stop_id, vllm=True, streams=False) as server:
        llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
        plain = await llm.complete(MESSAGES)
        pieces: list[str] = []
        streamed = await llm.complete(MESSAGES, on_text=pieces.append)
        await llm.aclose()
    assert server.requests[1]["stream"] is True
    assert same(streamed, plain) and streamed.completion_ids[-1] == stop_id
    assert pieces == ["It is 5."]


# ---------------------------------------------------------------- through `nanbeige ask`


@pytest.mark.slow
@pytest.mark.parametrize(
    "server_options",
    [{"streams": False}, {"refuses": {"stream_options": NO_STREAM_OPTIONS}}, {"refuses": {"stream": NO_STREAMING}}],
    ids=["ignores-stream", "refuses-stream-options", "refuses-stream"],
)
def test_ask_answers_from_a_server_that_does_not_stream_as_vllm_does(
    tmp_path: Path, server_options: dict[str, Any]
) -> None:
    path = tmp_path / "run.jsonl"
    key = "sk-unstreamed-0123456789"
    env = {**os.environ, "NANBEIGE_API_KEY": key, "NANBEIGE_RUNS_DIR": str(tmp_path)}
    with FakeOpenAI([], default=mcp_answer("Ulaanbaatar"), api_key=key, **server_options) as server:
        result = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "What is the capital of Mongolia?",
                "--base-url",
                server.base_url,
                "--mcp",
                "testkit=" + shlex.join(TEST_SERVER),
                "--no-default-servers",
                "--trajectory",
                str(path),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Ulaanbaatar\n"
    assert "unusable stream" not in result.stderr and "Traceback" not in result.stderr
    end = json.loads(path.read_text().splitlines()[-1])
    assert end["stop_reason"] == "answered"
    assert key not in result.stdout + result.stderr + path.read_text()
    asked = [r for r in server.requests if "messages" in r]
    assert asked[-1].get("stream") is (None if "stream" in server_options.get("refuses", {}) else True)
