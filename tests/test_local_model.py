"""The in-process backend on a tiny random Llama model: token-exact records, processed logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import make_tiny_model

from nanbeige.agent.backends.in_process import TransformersLLM
from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.local_model import LocalModelError
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.run.tokens import full_prompt

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


async def test_a_reply_carries_prompt_ids_completion_ids_and_logprobs(tiny: Path) -> None:
    llm = TransformersLLM(LLMConfig(model=str(tiny), temperature=0.7, top_p=1.0, max_tokens=12))
    completion = await llm.complete(MESSAGES)
    text = llm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert completion.prompt_ids == llm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert 1 <= len(completion.completion_ids) <= 12
    assert len(completion.logprobs) == len(completion.completion_ids)
    assert completion.usage == {
        "prompt_tokens": len(completion.prompt_ids),
        "completion_tokens": len(completion.completion_ids),
    }
    assert completion.finish_reason in ("stop", "length")


async def test_logprobs_are_those_of_the_processed_distribution(tiny: Path) -> None:
    import torch

    llm = TransformersLLM(LLMConfig(model=str(tiny), temperature=0.7, top_p=1.0, repetition_penalty=1.0, max_tokens=8))
    completion = await llm.complete(MESSAGES)
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.inference_mode():
        logits = llm.model(ids).logits[0]  # (T, vocab)
    start = len(completion.prompt_ids)
    expected = torch.log_softmax(logits[start - 1 : -1] / 0.7, dim=-1)  # (completion, vocab): temperature applied
    for position, (token, logprob) in enumerate(zip(completion.completion_ids, completion.logprobs)):
        assert logprob == pytest.approx(expected[position, token].item(), abs=1e-4)


async def test_the_repetition_penalty_applies_to_every_token_seen_before_temperature(tiny: Path) -> None:
    import torch

    llm = TransformersLLM(LLMConfig(model=str(tiny), temperature=0.7, top_p=1.0, repetition_penalty=1.3, max_tokens=8))
    completion = await llm.complete(MESSAGES)
    sequence = completion.prompt_ids + completion.completion_ids
    with torch.inference_mode():
        logits = llm.model(torch.tensor([sequence])).logits[0]  # (T, vocab)
    start = len(completion.prompt_ids)
    for position, (token, logprob) in enumerate(zip(completion.completion_ids, completion.logprobs)):
        row = logits[start - 1 + position].clone()  # (vocab,)
        seen = torch.tensor(sorted(set(sequence[: start + position])))  # prompt and reply so far, as vLLM counts
        row[seen] = torch.where(row[seen] > 0, row[seen] / 1.3, row[seen] * 1.3)
        assert logprob == pytest.approx(torch.log_softmax(row / 0.7, dim=-1)[token].item(), abs=1e-4)


async def test_greedy_decoding_is_deterministic(tiny: Path) -> None:
    llm = TransformersLLM(LLMConfig(model=str(tiny), temperature=0.0, max_tokens=10))
    first, second = await llm.complete(MESSAGES), await llm.complete(MESSAGES)
    assert first.completion_ids == second.completion_ids and first.message == second.message


async def test_the_loop_records_every_prompt_exactly_and_extends_completions_verbatim(tiny: Path) -> None:
    class Recording(TransformersLLM):
        async def complete(self, messages, tools=None, max_tokens=None, conversation=None):  # noqa: ANN001, ANN201
            completion = await super().complete(messages, tools, max_tokens, conversation)
            self.sent.append((list(messages), completion.prompt_ids))
            return completion

    llm = Recording(LLMConfig(model=str(tiny), temperature=1.0, max_tokens=16))
    llm.sent = []
    # a random model's replies are unusable: kept (rollback off) they extend the conversation turn by turn
    trajectory = await run(
        "What is 2+3?",
        llm,
        None,
        AgentConfig(max_turns=4, max_context=8192, keep_tool_results=-1, rollback=False, summary_turn=False),
    )
    assert len(trajectory.turns) == len(llm.sent) >= 3
    for turn, (messages, prompt_ids) in zip(trajectory.turns, llm.sent):
        assert full_prompt(trajectory.turns, turn.index) == prompt_ids
        assert len(turn.logprobs) == len(turn.completion_ids)
        # the model saw what it sampled, not a re-tokenization of its decoded text
        previous = trajectory.turns[turn.index - 1] if turn.index else None
        if previous is not None:
            assert (
                prompt_ids[: previous.prompt_keep + len(previous.prompt_delta_ids) + len(previous.completion_ids)]
                == full_prompt(trajectory.turns, previous.index) + previous.completion_ids
            )
    assert {turn.segment for turn in trajectory.turns} == {0}  # nothing rewritten: one segment
    text = llm.tokenizer.decode(llm.sent[-1][1], skip_special_tokens=False)
    assert text == llm.tokenizer.apply_chat_template(llm.sent[-1][0], add_generation_prompt=True, tokenize=False)


def test_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalModelError, match="cannot load the folder"):
        TransformersLLM(LLMConfig(model=str(tmp_path)))


@pytest.mark.slow
def test_ask_runs_the_model_in_process_end_to_end(tiny: Path, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "run.jsonl"
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "nanbeige"),
            "ask",
            "What is 2+3?",
            "--backend",
            "transformers",
            "--model",
            str(tiny),
            "--no-default-servers",
            "--max-turns",
            "2",
            "--max-tokens",
            "24",
            "--max-context",
            "8192",
            "--trajectory",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "Traceback" not in result.stderr
    # lines end at "\n" only: a random model's text may hold U+2028 or U+0085, which str.splitlines also
    # takes for line ends (JSON leaves them unescaped)
    records = [json.loads(line) for line in path.read_text().split("\n") if line]
    turns = [r for r in records if r["type"] == "turn"]
    assert records[-1]["type"] == "end" and records[-1]["stop_reason"] in ("max_turns", "answered", "format_errors")
    assert turns and all(len(t["completion_ids"]) == len(t["logprobs"]) > 0 for t in turns)
    assert turns[0]["prompt_keep"] == 0 and turns[0]["segment"] == 0


@pytest.mark.slow
def test_auto_backend_falls_back_to_the_in_process_model_only_without_an_explicit_server(
    tiny: Path, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    nanbeige = str(Path(sys.executable).parent / "nanbeige")
    env = {k: v for k, v in os.environ.items() if k != "NANBEIGE_BASE_URL"} | {"COLUMNS": "200"}
    args = [
        "ask",
        "q",
        "--model",
        str(tiny),
        "--no-default-servers",
        "--max-turns",
        "1",
        "--max-tokens",
        "8",
        "--max-context",
        "8192",
        "--trajectory",
        str(tmp_path / "t.jsonl"),
    ]
    fallback = subprocess.run(
        [nanbeige, *args, "--base-url", "http://127.0.0.1:9/v1"], capture_output=True, text=True, timeout=120, env=env
    )
    assert fallback.returncode == 1 and "cannot reach the model server" in fallback.stderr  # named: no fallback
    embedded = subprocess.run([nanbeige, *args], capture_output=True, text=True, timeout=120, env=env)
    assert "running" in embedded.stderr and "in this process" in embedded.stderr, embedded.stderr


async def test_with_the_models_tokenizer_no_request_can_overflow_the_context(tiny: Path) -> None:
    class Recording(TransformersLLM):
        async def complete(self, messages, tools=None, max_tokens=None, conversation=None):  # noqa: ANN001, ANN201
            self.requests.append(
                (len(self.prompter.prompt_ids(messages, tools, conversation)), max_tokens or self.config.max_tokens)
            )
            return await super().complete(messages, tools, max_tokens, conversation)

    llm = Recording(LLMConfig(model=str(tiny), temperature=1.0, max_tokens=48))
    llm.requests = []
    # no reserve: only an exact count keeps every request inside the context
    config = AgentConfig(
        max_turns=50, max_context=3000, context_reserve=0, keep_tool_results=-1, max_format_errors=100, rollback=False
    )  # a random model never gets the format right
    trajectory = await run("What is 2+3? " * 10, llm, None, config)
    assert trajectory.stop_reason == "context_limit"
    for prompt_tokens, max_tokens in llm.requests:
        assert prompt_tokens + max_tokens <= 3000  # the final-answer turn came before an overflow, never after


async def test_a_cancelled_generation_stops_at_the_next_token(tiny: Path) -> None:
    import asyncio
    import threading
    import time

    llm = TransformersLLM(LLMConfig(model=str(tiny), temperature=0.0, max_tokens=6000))
    llm.stop_ids = [0]  # `<unk>`, which this model never picks: the reply could only end at 6000 tokens
    ended = threading.Event()
    generate = llm._generate

    def watched(*args):  # noqa: ANN002, ANN202
        try:
            return generate(*args)
        finally:
            ended.set()

    llm._generate = watched
    steps = 0  # the model's forward passes: one a token
    forward = llm.model.forward

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        nonlocal steps
        steps += 1
        return forward(*args, **kwargs)

    llm.model.forward = counted
    task = asyncio.create_task(llm.complete(MESSAGES))
    deadline = time.monotonic() + 120  # only against a hang: tokens come in milliseconds
    while steps < 20 and not ended.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert steps >= 20 and not ended.is_set()  # generating, far from its 6000 tokens
    task.cancel()  # Ctrl-C, SIGTERM or a run's timeout
    with pytest.raises(asyncio.CancelledError):
        await task
    # complete() has told the generation to stop before the CancelledError reached here: counted in
    # tokens from now on, which a busy machine does not change (it only makes each take longer)
    told = steps
    assert await asyncio.to_thread(ended.wait, 120)  # only against a hang, as above
    assert steps - told <= 1  # stopped at the next token, not after 6000
