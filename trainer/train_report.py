"""`nanbeige train report RUN_DIR`: a training run's curves as PNG plots a person can look at.

RUN_DIR is a `train --out` folder (its `metrics.jsonl`) or a `nanbeige loop` folder, whose iterations'
`iter-N/train/metrics.jsonl` are drawn one after another, so a curve runs over the whole loop. Each panel
is one quantity against the optimizer step; a quantity no step recorded is left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nanbeige.tools import handed_over
from nanbeige.tools.errors import NanbeigeError

MAX_METRICS_BYTES = 256 * handed_over.MIB  # a step's record is about a kilobyte: a quarter of a million steps fit

# (file name, title, [(label, the record's key path)]): one PNG per entry
PANELS = [
    (
        "reward.png",
        "Rollouts: reward and pass rate",
        [("mean reward", "rollouts/reward_mean"), ("pass rate", "rollouts/pass_rate")],
    ),
    (
        "tool_use.png",
        "Rollouts: tool use",
        [("share calling a tool", "rollouts/tool_use"), ("tool calls per rollout", "rollouts/tool_calls_mean")],
    ),
    ("loss.png", "Loss", [("loss", "loss")]),
    ("entropy.png", "Entropy of the policy on trained tokens (nats)", [("entropy", "metrics/entropy")]),
    (
        "length.png",
        "Rollout length",
        [
            ("completion tokens per turn", "rollouts/response_tokens_mean"),
            ("turns per trajectory", "rollouts/turns_mean"),
        ],
    ),
    (
        "clip.png",
        "PPO clip",
        [
            ("clip fraction", "metrics/clip_frac"),
            ("dual clip fraction", "metrics/dual_clip_frac"),
            ("TIS capped fraction", "metrics/tis_capped_frac"),
        ],
    ),
    (
        "drift.png",
        "Drift, mean |log ratio|",
        [
            ("from the update's start (π_old)", "metrics/drift_from_start"),
            ("from the sampler", "metrics/drift_from_rollout"),
        ],
    ),
    ("throughput.png", "Throughput (tokens/s)", [("tokens/s", "tokens_per_s")]),
    ("lr.png", "Learning rate and gradient norm", [("learning rate", "lr"), ("grad norm", "grad_norm")]),
]


class ReportError(NanbeigeError):
    """The run folder cannot be drawn; one line naming the fix."""


def metrics_files(run: Path) -> list[Path]:
    """The run's metrics files in step order: its own, or each loop iteration's."""
    if (run / "metrics.jsonl").is_file():
        return [run / "metrics.jsonl"]
    iterations = [
        (int(m[1]), p)
        for p in run.glob("iter-*/train/metrics.jsonl")
        if (m := re.fullmatch(r"iter-(\d+)", p.parent.parent.name))
    ]
    return [p for _, p in sorted(iterations)]


def read_records(run: Path) -> list[dict[str, Any]]:
    """Every step's record, numbered on across a loop's iterations; a line that is not a step is an error."""
    files = metrics_files(run)
    if not files:
        raise ReportError(f"{run}: no metrics.jsonl here or in iter-*/train/ (pass a `train --out` folder)")
    records: list[dict[str, Any]] = []
    for path in files:
        offset = len(records)
        try:  # the folder may be someone else's: no link out of it, no FIFO, nothing past the cap
            text = handed_over.read_bytes(path, MAX_METRICS_BYTES, inside=run).decode(errors="replace")
        except (OSError, ValueError) as exc:
            raise ReportError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record["step"] = offset + int(record["step"])
            except (ValueError, KeyError, TypeError):
                raise ReportError(f"{path}, line {number}: not a step record of `nanbeige train`") from None
            records.append(record)
    return records


def value(record: dict[str, Any], key: str) -> float | None:
    item: Any = record
    for part in key.split("/"):
        item = item.get(part) if isinstance(item, dict) else None
    return float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else None


def draw(run: Path, out: Path | None = None) -> list[Path]:
    """Writes one PNG per panel with data to `out` (default `RUN/report/`); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    records = read_records(run)
    out = out or run / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, lines in PANELS:
        series = [
            (label, [(r["step"], v) for r in records if (v := value(r, key)) is not None]) for label, key in lines
        ]
        series = [(label, points) for label, points in series if points]
        if not series:
            continue
        figure, axes = plt.subplots(figsize=(7, 4))
        for label, points in series:
            axes.plot(
                [p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None, label=label
            )
        axes.set_title(title)
        axes.set_xlabel("optimizer step")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
        written.append(out / name)
    return written
