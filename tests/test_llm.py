"""The OpenAI-compatible client against a loopback server that speaks the documented shapes."""

from __future__ import annotations

import socket
import time

import pytest
from fake_openai import FakeOpenAI, Reply

from nanbeige.agent.backends.llm import ContextOverflow, LLMConfig, ModelError, ModelUnavailable, OpenAIChat, ServerInfo
from nanbeige.agent.backends.scripted import ScriptedLLM

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def client(base_url: str, **overrides: object) -> OpenAIChat:
    settings = {"base_url": base_url, "model": "fake-model", "retry_wait_s": 0.01, "max_attempts": 4} | overrides
    return OpenAIChat(LLMConfig(**settings))


async def test_sends_sampling_settings_and_the_key() -> None:
    with FakeOpenAI(["hi"]) as server:
        llm = client(server.base_url, api_key="k-123", temperature=1.0, top_p=0.9, max_tokens=99, stop=["</x>"])
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    [request] = server.requests
    assert completion.message == {"role": "assistant", "content": "hi"}
    sampling = (request["temperature"], request["top_p"], request["max_tokens"], request["stop"])
    assert sampling == (1.0, 0.9, 99, ["</x>"])
    assert request["_headers"]["Authorization"] == "Bearer k-123"
    assert completion.usage["completion_tokens"] == 2


async def test_retries_overload_and_server_errors_then_succeeds() -> None:
    with FakeOpenAI([Reply(status=503), Reply(status=429), Reply(status=502), "ok"]) as server:
        llm = client(server.base_url)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message["content"] == "ok" and len(server.requests) == 4


async def test_honours_retry_after() -> None:
    with FakeOpenAI([Reply(status=429, headers={"Retry-After": "1"}), "ok"]) as server:
        llm = client(server.base_url)
        started = time.monotonic()
        await llm.complete(MESSAGES)
        await llm.aclose()
    assert time.monotonic() - started >= 1.0


async def test_gives_up_after_the_attempts_with_the_servers_message() -> None:
    with FakeOpenAI([], default=Reply(status=503, body={"error": {"message": "engine overloaded"}})) as server:
        llm = client(server.base_url, max_attempts=3)
        with pytest.raises(ModelError, match="HTTP 503: engine overloaded"):
            await llm.complete(MESSAGES)
        await llm.aclose()
    assert len(server.requests) == 3


async def test_a_bad_request_is_not_retried() -> None:
    with FakeOpenAI([Reply(status=400, body={"error": {"message": "bad temperature"}})]) as server:
        llm = client(server.base_url)
        with pytest.raises(ModelError, match="bad temperature"):
            await llm.complete(MESSAGES)
        await llm.aclose()
    assert len(server.requests) == 1


async def test_a_prompt_too_long_is_a_context_overflow() -> None:
    message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"
    with FakeOpenAI([Reply(status=400, body={"error": {"message": message}})]) as server:
        llm = client(server.base_url)
        with pytest.raises(ContextOverflow):
            await llm.complete(MESSAGES)
        await llm.aclose()


async def test_records_vllm_token_ids_and_logprobs() -> None:
    with FakeOpenAI(["abc"], vllm=True) as server:
        llm = client(server.base_url)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert server.requests[0]["return_token_ids"] is True and server.requests[0]["logprobs"] is True
    assert completion.completion_ids == [97, 98, 99]
    assert completion.logprobs == [-0.5, -0.5, -0.5]
    assert completion.prompt_ids == list(b"<|system|>s<|end|><|user|>q<|end|><|assistant|>")


async def test_works_with_a_server_that_ignores_the_token_fields() -> None:
    with FakeOpenAI(["abc"], vllm=False) as server:
        llm = client(server.base_url)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message["content"] == "abc"
    assert completion.completion_ids is None and completion.prompt_ids is None and completion.logprobs is None


