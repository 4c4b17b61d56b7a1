"""What `nanbeige train` leaves to follow a run: the learning rate's warmup and cosine, every step in
TensorBoard's event files, `train report`'s curves of a run and of a loop, and a W&B project asked for
without wandb. The tiny model's judged rollouts are `tests/test_train.py`'s fixtures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_train import BIN, config_for, judged, metrics_of, tiny  # noqa: F401 (the fixtures: the tiny model and its judged rollouts)

from nanbeige.trainer.train import train


@pytest.fixture(scope="module")
def scheduled_run(tiny: Path, judged: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five steps: two of warmup to lr 1e-3, then cosine down to a tenth of it."""
    out = tmp_path_factory.mktemp("scheduled") / "out"
    train(
        config_for(tiny, judged, out, steps=5, step_tokens=150, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1),
        log=lambda text: None,
    )
    return out


def test_the_learning_rate_warms_up_then_follows_a_cosine(scheduled_run: Path) -> None:
    lrs = [line["lr"] for line in metrics_of(scheduled_run)]
    assert lrs == pytest.approx([0.5e-3, 1e-3, 1e-3, 1e-4 + 0.9e-3 * 0.5, 1e-4])


def test_every_step_is_in_tensorboards_event_files(scheduled_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(scheduled_run / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in (
        "loss",
        "lr",
        "tokens_per_s",
        "metrics/clip_frac",
        "metrics/entropy",
        "metrics/drift_from_start",
        "rollouts/pass_rate",
        "rollouts/reward_mean",
        "rollouts/response_tokens_mean",
    ):
        assert tag in tags, tag
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]
    lines = metrics_of(scheduled_run)
    assert [e.value for e in events.Scalars("lr")] == pytest.approx([line["lr"] for line in lines])
    assert events.Scalars("rollouts/pass_rate")[0].value == pytest.approx(0.5)  # 2 of 4 pass in each group
    assert all(e.value > 0 for e in events.Scalars("metrics/entropy"))


def test_train_report_draws_the_curves_of_a_run_and_of_a_loop(scheduled_run: Path, tmp_path: Path) -> None:
    from PIL import Image

    done = subprocess.run(
        [str(BIN / "nanbeige"), "train", "report", str(scheduled_run)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pngs = sorted(p.name for p in (scheduled_run / "report").glob("*.png"))
    assert pngs == [
        "clip.png",
        "drift.png",
        "entropy.png",
        "length.png",
        "loss.png",
        "lr.png",
        "reward.png",
        "throughput.png",
        "tool_use.png",
    ]
    assert Image.open(scheduled_run / "report" / "reward.png").size == (700, 400)
    # a loop's iterations are drawn one after another
    from nanbeige.trainer.train_report import read_records

    for i in (1, 2):
        (tmp_path / f"iter-{i}" / "train").mkdir(parents=True)
        (tmp_path / f"iter-{i}" / "train" / "metrics.jsonl").write_text((scheduled_run / "metrics.jsonl").read_text())
    assert [r["step"] for r in read_records(tmp_path)] == list(range(1, 11))
    (tmp_path / "iter-2" / "train" / "metrics.jsonl").write_text("{not json\n")
    bad = subprocess.run(
        [str(BIN / "nanbeige"), "train", "report", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 1 and "iter-2/train/metrics.jsonl, line 1: not a step record" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_wandb_project_without_wandb_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nanbeige.trainer.metrics import MetricsLog
    from nanbeige.trainer.train import TrainError

    monkeypatch.setitem(sys.modules, "wandb", None)  # as where it is not installed: importing it fails
    with pytest.raises(TrainError, match="--wandb-project needs the wandb package: pip install wandb"):
        MetricsLog(tmp_path, 0, tensorboard=False, wandb_project="runs")
