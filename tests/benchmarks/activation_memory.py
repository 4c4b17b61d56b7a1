"""Benchmark: the activations the trainer keeps for backward, with and without activation checkpointing,
in Nanbeige4.1-3B's shape (random weights, nothing downloaded), on the CPU.

One row of `--tokens` tokens goes through the trainer's own forward (`token_logprobs`, the model loaded by
`load_model`) and the policy loss; what the forward pass leaves allocated until backward is read as the
growth of the process's resident memory (with every weight paged in first, and every allocation above
64 KiB mapped on its own so that a freed one leaves at once). Models of 1 and `--layers` decoder layers
are measured (the full 32 would not fit in this machine's memory with gradients) and the per-layer cost is
extrapolated to all 32: the layers are identical, so the activations grow linearly with them.

    python tests/benchmarks/activation_memory.py [--tokens 2048] [--layers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_model and the shape

FULL_LAYERS = 32


def resident() -> int:
    """This process's resident memory in bytes (tensors this large are mapped and unmapped whole, so the
    resident size follows the live ones)."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def kept_bytes(folder: Path, checkpointing: bool, tokens: int) -> int:
    """How much memory the forward pass leaves allocated for backward, for one row."""
    import torch

    from nanbeige.trainer.loss import policy_loss, token_logprobs
    from nanbeige.trainer.model import join_world, load_model
    from nanbeige.trainer.train import TrainConfig

    config = TrainConfig(data=[], model=str(folder), out=folder / "out", gradient_checkpointing=checkpointing)
    model, _ = load_model(config, join_world())
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    mask = torch.ones(1, tokens - 1)
    with torch.no_grad():  # weights loaded from a file are mapped: page them all in before measuring
        for parameter in model.parameters():
            parameter.sum()
    before = resident()
    logprobs = token_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], chunk_tokens=4096)
    loss, _ = policy_loss(logprobs, logprobs.detach(), logprobs.detach(), mask, mask, float(mask.sum()))
    kept = resident() - before
    loss.backward()
    return kept


def main() -> None:
    import os

    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
        # every allocation above 64 KiB mapped on its own, so that a freed tensor leaves the resident size at
        # once (glibc would otherwise keep tensors of up to 32 MiB in its heap after they are freed)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    import torch
    import transformers
    from tiny_model import make_tiny_model
    from train_throughput import nanbeige_config

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for layers in (1, args.layers):
            config = nanbeige_config()
            config.num_hidden_layers = layers
            folder = Path(tmp) / f"layers-{layers}"
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
            make_tiny_model(Path(tmp) / "tok")  # the trainer loads a tokenizer with the model: any will do
            transformers.AutoTokenizer.from_pretrained(Path(tmp) / "tok").save_pretrained(folder)
            results[layers] = {on: kept_bytes(folder, on, args.tokens) for on in (False, True)}
    mib = 2**20
    print(f"Nanbeige4.1-3B shape, random weights, float32, one row of {args.tokens} tokens, CPU")
    for on in (False, True):
        per_layer = (results[args.layers][on] - results[1][on]) / (args.layers - 1)
        rest = results[1][on] - per_layer  # embeddings, final norm, LM head chunks, loss
        full = rest + FULL_LAYERS * per_layer
        print(
            f"checkpointing {'on ' if on else 'off'}: {per_layer / mib:8.1f} MiB a layer, {rest / mib:7.1f} MiB "
            f"outside the layers; all {FULL_LAYERS} layers: {full / mib:8.1f} MiB "
            f"({full / args.tokens / 1024:.1f} KiB a token)"
        )


if __name__ == "__main__":
    main()
