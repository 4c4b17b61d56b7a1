"""A checkpoint is a folder anyone could hand over: an out folder to `train --resume`, a loop folder to `loop`,
a `loop.json` whose policy names a checkpoint somewhere else. Its trainer state is read as tensors and plain
values only, never unpickled: a state file that names code (here, code that writes a file) is one line naming
the file and a non-zero exit, and the code never runs. A genuine checkpoint still resumes
(`tests/test_train.py`, `tests/test_train_loop.py`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_untrusted_inputs import assert_refused, jsonl, nanbeige
from test_untrusted_training import data_with
from tiny_model import make_tiny_model

REFUSED = "refused, never unpickled"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


class Planted:
    """Unpickled, it writes `path`: proof that the state file was unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.write_text, (self.path, "the pickle ran"))


def planted_checkpoint(folder: Path, marker: Path) -> Path:
    """A checkpoint folder, marked whole, whose trainer state looks like one but runs code when unpickled."""
    import torch

    folder.mkdir(parents=True)
    state = folder / "trainer-state-rank0.pt"
    torch.save({"optimizer": Planted(marker), "step": 1, "world_size": 1, "config": {}}, state)
    (folder / "checkpoint-complete.json").write_text('{"step": 1, "world_size": 1}')
    return state


def test_train_resume_refuses_a_state_file_that_would_run_code(tiny: Path, tmp_path: Path) -> None:
    data, out, marker = tmp_path / "judged.jsonl", tmp_path / "out", tmp_path / "ran"
    data.write_bytes(data_with())
    state = planted_checkpoint(out / "checkpoint-1", marker)
    result = nanbeige("train", "--data", data, "--model", tiny, "--out", out, "--steps", "1", "--resume")
    assert not marker.exists()
    assert_refused(result, state, None, REFUSED)


def handed_over_loop(tiny: Path, tmp_path: Path, policy_checkpoint: Path | None) -> tuple[Path, Path]:
    """A loop folder whose iteration 1 is collected and judged, its training still to do; the iteration's
    policy is `policy_checkpoint` (None: the model itself). Returns the folder and its questions file."""
    questions, out = tmp_path / "questions.jsonl", tmp_path / "loop"
    questions.write_bytes(jsonl({"id": "q1", "question": "q", "answer": "4"}))
    policy = {"model": str(policy_checkpoint or tiny), "checkpoint": policy_checkpoint and str(policy_checkpoint)}
    policy["version"] = "iter-0"
    iteration = {
        "iteration": 1,
        "policy": policy,
        "collected": {"rollouts": 2, "pass_rate": 0.5, "model": policy["model"]},
        "judged": {"judged": 2, "mean_reward": 0.5, "groups": 1, "informative_groups": 1, "questions": 1},
    }
    state = {"questions": str(questions), "sync": "none", "policy": policy, "iterations": [iteration]}
    (out / "iter-1").mkdir(parents=True)
    (out / "loop.json").write_text(json.dumps(state))
    (out / "iter-1" / "questions.jsonl").write_bytes(questions.read_bytes())
    (out / "iter-1" / "judged.jsonl").write_bytes(data_with())
    return out, questions


def loop(out: Path, questions: Path, tiny: Path, *options: object) -> object:
    return nanbeige(
        "loop",
        "--iterations",
        "1",
        "--questions",
        questions,
        "--model",
        tiny,
        "--out",
        out,
        "--backend",
        "transformers",
        "--no-default-servers",
        "--no-critic",
        "--sync",
        "none",
        "--steps",
        "1",
        *options,
    )


def test_the_loop_s_train_stage_refuses_a_handed_over_loop_folder_s_checkpoint(tiny: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out, questions = handed_over_loop(tiny, tmp_path, None)
    state = planted_checkpoint(out / "iter-1" / "train" / "checkpoint-1", marker)
    result = loop(out, questions, tiny)
    assert not marker.exists()
    assert_refused(result, state, None, "iteration 1, train", REFUSED)


def test_a_loop_policy_s_checkpoint_never_unpickles_its_state(tiny: Path, tmp_path: Path) -> None:
    """With LoRA an iteration goes on from its policy's adapter and optimizer state: the state is read as a
    handed-over file, before anything is trained. (A checkpoint outside the loop's folder is refused before
    that: `tests/test_loop_places.py`.)"""
    import peft
    import transformers

    marker, elsewhere = tmp_path / "ran", tmp_path / "loop" / "given" / "checkpoint-7"
    state = planted_checkpoint(elsewhere, marker)
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny)  # a real adapter: it loads as one would
    lora = peft.LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM")
    peft.get_peft_model(base, lora).save_pretrained(elsewhere / "adapter")
    out, questions = handed_over_loop(tiny, tmp_path, elsewhere)
    result = loop(out, questions, tiny, "--lora-rank", "2")
    assert not marker.exists()
    assert_refused(result, state, None, "iteration 1, train", REFUSED)


def pickled_model(tiny: Path, folder: Path, marker: Path) -> Path:
    """The tiny model's config and tokenizer, with weights in a `pytorch_model.bin` that runs code when unpickled."""
    import torch

    folder.mkdir(parents=True)
    for path in tiny.iterdir():
        if path.suffix != ".safetensors":
            (folder / path.name).write_bytes(path.read_bytes())
    torch.save({"model.embed_tokens.weight": Planted(marker)}, folder / "pytorch_model.bin")
    return folder


