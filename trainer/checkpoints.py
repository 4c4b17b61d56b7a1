"""The trainer's checkpoints: `out/checkpoint-STEP/`, each a Hugging Face model that vLLM and the in-process
backend load, plus each rank's optimizer state for a resume.

With LoRA the folder holds the merged model and, in `adapter/`, the adapter alone (what a server hot-loads).
Under torchrun the weights are gathered from the ranks' shards; with LoRA only the adapter is gathered (the
frozen base is read again from its source), so saving never needs a full copy of the model on one rank.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.evals.files import first_link
from nanbeige.tools import handed_over
from nanbeige.tools.handed_over import HandedOverError
from nanbeige.trainer.model import TrainError

if TYPE_CHECKING:
    from nanbeige.trainer.model import World
    from nanbeige.trainer.train_config import TrainConfig

COMPLETE = "checkpoint-complete.json"
"""Written last, once every rank's trainer state is in place: a folder without it was cut short."""
MAX_METRICS_BYTES = 1024**3
"""`metrics.jsonl`: a line of about a kilobyte a step."""
MAX_STATE_BYTES = 1024**4
"""A rank's trainer state is its share of the optimizer's two moments (8 bytes a trained parameter): a TiB
holds any this trainer writes, and keeps a sparse file of petabytes from being read."""


def save_checkpoint(model: Any, tokenizer: Any, optimizer: Any, step: int, config: TrainConfig, world: World) -> Path:
    """Write `out/checkpoint-STEP/` (every rank must call it) and return the folder."""
    import torch

    folder = config.out / f"checkpoint-{step}"
    state = gathered_state(model, world, trainable_only=bool(config.lora_rank))
    if world.main:
        folder.mkdir(parents=True, exist_ok=True)
        if config.lora_rank:
            save_lora(model, state, config, folder)
        else:
            model.save_pretrained(folder, state_dict=state)
        tokenizer.save_pretrained(folder)
        search_template = Path(config.model) / "tokenizer_config_search.json"
        if search_template.is_file():  # so that serve and token mode find the deep-search template here too
            (folder / search_template.name).write_bytes(search_template.read_bytes())
    barrier(world)
    # Each state file is written under another name and renamed, so that a kill mid-write leaves none a
    # resume would take for a whole one; the marker, written once every rank's file is in place, is what
    # says the checkpoint is whole (`latest_checkpoint`): a kill between two ranks' files leaves none.
    state_file = folder / f"trainer-state-rank{world.rank}.pt"
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "step": step,
            "world_size": world.size,
            "config": json.loads(json.dumps(asdict(config), default=str)),
        },
        f"{state_file}.tmp",
    )
    os.replace(f"{state_file}.tmp", state_file)
    barrier(world)
    if world.main:
        (folder / f"{COMPLETE}.tmp").write_text(json.dumps({"step": step, "world_size": world.size}))
        os.replace(folder / f"{COMPLETE}.tmp", folder / COMPLETE)
    barrier(world)
    return folder


