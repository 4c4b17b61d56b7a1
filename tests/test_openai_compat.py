"""Servers that are OpenAI-compatible but not vLLM: the client asks what the server is before its
first call and sends vLLM's token fields only to vLLM; replies in shapes the loop cannot use end the
run with a model error, not a traceback."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from fake_openai import FakeOpenAI, Reply
from fake_site import Site

from nanbeige.agent.backends.llm import (
    VLLM_EXTRAS,
    LLMConfig,
    ModelError,
    ModelUnavailable,
    OpenAIChat,
    ServerInfo,
    probe_server,
)
from nanbeige.agent.run.loop import AgentConfig, run

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]


def client(base_url: str, server: ServerInfo | None = None) -> OpenAIChat:
    config = LLMConfig(base_url=base_url, model="fake-model", retry_wait_s=0.01, max_attempts=2)
    return OpenAIChat(config, server=server)


def carries_extras(request: dict[str, Any]) -> bool:
    return any(name in request for name in VLLM_EXTRAS)


# ---------------------------------------------------------------- what the server is


def test_probe_reads_a_vllm_model_list() -> None:
    with FakeOpenAI([], vllm=True, max_model_len=65536) as server:
        info = probe_server(server.base_url, None)
    assert info == ServerInfo(vllm=True, max_model_len=65536, models=["fake-model"], weights="fake-model")
    assert server.gets == ["/v1/models"]  # the owner decided: no second request


def test_probe_of_another_server_finds_no_vllm_and_no_length() -> None:
    with FakeOpenAI([]) as server:
        info = probe_server(server.base_url, None)
    assert info == ServerInfo(vllm=False, max_model_len=None, models=["fake-model"])


def test_probe_takes_the_length_of_the_model_asked_for() -> None:
    models = [
        {"id": "small", "object": "model", "owned_by": "vllm", "max_model_len": 4096},
        {"id": "big", "object": "model", "owned_by": "vllm", "max_model_len": 131072},
    ]
    with FakeOpenAI([], models=models) as server:
        asked = probe_server(server.base_url, None, model="big")
        unnamed = probe_server(server.base_url, None)
        unknown = probe_server(server.base_url, None, model="other")
    assert asked.max_model_len == 131072 and asked.models == ["small", "big"]
    assert unnamed.max_model_len == unknown.max_model_len == 4096  # the first entry


@pytest.mark.parametrize(("vllm", "expected"), [(True, True), (False, False)])
def test_a_model_list_without_owners_is_settled_by_the_version_endpoint(vllm: bool, expected: bool) -> None:
    with FakeOpenAI([], vllm=vllm, models=[{"id": "fake-model", "object": "model"}]) as server:
        info = probe_server(server.base_url, None)
    assert info.vllm is expected
    assert server.gets == ["/v1/models", "/version"]


def test_a_server_that_wants_a_key_is_up_but_unknown() -> None:
    with FakeOpenAI([], vllm=True, api_key="k-1") as server:
        without = probe_server(server.base_url, None)
        with_key = probe_server(server.base_url, "k-1")
    assert without == ServerInfo(vllm=False, max_model_len=None, models=[])
    assert with_key.vllm is True


def test_a_web_site_or_nothing_at_the_address_is_unreachable() -> None:
    with Site() as site:  # answers 404 to /v1/models
        with pytest.raises(ModelUnavailable, match="HTTP 404 from .*/v1/models: not an OpenAI-compatible server"):
            probe_server(site.url("/v1"), None)
    with pytest.raises(ModelUnavailable, match="ConnectError"):
        probe_server(f"http://127.0.0.1:{free_port()}/v1", None)


# ---------------------------------------------------------------- vLLM's fields only for vLLM


async def test_a_strict_server_never_sees_vllm_fields() -> None:
    with FakeOpenAI(["one", "two"], strict=True) as server:
        llm = client(server.base_url)
        assert (await llm.complete(MESSAGES)).message["content"] == "one"
        assert (await llm.complete(MESSAGES)).message["content"] == "two"
        await llm.aclose()
    assert len(server.requests) == 2 and not any(carries_extras(r) for r in server.requests)  # nothing refused
    assert server.gets == ["/v1/models"]  # asked once, remembered


async def test_a_server_claiming_vllm_that_refuses_the_fields_with_422_is_asked_again_without_them() -> None:
    with FakeOpenAI(["one", "two"], vllm=True, strict=True) as server:
        llm = client(server.base_url)
        assert (await llm.complete(MESSAGES)).message["content"] == "one"
        assert (await llm.complete(MESSAGES)).message["content"] == "two"
        await llm.aclose()
    assert [carries_extras(r) for r in server.requests] == [True, False, False]  # dropped for good


async def test_a_pydantic_style_refusal_naming_a_field_in_its_location_also_drops_them() -> None:
    refusal = {
        "detail": [
            {
                "type": "extra_forbidden",
                "loc": ["body", "return_token_ids"],
                "msg": "Extra inputs are not permitted",
                "input": True,
            }
        ]
    }
    with FakeOpenAI([Reply(status=422, body=refusal), "ok"], vllm=True) as server:
        llm = client(server.base_url)
        assert (await llm.complete(MESSAGES)).message["content"] == "ok"
        await llm.aclose()
    assert [carries_extras(r) for r in server.requests] == [True, False]


async def test_tool_calls_refused_by_a_server_without_a_tool_parser_say_how_to_start_it() -> None:
    # vLLM 0.32's answer to a request with tools when it was started without --enable-auto-tool-choice
    refusal = {
        "error": {
            "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    with FakeOpenAI([Reply(status=400, body=refusal)], vllm=True) as server:
        llm = client(server.base_url)
        with pytest.raises(ModelError, match=r"HTTP 400: .*nanbeige serve --dialect tool-call.*--dialect mcp-xml"):
            await llm.complete(MESSAGES, [{"type": "function", "function": {"name": "f", "parameters": {}}}])
        await llm.aclose()


async def test_a_422_about_something_else_is_an_error_with_the_servers_words() -> None:
    refusal = {"detail": [{"type": "missing", "loc": ["body", "messages"], "msg": "Field required"}]}
    with FakeOpenAI([Reply(status=422, body=refusal)], vllm=True) as server:
        llm = client(server.base_url)
        with pytest.raises(ModelError, match=r"HTTP 422: body\.messages: Field required"):
            await llm.complete(MESSAGES)
        await llm.aclose()
    assert len(server.requests) == 1


async def test_concurrent_first_calls_ask_the_server_once() -> None:
    with FakeOpenAI([], default="hi", vllm=True) as server:
        llm = client(server.base_url)
        await asyncio.gather(*(llm.complete(MESSAGES) for _ in range(5)))
        await llm.aclose()
    assert server.gets == ["/v1/models"] and all(carries_extras(r) for r in server.requests)


async def test_what_the_caller_already_knows_is_not_asked_again() -> None:
    with FakeOpenAI(["hi"], vllm=True) as server:
        llm = client(server.base_url, server=ServerInfo(vllm=False, max_model_len=None, models=[]))
        await llm.complete(MESSAGES)
        await llm.aclose()
    assert server.gets == [] and not carries_extras(server.requests[0])


async def test_token_mode_talks_to_completions_without_asking(tmp_path: Path) -> None:
    from tiny_model import make_tiny_model

    from nanbeige.agent.backends.token_mode import TokenModeChat, load_tokenizer

    tokenizer = load_tokenizer(str(make_tiny_model(tmp_path)))[0]
    with FakeOpenAI(["done"], tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]) as server:
        llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message["content"] == "done" and server.gets == []
    assert server.requests[0]["return_token_ids"] is True  # /completions always asks vLLM for ids


# ---------------------------------------------------------------- reply shapes


async def test_content_as_a_list_of_parts_becomes_its_text() -> None:
    parts = [
        {"type": "text", "text": "Paris is "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "the capital."},
    ]
    with FakeOpenAI([Reply(message={"role": "assistant", "content": parts})]) as server:
        llm = client(server.base_url)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message == {"role": "assistant", "content": "Paris is the capital."}


async def test_valid_tool_calls_pass_unchanged() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": {"text": "x"}}},
    ]
    with FakeOpenAI([Reply(message={"role": "assistant", "content": None, "tool_calls": calls})]) as server:
        llm = client(server.base_url)
        completion = await llm.complete(MESSAGES)
        await llm.aclose()
    assert completion.message == {"role": "assistant", "content": "", "tool_calls": calls}


UNUSABLE = [
    ({"content": 42}, "content is a number, not text"),
    ({"content": {"text": "hi"}}, "content is an object, not text"),
    ({"content": "", "tool_calls": {"name": "add"}}, "tool_calls is an object, not a list"),
    ({"content": "", "tool_calls": ["add"]}, r"tool_calls\[0\] is a string, not an object"),
    ({"content": "", "tool_calls": [{"id": "c1", "type": "function"}]}, r"tool_calls\[0\] has no function"),
    (
        {"content": "", "tool_calls": [{"function": {"name": 7, "arguments": "{}"}}]},
        r"tool_calls\[0\]\.function\.name is a number, not a string",
    ),
    (
        {"content": "", "tool_calls": [{"function": {"name": "add", "arguments": [1, 2]}}]},
        r"tool_calls\[0\]\.function\.arguments is a list, not a string or an object",
    ),
]


@pytest.mark.parametrize(("message", "problem"), UNUSABLE)
async def test_an_unusable_reply_is_a_model_error_naming_what_is_wrong(message: dict[str, Any], problem: str) -> None:
    with FakeOpenAI([Reply(message={"role": "assistant"} | message)]) as server:
        llm = client(server.base_url)
        with pytest.raises(ModelError, match=problem):
            await llm.complete(MESSAGES)
        await llm.aclose()


@pytest.mark.parametrize("dialect", ["tool-call", "mcp-xml"])
@pytest.mark.parametrize(("message", "problem"), [UNUSABLE[0], UNUSABLE[3], UNUSABLE[5]])
async def test_an_unusable_reply_ends_the_run_as_a_model_error(
    dialect: str, message: dict[str, Any], problem: str
) -> None:
    with FakeOpenAI([Reply(message={"role": "assistant"} | message)]) as server:
        llm = client(server.base_url)
        trajectory = await run("What is 2+3?", llm, None, AgentConfig(dialect=dialect))
        await llm.aclose()
    assert trajectory.stop_reason == "model_error" and trajectory.turns == []
    assert trajectory.error.startswith("model server sent an unusable reply: ")
    assert len(trajectory.error) < 200 and re.search(problem, trajectory.error)
