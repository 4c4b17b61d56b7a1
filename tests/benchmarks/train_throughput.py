"""Benchmark: the trainer's forward + backward + AdamW step, in tokens/s and peak memory.

Rows of random token ids stand in for judged trajectories (the step's cost does not depend on what
the ids say): `--rows` rows of `--row-tokens` tokens, every other token trained on, advantages ±1,
rollout logprobs present, packed into micro-batches of `--micro-tokens` padded tokens, one optimizer
step over all of them, through the same functions `nanbeige train` runs (`train_step`).

- `--model tiny` (default): the tests' tiny random Llama, on the CPU.
- `--model nanbeige`: a randomly initialised model with Nanbeige4.1-3B's configuration (the shape
  third-party cards give, or the model's own `config.json` with `--config`; nothing is downloaded), in
  bfloat16 on the GPU; with `--lora-rank` the LoRA path. The target is >= 12k tokens/s on one H100
  (about 30% MFU).

    python tests/benchmarks/train_throughput.py [--model tiny] [--steps 3]
    python tests/benchmarks/train_throughput.py --model nanbeige --row-tokens 16384 --rows 4 \\
        --micro-tokens 16384 [--lora-rank 32] [--config config.json]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_model

from nanbeige.trainer.batches import Sample
from nanbeige.trainer.model import World, load_model, parameter_count
from nanbeige.trainer.step import TrainingRun, train_step
from nanbeige.trainer.train import TrainConfig


def random_rows(count: int, length: int, vocab: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [i % 2 for i in range(length)]
        rows.append(
            Sample(
                ids=ids,
                loss_mask=mask,
                advantages=[(1.0 if n % 2 else -1.0) * m for m in mask],
                rollout_logprobs=[-1.0 * m for m in mask],
                group_id="g",
                trajectory_id=f"t{n}",
                turns=[0],
                old_logprobs=[-1.0 * m for m in mask],
            )
        )
    return rows


def model_folder(args: argparse.Namespace, tmp: Path) -> Path:
    if args.model == "tiny":
        from tiny_model import make_tiny_model

        return make_tiny_model(tmp / "tiny")
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(args.config) if args.config else nanbeige_config()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp / "random")
    # the trainer loads a tokenizer with the model: any will do for random ids
    from tiny_model import make_tiny_model

    make_tiny_model(tmp / "tok")
    transformers.AutoTokenizer.from_pretrained(tmp / "tok").save_pretrained(tmp / "random")
    return tmp / "random"


def nanbeige_config():
    """Nanbeige4.1-3B's shape as third-party cards give it (plain Llama; unverified against its own
    config.json, which `--config` takes instead)."""
    import transformers

    return transformers.LlamaConfig(
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
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "nanbeige"], default="tiny")
    parser.add_argument("--config", help="config.json of Nanbeige4.1-3B (with --model nanbeige)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--row-tokens", type=int, default=1024)
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    import torch

    world = World(device="cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args, Path(tmp))
        config = TrainConfig(
            data=[], model=str(folder), out=Path(tmp) / "out", lora_rank=args.lora_rank, micro_tokens=args.micro_tokens
        )
        model, tokenizer = load_model(config, world)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        rows = random_rows(args.rows, args.row_tokens, len(tokenizer))
        run = TrainingRun(config, world, model, optimizer, tokenizer.pad_token_id or 0)
        timings = []
        for _ in range(args.steps):
            if world.device != "cpu":
                torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
            result = train_step(run, rows)
            if world.device != "cpu":
                torch.cuda.synchronize()
            timings.append((time.perf_counter() - began, result.tokens))
    peak = torch.cuda.max_memory_allocated() / 2**30 if world.device != "cpu" else peak_rss_gib()
    seconds, tokens = timings[-1]  # the first steps warm up allocators and kernels
    params = parameter_count(model)
    print(
        f"{args.model}: {params / 1e6:.1f}M parameters, {args.rows} rows x {args.row_tokens} tokens, micro-batches "
        f"of {args.micro_tokens} tokens, LoRA rank {args.lora_rank or 'off'}, {world.device}"
    )
    for n, (s, t) in enumerate(timings, 1):
        print(f"step {n}: {s:.2f} s, {t / s:,.0f} tokens/s")
    mfu = 6 * params * tokens / seconds / 989e12 if world.device != "cpu" else None
    print(
        f"last step: {tokens / seconds:,.0f} tokens/s; peak memory {peak:.2f} GiB "
        f"({'GPU allocated' if world.device != 'cpu' else 'process RSS'})" + (f"; MFU {mfu:.1%}" if mfu else "")
    )


def peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


if __name__ == "__main__":
    main()
