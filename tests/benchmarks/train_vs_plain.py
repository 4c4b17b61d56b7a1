"""Benchmark: one GRPO training step of `nanbeige train` side by side with a plain PyTorch loop, and with
TRL's trainer where TRL is installed, on the same model, rows and micro-batch budget, in one run.

- The model: SmolLM2-135M's shape with random weights (`--model smollm2`, float32 on the CPU), or the
  tests' tiny Llama (`--model tiny`). Nothing is downloaded.
- The rows: `--rows` rows of random ids, lengths spread evenly between `--min-tokens` and `--max-tokens`
  (trajectory segments differ in length), the second half of each row trained on (advantages ±1).
- nanbeige: `trainer.step.train_step`, padded micro-batches (the default without flash attention) and
  packed rows.
- plain: the loop anyone would write first: right-padded micro-batches of the same budget, the model's
  full logits, log_softmax gathered at the targets, the same policy loss (PPO clip against fixed old
  logprobs, token mean), backward, AdamW.
- TRL: `GRPOTrainer` generates its own completions, so what is timed is TRL's `SFTTrainer` training step on
  the same rows, padded as its default collator does: its forward, loss, backward and optimizer.

Activation checkpointing is off for the comparison (a plain loop has none); nanbeige's default (on) is
timed too. tokens/s counts real tokens (not padding), the median of `--steps` steps after a warm-up.

    python tests/benchmarks/train_vs_plain.py [--model smollm2] [--rows 16] [--steps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_model


def rows_of(count: int, shortest: int, longest: int, vocab: int) -> list:
    from nanbeige.trainer.batches import Sample

    rng = random.Random(0)
    rows = []
    for n in range(count):
        length = shortest + (longest - shortest) * n // max(1, count - 1)
        ids = [rng.randrange(1, vocab) for _ in range(length)]
        mask = [int(i >= length // 2) for i in range(length)]
        sign = 1.0 if n % 2 else -1.0
        rows.append(
            Sample(
                ids=ids,
                loss_mask=mask,
                advantages=[sign * m for m in mask],
                rollout_logprobs=[-9.0 * m for m in mask],
                old_logprobs=[-9.0 * m for m in mask],
                group_id="g",
                trajectory_id=f"t{n}",
                turns=[0],
            )
        )
    rng.shuffle(rows)
    return rows


def model_folder(name: str, tmp: Path) -> Path:
    import transformers
    from tiny_model import make_tiny_model

    tokenizer_folder = make_tiny_model(tmp / "tiny")
    if name == "tiny":
        return tokenizer_folder
    config = transformers.LlamaConfig(  # SmolLM2-135M's shape
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        rope_theta=100_000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp / "smollm2")
    transformers.AutoTokenizer.from_pretrained(tokenizer_folder).save_pretrained(tmp / "smollm2")
    return tmp / "smollm2"


def timed(step: object, steps: int, tokens: int) -> float:
    """Median tokens/s over `steps` calls after one warm-up call."""
    step()  # type: ignore[operator]
    rates = []
    for _ in range(steps):
        began = time.perf_counter()
        step()  # type: ignore[operator]
        rates.append(tokens / (time.perf_counter() - began))
    return statistics.median(rates)


def nanbeige_step(folder: Path, rows: list, micro_tokens: int, packing: bool, checkpointing: bool) -> object:
    import torch

    from nanbeige.trainer.model import World, load_model
    from nanbeige.trainer.step import TrainingRun, train_step
    from nanbeige.trainer.train import TrainConfig

    config = TrainConfig(
        data=[],
        model=str(folder),
        out=folder / "out",
        micro_tokens=micro_tokens,
        packing="on" if packing else "off",
        gradient_checkpointing=checkpointing,
        tensorboard=False,
    )
    torch.manual_seed(0)
    model, tokenizer = load_model(config, World())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    run = TrainingRun(config, World(), model, optimizer, tokenizer.pad_token_id or 0)
    return lambda: train_step(run, rows)


def plain_step(folder: Path, rows: list, micro_tokens: int) -> object:
    """The straightforward loop: padded micro-batches, full logits, the same loss."""
    import torch
    import transformers

    from nanbeige.trainer.packing import collate, pack

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batches = [collate(batch, 0) for batch in pack(rows, micro_tokens)]
    total = sum(sum(r.loss_mask) for r in rows)

    def step() -> None:
        for t in batches:
            logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits[:, :-1].float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, t["targets"][..., None]).squeeze(-1)
            ratio = torch.exp(logprobs - t["old_logprobs"])
            surrogate = torch.maximum(-t["advantages"] * ratio, -t["advantages"] * ratio.clamp(0.8, 1.28))
            ((surrogate * t["loss_mask"]).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def trl_step(folder: Path, rows: list, micro_tokens: int, tmp: Path) -> object | None:
    try:
        import datasets
        from trl import SFTConfig, SFTTrainer
    except ImportError:
        return None
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    data = datasets.Dataset.from_list([{"input_ids": r.ids, "completion_mask": r.loss_mask} for r in rows])
    args = SFTConfig(
        output_dir=str(tmp / "trl"),
        per_device_train_batch_size=len(rows),
        max_length=None,
        completion_only_loss=True,
        report_to=[],
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        learning_rate=1e-6,
        max_steps=10_000,
        logging_strategy="no",
        save_strategy="no",
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=data, processing_class=transformers.AutoTokenizer.from_pretrained(folder)
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's own loop sets before each step
    batch = trainer.data_collator([data[i] for i in range(len(rows))])

    def step() -> None:
        trainer.training_step(model, batch)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        import transformers

        vocab = transformers.AutoConfig.from_pretrained(folder).vocab_size
        rows = rows_of(args.rows, args.min_tokens, args.max_tokens, vocab)
        tokens = sum(len(r.ids) for r in rows)
        print(
            f"{args.model}: {args.rows} rows of {args.min_tokens}-{args.max_tokens} tokens ({tokens} in all), "
            f"micro-batches of {args.micro_tokens} tokens, float32, CPU, {torch.get_num_threads()} threads"
        )
        results = {
            "plain PyTorch loop (padded, full logits)": timed(
                plain_step(folder, rows, args.micro_tokens), args.steps, tokens
            ),
            "nanbeige, padded": timed(nanbeige_step(folder, rows, args.micro_tokens, False, False), args.steps, tokens),
            "nanbeige, packed": timed(nanbeige_step(folder, rows, args.micro_tokens, True, False), args.steps, tokens),
            "nanbeige, padded, checkpointing (CPU default)": timed(
                nanbeige_step(folder, rows, args.micro_tokens, False, True), args.steps, tokens
            ),
        }
        trl = trl_step(folder, rows, args.micro_tokens, Path(tmp))
        if trl is not None:
            results["TRL SFTTrainer training step (padded)"] = timed(trl, args.steps, tokens)
    plain = results["plain PyTorch loop (padded, full logits)"]
    for name, rate in results.items():
        print(f"{name:45s} {rate:9,.0f} tokens/s  {rate / plain:5.2f}x the plain loop")
    if trl is None:
        print("TRL is not installed here: pip install trl datasets to time its trainer too")


if __name__ == "__main__":
    main()
