"""Where a training run's numbers go, one record per optimizer step: `metrics.jsonl` (what resume trims and
`nanbeige train report` draws), TensorBoard event files in `tensorboard/` (by default; `tensorboard --logdir
OUT`), and a Weights & Biases run when one is asked for and `wandb` is installed.

Every scalar of a step's record goes to each: `loss`, `grad_norm`, `lr`, `tokens_per_s`, `mfu`, the loss's
metrics under `metrics/` (clip fraction, drifts, entropy, TIS weights, staleness) and the batch of rollouts
under `rollouts/` (reward, pass rate, response and trajectory length), at the step's number.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from nanbeige.trainer.model import TrainError

JSONL = "metrics.jsonl"
TENSORBOARD = "tensorboard"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers, flat: top-level ones by name, nested ones as `group/name`."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat |= {f"{key}/{k}": float(v) for k, v in value.items() if isinstance(v, (int, float))}
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            flat[key] = float(value)
    return flat


class MetricsLog:
    """The open sinks of one run (on the main rank only)."""

    def __init__(
        self,
        out: Path,
        start: int,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = out / JSONL
        self.writer, self.run = None, None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events of the steps a resume does again are dropped, not drawn twice
            self.writer = SummaryWriter(str(out / TENSORBOARD), purge_step=start + 1 if start else None)
        if wandb_project:
            self.run = wandb_run(out, wandb_project, config or {})

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as file:
            file.write(json.dumps(record) + "\n")
        numbers = scalars(record)
        if self.writer is not None:
            for name, value in numbers.items():
                self.writer.add_scalar(name, value, record["step"])
            self.writer.flush()  # a run killed later keeps every step written so far
        if self.run is not None:
            self.run.log(numbers, step=record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.run is not None:
            self.run.finish()


def wandb_run(out: Path, project: str, config: dict[str, Any]) -> Any:
    """A W&B run that a resumed training continues: its id is kept in `out/wandb-id`."""
    try:
        import wandb
    except ImportError:
        raise TrainError("--wandb-project needs the wandb package: pip install wandb") from None
    id_file = out / "wandb-id"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(8)
    id_file.write_text(run_id)
    os.environ.setdefault("WANDB_SILENT", "true")  # its banner would interleave with the step lines
    return wandb.init(project=project, id=run_id, resume="allow", dir=str(out), config=config)