def read_trainer_state(path: Path) -> dict[str, Any]:
    """A rank's trainer state as `save_checkpoint` wrote it: tensors, numbers, text, lists and dicts only.
    The file may come from a folder someone handed over (`--resume`, a loop folder, a loop's policy), so it is
    never unpickled with anything else: a pickle that names a function or class is refused, not run."""
    import torch

    fix = "remove that checkpoint folder to resume from the one before"
    try:
        with handed_over.open_file(path, MAX_STATE_BYTES, inside=path.parent) as file:  # no link, no FIFO
            saved = torch.load(file, map_location="cpu", weights_only=True)
    except HandedOverError as exc:
        raise TrainError(f"{exc}; {fix}") from None
    except pickle.UnpicklingError:  # what weights_only says of a pickle that names code
        raise TrainError(
            f"{path} holds more than tensors and plain values (a pickle that could run code): refused, never "
            f"unpickled; {fix}"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:  # torn, or not a state file at all
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainError(f"cannot read {path} ({said}): {fix}") from None
    shape = isinstance(saved, dict) and isinstance(saved.get("config"), dict)
    if not shape or not isinstance(saved.get("optimizer"), dict):
        raise TrainError(f"cannot read {path}: not a trainer state; {fix}")
    return saved


def gathered_state(model: Any, world: World, trainable_only: bool) -> dict[str, Any] | None:
    """The full (unsharded) state dict on the CPU of every rank, or None in one process (the model's own
    state is full there). Every rank takes part in the gather."""
    if world.size == 1:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_model_state_dict(model, options=options)


def save_lora(model: Any, state: dict[str, Any] | None, config: TrainConfig, folder: Path) -> None:
    """The adapter in `folder/adapter` and the merged model in `folder`, built on a fresh CPU copy of the
    base model: the trained one may be sharded or on a GPU, and merging must not touch it."""
    import peft
    import transformers

    from nanbeige.trainer.model import quiet_peft

    adapter = peft.get_peft_model_state_dict(model, state_dict=state)
    base = transformers.AutoModelForCausalLM.from_pretrained(config.model, dtype=model.dtype)
    with quiet_peft():
        fresh = peft.get_peft_model(base, copy.deepcopy(model.peft_config["default"]))
    peft.set_peft_model_state_dict(fresh, adapter)
    fresh.save_pretrained(folder / "adapter")
    fresh.merge_and_unload().save_pretrained(folder)


def barrier(world: World) -> None:
    if world.size > 1:
        import torch.distributed as dist

        dist.barrier()


def refuse_links(out: Path) -> None:
    """An out folder to resume may be someone else's: a symbolic link in it would lead what a resume reads
    (a trainer state, metrics) or writes (checkpoints, metrics) to a file outside it. A folder holding one is
    refused before anything is read or written."""
    link = first_link(out) if out.is_dir() else None
    if link is not None:
        raise TrainError(
            f"{link} is a symbolic link: a run's files are read and written only inside its folder {out}; "
            "remove the link, or pass another --out"
        )


def latest_checkpoint(out: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint in `out` (its marker and every rank's trainer state written), and its step."""
    found = []
    for folder in out.glob("checkpoint-*"):
        step = folder.name.removeprefix("checkpoint-")
        if step.isdigit() and complete(folder):
            found.append((int(step), folder))
    if not found:
        return None
    step, folder = max(found)
    return folder, step


def complete(folder: Path) -> bool:
    """Whether a checkpoint folder was written whole: its marker names how many ranks saved, and each
    rank's state file is there (a folder someone handed us is read, never trusted)."""
    try:
        marker = handed_over.read_json_object(folder / COMPLETE, 4096, inside=folder)
    except (OSError, ValueError):  # HandedOverError is a ValueError: a link, a FIFO, not a JSON object
        return False
    size = marker.get("world_size") if isinstance(marker, dict) else None
    if type(size) is not int or not 1 <= size <= 65536:
        return False
    return all((folder / f"trainer-state-rank{rank}.pt").is_file() for rank in range(size))


def drop_metrics_after(path: Path, step: int) -> None:
    """Cut `metrics.jsonl` back to the resumed checkpoint's step: the steps after it are done again."""
    if not path.exists() and not path.is_symlink():
        return
    try:  # a link planted in a handed-over out folder would have the cut written to its target
        text = handed_over.read_bytes(path, MAX_METRICS_BYTES, inside=path.parent).decode(errors="replace")
    except (OSError, HandedOverError) as exc:
        raise TrainError(f"cannot resume: {exc}; remove it or pass another --out") from None
    lines = [line for line in text.splitlines() if line.strip()]
    kept = [line for line in lines if _step_of(line) <= step]
    if len(kept) != len(lines):
        path.write_text("".join(line + "\n" for line in kept))


def _step_of(line: str) -> float:
    """A metrics line's step; a line that is not a step record (torn by a kill) counts as past every step,
    so it is dropped with the steps done again."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return float("inf")
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else float("inf")
