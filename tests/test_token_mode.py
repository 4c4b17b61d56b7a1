"""Token-exact mode: prompts rendered here with the model's tokenizer and template, sent as token ids to
a loopback server speaking vLLM's `/v1/completions` fields, over a 50-turn run with keep-K rewriting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_test_server
import pytest
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from tiny_model import make_tiny_model

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.token_mode import TokenModeChat, load_tokenizer
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.run.tokens import full_prompt, iter_prompts, rebuild_segments
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

pytestmark = pytest.mark.anyio


async def run_token_mode(tokenizer: Any, turns: int, keep: int, path: Path) -> tuple[Trajectory, list[dict]]:
    replies = [mcp_call("testkit", "echo", {"text": f"finding {i}"}, thought=f"Step {i}.") for i in range(turns)]
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the model answers, then restates its answer for the summary turn
    with FakeOpenAI(
        [*replies, mcp_answer("done"), mcp_answer("done")],
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=stop_id,
    ) as server:
        llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
        writer = TrajectoryWriter(path)
        async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
            trajectory = await run(
                "q",
                llm,
                tools,
                AgentConfig(keep_tool_results=keep, max_turns=turns + 5, max_context=10**6, date="2026-11-21"),
                writer,
            )
        writer.close()
        await llm.aclose()
    return trajectory, server.requests


async def test_every_prompt_sent_is_rebuilt_exactly_from_the_trajectory(tokenizer: Any, tmp_path: Path) -> None:
    trajectory, requests = await run_token_mode(tokenizer, 50, 5, tmp_path / "run.jsonl")
    [saved] = load_trajectories(tmp_path / "run.jsonl")
    assert saved.answer == "done" and len(saved.turns) == len(requests) == 52
    assert all(request["prompt"] == full_prompt(saved.turns, i) for i, request in enumerate(requests))
    assert [turn.completion_ids for turn in saved.turns] == [turn.completion_ids for turn in trajectory.turns]
    segments = rebuild_segments(saved.turns)
    assert len(segments) > 40  # keep-5 rewrites the history: new segments start
    assert sum(len(t.prompt_delta_ids) for t in saved.turns) < sum(len(r["prompt"]) for r in requests) / 4


async def test_within_a_segment_completions_are_extended_verbatim(tokenizer: Any, tmp_path: Path) -> None:
    trajectory, requests = await run_token_mode(tokenizer, 8, -1, tmp_path / "run.jsonl")
    assert {turn.segment for turn in trajectory.turns} == {0}  # nothing rewritten: one segment
    prompts = list(iter_prompts(trajectory.turns))
    for (turn, prompt), (_, next_prompt) in zip(prompts, prompts[1:]):
        assert next_prompt[: len(prompt) + len(turn.completion_ids)] == prompt + turn.completion_ids
    assert len(requests) == 10


async def test_concurrent_runs_over_one_client_and_one_toolbox_stay_independent(tokenizer: Any) -> None:
    import asyncio
    import re

    def sampled_letter_by_letter(text: str) -> list[int]:  # valid ids, but not how the text re-tokenizes
        return [i for char in text for i in tokenizer(char, add_special_tokens=False)["input_ids"]]

    def reply(request: dict[str, Any]) -> str:
        prompt = tokenizer.decode(request["prompt"])
        run_number = re.search(r"question number (\d+)", prompt).group(1)
        step = prompt.count("<|im_start|>assistant") - 1
        if step < 6:
            return mcp_call("testkit", "echo", {"text": f"run {run_number} step {step}"}, thought=f"Step {step}.")
        return mcp_answer(f"answer {run_number}")

    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert sampled_letter_by_letter("<think> step") != tokenizer("<think> step", add_special_tokens=False)["input_ids"]
    with FakeOpenAI(reply, tokenize=sampled_letter_by_letter, stop_id=stop_id) as server:
        llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
        config = AgentConfig(keep_tool_results=-1, max_turns=20, max_context=10**6, date="2026-11-21")
        async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
            trajectories = await asyncio.gather(
                *(run(f"What is question number {k}?", llm, tools, config) for k in range(8))
            )
        await llm.aclose()
    rebuilt = []
    for k, trajectory in enumerate(trajectories):
        assert trajectory.answer == f"answer {k}" and len(trajectory.turns) == 8  # with the summary turn
        assert {turn.segment for turn in trajectory.turns} == {0}  # every prompt extended its own run's verbatim
        assert all(f"run {k} step" in r.text for turn in trajectory.turns for r in turn.tool_results)
        rebuilt += [full_prompt(trajectory.turns, turn.index) for turn in trajectory.turns]
    sent = [request["prompt"] for request in server.requests]
    assert sorted(sent) == sorted(rebuilt)  # every prompt sent is rebuilt exactly from its own trajectory


@pytest.mark.slow
def test_ask_in_token_mode_from_the_command_line(tmp_path: Path) -> None:
    import hashlib
    import json
    import os
    import subprocess
    import sys

    folder = make_tiny_model(tmp_path / "tiny")
    tokenizer = load_tokenizer(str(folder))[0]
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeOpenAI(
        [mcp_answer("5"), mcp_answer("5")],
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=stop_id,
        vllm=True,
    ) as server:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "nanbeige"),
                "ask",
                "What is 2+3?",
                "--token-mode",
                "--base-url",
                server.base_url,
                "--model",
                str(folder),
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "t.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
    assert result.returncode == 0 and result.stdout == "5\n", result.stderr
    request, summary = server.requests
    assert summary["prompt"][: len(request["prompt"])] == request["prompt"]
    start = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    messages = [
        {"role": "system", "content": start["system_prompt"]},
        {"role": "user", "content": start["user_message"]},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert request["prompt"] == tokenizer(text, add_special_tokens=False)["input_ids"]  # token ids, not text
    assert (request["temperature"], request["top_p"], request["repetition_penalty"]) == (1.0, 0.95, 1.05)  # mcp-xml
    # what rendered and tokenized the prompts is recorded, so a trainer can check it uses the same
    assert start["tokenizer"]["name"] == str(folder)
    assert start["tokenizer"]["sha256"] == hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    assert start["chat_template"]["sha256"] == hashlib.sha256(tokenizer.chat_template.encode()).hexdigest()


def served(tokenizer: Any, root: str | None) -> FakeOpenAI:
    """A vLLM server of the tiny model under the name `tiny-served`, its /v1/models listing `root` as the folder (or
    no root)."""
    entry = {"id": "tiny-served", "object": "model", "owned_by": "vllm", "max_model_len": 32768} | (
        {"root": root} if root else {}
    )
    return FakeOpenAI(
        [],
        default="5",
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        vllm=True,
        models=[entry],
    )


@pytest.mark.slow
def test_token_mode_finds_the_tokenizer_at_the_root_the_server_lists_or_takes_one_named(tmp_path: Path) -> None:
    """Seen against real vLLM: a model served under a name (`tiny-served` here) is no tokenizer path, and its
    folder is no served name (HTTP 404). vLLM's /v1/models lists the folder as the model's `root`."""
    import os
    import subprocess
    import sys

    folder = make_tiny_model(tmp_path / "tiny")
    tokenizer = load_tokenizer(str(folder))[0]
    command = [
        str(Path(sys.executable).parent / "nanbeige"),
        "ask",
        "What is 2+3?",
        "--token-mode",
        "--model",
        "tiny-served",
        "--no-default-servers",
        "--dialect",
        "tool-call",
    ]
    env = {**os.environ, "COLUMNS": "200"}

    with served(tokenizer, str(folder)) as server:
        listed = subprocess.run(
            [*command, "--base-url", server.base_url, "--trajectory", str(tmp_path / "a.jsonl")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert listed.returncode == 0 and listed.stdout == "5\n", listed.stderr
    assert server.requests[0]["model"] == "tiny-served" and isinstance(server.requests[0]["prompt"], list)
    with served(tokenizer, None) as server:
        named = subprocess.run(
            [
                *command,
                "--base-url",
                server.base_url,
                "--tokenizer",
                str(folder),
                "--trajectory",
                str(tmp_path / "b.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        # offline, as tests are: without it the hub client waits out its connection retries first (50 s here)
        missing = subprocess.run(
            [*command, "--base-url", server.base_url, "--trajectory", str(tmp_path / "c.jsonl")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env | {"HF_HUB_OFFLINE": "1"},
        )
    assert named.returncode == 0 and named.stdout == "5\n", named.stderr
    assert missing.returncode != 0 and "Traceback" not in missing.stderr and "--tokenizer" in missing.stderr


def test_the_prompt_echo_is_dropped_before_parsing_and_nothing_else() -> None:
    import orjson

    from nanbeige.agent.backends.token_mode import _drop_prompt_echo

    text = 'he wrote {"prompt_token_ids": [1, 2]} here'
    body = orjson.dumps({"choices": [{"text": text, "token_ids": [5, 6], "prompt_token_ids": list(range(9000))}]})
    parsed = orjson.loads(_drop_prompt_echo(body))
    assert parsed["choices"][0] == {"text": text, "token_ids": [5, 6], "prompt_token_ids": None}
    spaced = b'{"choices": [{"prompt_token_ids": [1, 2], "text": "x"}]}'
    assert orjson.loads(_drop_prompt_echo(spaced))["choices"][0] == {"prompt_token_ids": None, "text": "x"}
    for untouched in (b'{"choices": [{"prompt_token_ids": null, "text": "[1]"}]}', b'{"choices": []}'):
        assert _drop_prompt_echo(untouched) == untouched


GOLDEN = Path(__file__).parent / "golden"


async def test_a_response_as_vllm_serializes_it_is_read_exactly(tokenizer: Any, monkeypatch: Any) -> None:
    """`golden/vllm_completion.json` was serialized by vLLM 0.33.0's own `CompletionResponse` model,
    as its server sends it (compact JSON, `token_ids` and `prompt_token_ids` in the choice). Its ids are
    Nanbeige's, not the tiny tokenizer's: here they read as the file's own `logprobs.tokens` spell them, in
    a vocabulary as large as Nanbeige's, 166101 (`<|im_end|>`, left out of the text) the stop token, so that
    the ids are checked against the text."""
    import httpx
    import orjson

    body = (GOLDEN / "vllm_completion.json").read_bytes()
    golden = orjson.loads(body)["choices"][0]
    spelling, decode = dict(zip(golden["token_ids"], golden["logprobs"]["tokens"])), tokenizer.decode
    monkeypatch.setattr(
        tokenizer,
        "decode",
        lambda ids, **options: "".join(map(spelling.get, ids)) if set(ids) <= set(spelling) else decode(ids, **options),
    )
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    llm = TokenModeChat(LLMConfig(base_url="http://vllm.invalid/v1", model="m"), tokenizer, transport=transport)
    llm.stop_ids = [*llm.stop_ids, 166101]
    monkeypatch.setattr(type(tokenizer), "__len__", lambda self: 166144)
    completion = await llm.complete([{"role": "user", "content": "capital of France?"}])
    await llm.aclose()
    assert completion.completion_ids == [11, 12, 166101]
    assert completion.logprobs == [-0.25, -1.5, -0.125]
    assert completion.message["content"] == 'Paris {"prompt_token_ids":[9]}'  # the echo cut did not touch it
    assert completion.prompt_ids == llm.prompter.prompt_ids([{"role": "user", "content": "capital of France?"}])


async def test_a_rolled_back_reply_is_sampled_again_from_the_very_same_prompt_ids(tokenizer: Any) -> None:
    def sampled_letter_by_letter(text: str) -> list[int]:  # valid ids, but not how the text re-tokenizes
        return [i for char in text for i in tokenizer(char, add_special_tokens=False)["input_ids"]]

    broken = "<use_mcp_tool>\n<server_name>testkit</server_name>\n</use_mcp_tool>"
    replies = [mcp_call("testkit", "echo", {"text": "found"}), broken, broken, mcp_answer("5"), mcp_answer("5")]
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeOpenAI(replies, tokenize=sampled_letter_by_letter, stop_id=stop_id) as server:
        llm = TokenModeChat(LLMConfig(base_url=server.base_url, model="tiny"), tokenizer)
        async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
            trajectory = await run("q", llm, tools, AgentConfig(max_context=10**6, date="2026-11-21"))
        await llm.aclose()
    assert [turn.rolled_back for turn in trajectory.turns] == [False, True, True, False, False]
    prompts = [request["prompt"] for request in server.requests]
    assert prompts[1] == prompts[2] == prompts[3]  # the same ids each time, not a re-tokenization
    first = trajectory.turns[0]
    assert prompts[1][: len(prompts[0]) + len(first.completion_ids)] == prompts[0] + first.completion_ids  # verbatim
    assert trajectory.answer == "5"


@pytest.mark.slow
def test_token_mode_renders_with_the_deep_search_template_beside_the_weights(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from tiny_model import CHAT_TEMPLATE

    folder = make_tiny_model(tmp_path / "tiny")
    (folder / "tokenizer_config_search.json").write_text(json.dumps({"chat_template": "SEARCH " + CHAT_TEMPLATE}))
    tokenizer = load_tokenizer(str(folder))[0]
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeOpenAI(
        [],
        default=mcp_answer("5"),
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=stop_id,
        vllm=True,
    ) as server:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "nanbeige"),
                "ask",
                "q",
                "--token-mode",
                "--base-url",
                server.base_url,
                "--model",
                str(folder),
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "t.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
    assert result.returncode == 0, result.stderr
    assert tokenizer.decode(server.requests[0]["prompt"]).startswith("SEARCH ")
    start = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert start["chat_template"]["name"] == "tokenizer_config_search.json"