def test_a_loop_policy_naming_a_model_with_pickled_weights_is_one_line(tiny: Path, tmp_path: Path) -> None:
    """Without LoRA an iteration trains its policy's checkpoint itself: transformers reads a `.bin` with
    weights_only, so the code does not run either way, and the refusal is one line, not a crash."""
    marker = tmp_path / "ran"
    elsewhere = pickled_model(tiny, tmp_path / "loop" / "given" / "checkpoint-7", marker)
    out, questions = handed_over_loop(tiny, tmp_path, elsewhere)
    result = loop(out, questions, tiny)
    assert not marker.exists()
    assert_refused(result, elsewhere, None, "iteration 1, train", REFUSED)


def test_the_in_process_backend_refuses_pickled_weights_in_one_line(tiny: Path, tmp_path: Path) -> None:
    """The loop's collect samples from its policy's checkpoint in process, as `ask --backend transformers` does."""
    marker = tmp_path / "ran"
    model = pickled_model(tiny, tmp_path / "checkpoint-7", marker)
    result = nanbeige("ask", "--backend", "transformers", "--model", model, "--no-default-servers", "What is 2+2?")
    assert not marker.exists()
    assert_refused(result, model, None, REFUSED)


# ---------------------------------------------------------------- the out folder's other files, read as handed over


@pytest.fixture(scope="module")
def trained(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A genuine out folder of one training step (its checkpoint-1 and metrics.jsonl), and its data."""
    folder = tmp_path_factory.mktemp("trained")
    data = folder / "judged.jsonl"
    data.write_bytes(data_with())
    # the hand-made rollouts were not sampled by the tiny model: trained on as off-policy data
    result = nanbeige("train", "--data", data, "--model", tiny, "--out", folder / "out", "--steps", "1", "--off-policy")
    assert result.exit_code == 0, result.output
    return folder / "out", data


def handed_over_copy(trained: tuple[Path, Path], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    return out


def test_a_metrics_file_linked_elsewhere_is_never_cut_through_the_link(
    tiny: Path, trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """A resume cuts `metrics.jsonl` back to the checkpoint's step: through a planted link it would empty the
    file the link names."""
    out, victim = handed_over_copy(trained, tmp_path), tmp_path / "notes.txt"
    victim.write_text("the user's own notes\n")
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(victim)
    result = nanbeige(
        "train", "--data", trained[1], "--model", tiny, "--out", out, "--steps", "1", "--off-policy", "--resume"
    )
    assert victim.read_text() == "the user's own notes\n"
    assert_refused(result, out / "metrics.jsonl", None, "symbolic link")


def resume_in_a_process(tiny: Path, data: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`train --resume` as a user runs it; a reader that blocks on a FIFO fails by the timeout."""
    command = [str(Path(sys.executable).parent / "nanbeige"), "train", "--data", str(data), "--model", str(tiny)]
    command += ["--out", str(out), "--steps", "1", "--off-policy", "--resume"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_a_trainer_state_linked_elsewhere_is_one_line(tiny: Path, trained: tuple[Path, Path], tmp_path: Path) -> None:
    out = handed_over_copy(trained, tmp_path)
    state = out / "checkpoint-1" / "trainer-state-rank0.pt"
    elsewhere = tmp_path / "elsewhere.pt"
    state.rename(elsewhere)
    state.symlink_to(elsewhere)
    done = resume_in_a_process(tiny, trained[1], out)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert str(state) in error and "symbolic link" in error, error


def test_a_checkpoint_marker_that_is_a_fifo_does_not_block_the_resume(
    tiny: Path, trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """A FIFO would block its reader forever: it is no marker, so the checkpoint is not taken for a whole one."""
    out = handed_over_copy(trained, tmp_path)
    marker = out / "checkpoint-1" / "checkpoint-complete.json"
    marker.unlink()
    os.mkfifo(marker)
    done = resume_in_a_process(tiny, trained[1], out)
    assert done.returncode == 0 and "resuming after step" not in done.stderr, done.stderr


def test_a_loop_folder_holding_a_link_is_refused_before_anything_is_written_through_it(
    tiny: Path, tmp_path: Path
) -> None:
    """The iteration's training folder linked to a folder elsewhere: its checkpoints would be written there."""
    out, questions = handed_over_loop(tiny, tmp_path, None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "iter-1" / "train").symlink_to(elsewhere)
    result = loop(out, questions, tiny, "--off-policy")
    assert list(elsewhere.iterdir()) == []
    assert_refused(result, out / "iter-1" / "train", None, "symbolic link")


def test_a_start_logprobs_file_that_is_a_fifo_is_one_line_not_a_hang(
    tiny: Path, trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """π_old is read back on resume from `start-logprobs.pt`: a FIFO there would block the reader forever."""
    out = handed_over_copy(trained, tmp_path)
    (out / "start-logprobs.pt").unlink()
    os.mkfifo(out / "start-logprobs.pt")
    done = resume_in_a_process(tiny, trained[1], out)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "start-logprobs.pt is not a regular file" in error, error