async def test_a_vllm_server_that_rejects_the_token_fields_is_asked_again_without_them() -> None:
    with FakeOpenAI(["one", "two"], vllm=True, reject_extras=True) as server:
        llm = client(server.base_url)
        assert (await llm.complete(MESSAGES)).message["content"] == "one"
        assert (await llm.complete(MESSAGES)).message["content"] == "two"
        await llm.aclose()
    assert [("return_token_ids" in r) for r in server.requests] == [False, False]  # rejected ones are not recorded


async def test_length_cut_is_reported() -> None:
    with FakeOpenAI([Reply(content="partial", finish_reason="length")]) as server:
        llm = client(server.base_url)
        assert (await llm.complete(MESSAGES)).finish_reason == "length"
        await llm.aclose()


async def test_an_unreachable_server_says_so() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        llm = client(f"http://127.0.0.1:{port}/v1", max_attempts=2)
        with pytest.raises(ModelUnavailable, match="cannot connect"):
            await llm.complete(MESSAGES)
        await llm.aclose()


async def test_a_call_that_takes_too_long_times_out() -> None:
    with FakeOpenAI([], default=Reply(content="late", delay_s=1.0)) as server:
        llm = client(server.base_url, timeout_s=0.2, max_attempts=2)
        with pytest.raises(ModelError, match="timed out"):
            await llm.complete(MESSAGES)
        await llm.aclose()


async def test_scripted_model_replays_and_records() -> None:
    llm = ScriptedLLM(["first", {"role": "assistant", "content": "second"}, lambda messages: f"{len(messages)} msgs"])
    assert (await llm.complete(MESSAGES)).message["content"] == "first"
    assert (await llm.complete(MESSAGES)).message["content"] == "second"
    assert (await llm.complete(MESSAGES)).message["content"] == "2 msgs"
    with pytest.raises(ModelError):
        await llm.complete(MESSAGES)
    assert len(llm.calls) == 4


async def test_a_chat_response_as_vllm_serializes_it_keeps_its_token_fields() -> None:
    """`golden/vllm_chat_completion.json` was serialized by vLLM 0.33.0's own
    `ChatCompletionResponse` model, as its server sends it."""
    from pathlib import Path

    import httpx

    body = (Path(__file__).parent / "golden" / "vllm_chat_completion.json").read_bytes()
    sent = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200, content=body))
    llm = OpenAIChat(
        LLMConfig(base_url="http://vllm.invalid/v1", model="m"),
        transport=transport,
        server=ServerInfo(vllm=True, max_model_len=4096, models=["m"]),
    )
    completion = await llm.complete([{"role": "user", "content": "capital of France?"}])
    await llm.aclose()
    assert completion.message == {"role": "assistant", "content": "Paris", "reasoning": "The capital."}
    assert (completion.prompt_ids, completion.completion_ids) == ([166100, 1, 2, 3], [11, 166101])
    assert completion.logprobs == [-0.25, -0.125] and completion.finish_reason == "stop"
    assert completion.usage == {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3}
    assert b'"return_token_ids":true' in sent[0].content  # asked for the fields it read


async def test_a_connection_closed_under_a_call_that_fails_as_attribute_error_is_asked_again() -> None:
    """anyio raises AttributeError ('NoneType' object has no attribute 'getpeername') when httpcore checks a
    pooled connection whose transport has just closed: seen once in the pool's outage test. It is a transport
    error, asked again, not a crash of the run."""
    import httpx

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) in (1, 3):
            raise AttributeError("'NoneType' object has no attribute 'getpeername'")
        body = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
        return httpx.Response(200, json=body)

    llm = OpenAIChat(
        LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", retry_wait_s=0.01),
        transport=httpx.MockTransport(answer),
        server=ServerInfo(vllm=False),
    )
    assert (await llm.complete(MESSAGES)).message["content"] == "ok"
    assert await llm.get_briefly("/models") is None  # a probe that met it has no answer, and no crash
    await llm.aclose()
    assert calls == ["/v1/chat/completions", "/v1/chat/completions", "/v1/models"]
