"""`loop.json` may come from anyone (a loop folder handed over, a state edited between two calls), and the loop
goes on from the paths it names: it trains from a policy's checkpoint, samples from its model and tells the
engines to load it. So every checkpoint it names must lie inside the loop's own folder, and a policy's model
must be the model this loop was given or such a checkpoint; anything else is one line before anything runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_untrusted_inputs import assert_refused, jsonl, nanbeige

from nanbeige.trainer.loop_config import LoopError
from nanbeige.trainer.loop_state import read_state

MODEL = "Nanbeige/Nanbeige4.1-3B"


def state_of(out: Path) -> dict[str, Any]:
    """A loop one iteration in, trained and synced with LoRA: every field that names a place names its own."""
    checkpoint = str(out / "iter-1" / "train" / "checkpoint-1")
    start = {"model": MODEL, "checkpoint": None, "version": "iter-0"}
    synced = {"model": checkpoint, "checkpoint": checkpoint, "version": "iter-1"}
    iteration = {"iteration": 1, "policy": start, "trained": {"checkpoint": checkpoint, "steps": 1, "rows": 2}}
    return {
        "questions": "q.jsonl",
        "sync": "lora",
        "policy": dict(synced),
        "iterations": [{**iteration, "synced": synced}],
    }


ELSEWHERE = {  # a field set to a place outside the loop folder, and the field the error names
    "the policy's checkpoint": (("policy", "checkpoint"), "/home/someone/checkpoint-9", "`policy.checkpoint`"),
    "the policy's model": (("policy", "model"), "/home/someone/model", "`policy.model`"),
    "an iteration's policy model": (("iterations", 0, "policy", "model"), "/tmp/other", "`iterations[0].policy.model`"),
    "the trained checkpoint": (
        ("iterations", 0, "trained", "checkpoint"),
        "/tmp/c",
        "`iterations[0].trained.checkpoint`",
    ),
    "the synced checkpoint": (("iterations", 0, "synced", "checkpoint"), "/", "`iterations[0].synced.checkpoint`"),
    "a way out by ..": (("policy", "checkpoint"), "LOOP/iter-1/../../elsewhere", "`policy.checkpoint`"),
}


def with_field(state: dict[str, Any], where: tuple[Any, ...], value: str) -> dict[str, Any]:
    changed = copy.deepcopy(state)
    record = changed
    for key in where[:-1]:
        record = record[key]
    record[where[-1]] = value
    return changed


def test_a_loop_state_naming_only_its_own_folder_and_model_is_read(tmp_path: Path) -> None:
    (tmp_path / "loop.json").write_text(json.dumps(state_of(tmp_path)))
    state = read_state(tmp_path, MODEL)
    assert state is not None
    # written back as read, with the fields a state may leave out at their defaults
    written = state_of(tmp_path)
    written["engines"], written["iterations"][0]["seconds"] = {}, {}
    assert state.to_json() == written


@pytest.mark.parametrize("case", ELSEWHERE)
def test_a_loop_state_naming_a_place_outside_its_folder_is_one_line(tmp_path: Path, case: str) -> None:
    where, value, field = ELSEWHERE[case]
    state = with_field(state_of(tmp_path), where, value.replace("LOOP", str(tmp_path)))
    (tmp_path / "loop.json").write_text(json.dumps(state))
    with pytest.raises(LoopError, match="fix it or pass another out folder") as refused:
        read_state(tmp_path, MODEL)
    assert field in str(refused.value) and "\n" not in str(refused.value)


def test_a_policy_model_other_than_the_loop_s_own_is_refused(tmp_path: Path) -> None:
    """A model name is no path, but it is what the engines are asked for and what the in-process backend loads."""
    (tmp_path / "loop.json").write_text(json.dumps(state_of(tmp_path)))
    with pytest.raises(LoopError, match=r"`iterations\[0\].policy.model` is 'Nanbeige/Nanbeige4.1-3B'"):
        read_state(tmp_path, "another/model")


def test_the_loop_command_refuses_a_policy_checkpoint_outside_its_folder_before_it_runs(tmp_path: Path) -> None:
    questions, out = tmp_path / "questions.jsonl", tmp_path / "loop"
    questions.write_bytes(jsonl({"id": "q1", "question": "q", "answer": "4"}))
    elsewhere = tmp_path / "elsewhere" / "checkpoint-7"
    elsewhere.mkdir(parents=True)
    state = with_field(state_of(out), ("policy", "checkpoint"), str(elsewhere))
    out.mkdir()
    (out / "loop.json").write_text(json.dumps(state))
    result = nanbeige(
        "loop", "--iterations", "2", "--questions", questions, "--model", MODEL, "--out", out,
        "--no-default-servers", "--no-critic", "--sync", "lora", "--lora-rank", "2",
    )  # fmt: skip
    assert_refused(result, out / "loop.json", None, "`policy.checkpoint`", "outside the loop's folder")
    assert sorted(p.name for p in out.iterdir()) == ["loop.json"]
