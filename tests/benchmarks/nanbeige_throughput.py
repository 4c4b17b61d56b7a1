"""Benchmark: generation throughput for a randomly initialised model with Nanbeige4.1-3B's exact
architecture (speed depends on the architecture, not on the weights), in-process (transformers)
and, with --vllm on a GPU machine, through vLLM's offline engine from the same checkpoint.

    python tests/benchmarks/nanbeige_throughput.py                  # the full 3.9B shape (GPU advised)
    python tests/benchmarks/nanbeige_throughput.py --layers 2       # a quick check of the code path on CPU
    python tests/benchmarks/nanbeige_throughput.py --vllm --batch 32

Token-id prompts only: no tokenizer is needed (vLLM runs with skip_tokenizer_init). The in-process
path has been run (on CPU, with fewer layers); the --vllm path has not yet been run on a GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

# Nanbeige4.1-3B (a plain Llama): third-party config values, see the project's reference notes.
CONFIG = dict(
    vocab_size=166_144,
    hidden_size=2560,
    intermediate_size=10_496,
    num_hidden_layers=32,
    num_attention_heads=20,
    num_key_value_heads=4,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=70_000_000.0,
    max_position_embeddings=262_144,
    tie_word_embeddings=False,
    bos_token_id=166_100,
    eos_token_id=166_101,
)


def build(folder: Path, layers: int) -> tuple[object, str]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = LlamaConfig(**(CONFIG | {"num_hidden_layers": layers}))
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    model.save_pretrained(folder)
    print(
        f"random model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {layers} layers, "
        f"{device}, {dtype}"
    )
    return model, device


def in_process(model: object, device: str, prompt_len: int, new_tokens: int, batch: int) -> float:
    import torch

    prompt = torch.randint(0, CONFIG["vocab_size"] - 100, (batch, prompt_len), device=device)
    with torch.inference_mode():
        model.generate(prompt[:, :16], max_new_tokens=4, do_sample=False)  # warm-up
        started = time.perf_counter()
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            top_k=0,
            top_p=0.95,
            temperature=0.6,
        )
        elapsed = time.perf_counter() - started
    return (out.shape[1] - prompt_len) * batch / elapsed


def with_vllm(folder: Path, prompt_len: int, new_tokens: int, batch: int) -> float:
    import random

    from vllm import LLM, SamplingParams, TokensPrompt

    engine = LLM(model=str(folder), skip_tokenizer_init=True, max_model_len=prompt_len + new_tokens + 16)
    params = SamplingParams(temperature=0.6, top_p=0.95, max_tokens=new_tokens, min_tokens=new_tokens, detokenize=False)
    prompts = [
        TokensPrompt(prompt_token_ids=[random.randrange(CONFIG["vocab_size"] - 100) for _ in range(prompt_len)])
        for _ in range(batch)
    ]
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - started
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=256, help="generated tokens per sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vllm", action="store_true", help="also measure vLLM (GPU machines)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, device = build(Path(tmp), args.layers)
        rate = in_process(model, device, args.prompt, args.tokens, args.batch)
        print(
            f"in-process (transformers generate): {rate:.1f} generated tokens/s "
            f"(batch {args.batch}, prompt {args.prompt}, {args.tokens} new)"
        )
        if args.vllm:
            del model
            import torch

            torch.cuda.empty_cache()  # vLLM sizes its cache from the GPU memory free when it starts
            rate = with_vllm(Path(tmp), args.prompt, args.tokens, args.batch)
            print(f"vLLM offline engine: {rate:.1f} generated tokens/s (batch {args.batch})")


if __name__ == "__main__":
    main()
