"""`nanbeige train` reads judged files and, with --resume, its own out folder: both untrusted. Token ids
of another type, negative or past the vocabulary, logprobs that do not line up, rewards that are not
numbers, torn or garbage lines: one line naming the file and the line (a record the trajectory reader
skips is named in a warning), a non-zero exit, no traceback, nothing written. A checkpoint a kill cut
short is never resumed from."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest
from test_untrusted_inputs import BINARY, NESTED, assert_refused, assert_warned, files_in, jsonl, nanbeige
from tiny_model import make_tiny_model

from nanbeige.agent.run.tokens import _hash
from nanbeige.trainer.checkpoints import drop_metrics_after, latest_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def judged(trajectory_id: str, reward: object, turn: dict | None = None, end: dict | None = None) -> list[dict]:
    """A judged one-turn rollout with a token record that checks out (its prompt starts the segment)."""
    return [
        {"type": "start", "id": trajectory_id, "group_id": "q1", "question": "q", "sampling": {"temperature": 1.0}},
        {
            "type": "turn",
            "trajectory_id": trajectory_id,
            "index": 0,
            "assistant": {"content": "4"},
            "segment": 0,
            "prompt_keep": 0,
            "prefix_hash": _hash(array("i")),
            "prompt_delta_ids": [5, 6, 7],
            "completion_ids": [8, 9],
            "logprobs": [-0.5, -0.7],
            "reward": 0.5,
            **(turn or {}),
        },
        {
            "type": "end",
            "trajectory_id": trajectory_id,
            "answer": "4",
            "stop_reason": "answered",
            "reward": reward,
            **(end or {}),
        },
    ]


def data_with(turn: dict | None = None, end: dict | None = None) -> bytes:
    """Rollout a (passes) then b (fails, with the fault): b's turn is line 5, its end line 6."""
    return jsonl(*judged("a", 1.0), *judged("b", 0.0, turn, end))


REFUSED = {
    "a token id that is text": (data_with({"completion_ids": ["8", 9]}), 5, "token id"),
    "a negative token id": (data_with({"prompt_delta_ids": [5, -6, 7]}), 5, "token id"),
    "a token id past any vocabulary": (data_with({"completion_ids": [8, 2**70]}), 5, "token id"),
    "a token id past the model's vocabulary": (data_with({"completion_ids": [8, 1_000_000]}), 5, "vocabulary"),
    "fewer logprobs than completion ids": (data_with({"logprobs": [-0.5]}), 5, "logprobs"),
    "a logprob that is text": (data_with({"logprobs": ["x", -0.5]}), 5, "logprob"),
    "a logprob that is not finite": (data_with({"logprobs": [-0.5, -1e400]}), 5, "not a JSON"),
    "a reward whose square overflows": (data_with(end={"reward": 1e300}), 6, "not a number within"),
    "a turn reward whose square overflows": (data_with({"reward": -1e30}), 5, "not a number within"),
    "a 0-byte file": (b"", None, "holds no trajectory"),
    "binary garbage": (BINARY + b"\n" + BINARY, 1, "not a JSON line"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_judged_data_that_cannot_be_trained_on_is_one_line_naming_the_file_and_line(
    tiny: Path, tmp_path: Path, case: str
) -> None:
    content, line, why = REFUSED[case]
    data, out = tmp_path / "judged.jsonl", tmp_path / "out"
    data.write_bytes(content)
    result = nanbeige("train", "--data", data, "--model", tiny, "--out", out, "--steps", "1")
    if why == "not a JSON":  # a number JSON cannot hold: the reader skips its line, saying so
        assert_warned(result, data, line)
    else:
        assert_refused(result, data, line, why)
    assert result.exit_code == 1 and not out.exists() and data.read_bytes() == content


SKIPPED = {  # the reader skips the line, saying so; b is left without that record, and its group cannot train
    "a NaN reward": (data_with().replace(b'"reward": 0.0}', b'"reward": NaN}'), 6),
    "a reward that is text": (data_with(end={"reward": "1"}), 6),
    "a list where the turn's mask belongs": (data_with({"mask": [1, 0]}), 5),
    "nested past the recursion limit": (jsonl(*judged("a", 1.0), NESTED, *judged("b", 0.0)), 4),
    "a huge garbage line": (jsonl(*judged("a", 1.0), b"x" * 4_000_000, *judged("b", 0.0)), 4),
    "a truncated last line": (data_with()[:-20], 6),
}


@pytest.mark.parametrize("case", SKIPPED)
def test_a_judged_record_the_reader_skips_is_named_and_nothing_trains(tiny: Path, tmp_path: Path, case: str) -> None:
    content, line = SKIPPED[case]
    data, out = tmp_path / "judged.jsonl", tmp_path / "out"
    data.write_bytes(content)
    result = nanbeige("train", "--data", data, "--model", tiny, "--out", out, "--steps", "1")
    assert_warned(result, data, line)
    if case.startswith(("nested", "a huge")):  # a line of its own: both rollouts are whole, and read
        assert "training on 2 rows" in result.output
    else:
        assert result.exit_code == 1 and "error: nothing to train on" in result.output and not out.exists()


def test_a_checkpoint_a_kill_cut_short_is_not_resumed_from(tmp_path: Path) -> None:
    """A checkpoint is whole once every rank's trainer state is in place under its final name (each written
    under another name and renamed) and the marker written after them says how many ranks saved: a kill
    mid-write, or between two ranks' files, leaves a folder that is not taken for a whole one."""
    cases = [
        (1, ["trainer-state-rank0.pt"], {"world_size": 1}),
        (2, ["trainer-state-rank0.pt.tmp"], None),  # killed mid-write
        (3, [], None),  # killed before any state
        (4, ["trainer-state-rank0.pt"], None),  # killed before the marker
        (5, ["trainer-state-rank0.pt"], {"world_size": 2}),  # a marker naming a rank whose file is missing
        (6, ["trainer-state-rank0.pt"], {"world_size": "1"}),  # a marker of another type
        (7, ["trainer-state-rank0.pt"], [1]),
    ]
    for step, states, marker in cases:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")
        for state in states:
            (folder / state).write_bytes(b"state")
        if marker is not None:
            (folder / "checkpoint-complete.json").write_text(json.dumps(marker))
    assert latest_checkpoint(tmp_path) == (tmp_path / "checkpoint-1", 1)
    (tmp_path / "checkpoint-5" / "trainer-state-rank1.pt").write_bytes(b"state")  # the second rank's file in place
    assert latest_checkpoint(tmp_path) == (tmp_path / "checkpoint-5", 5)


def test_a_checkpoint_s_state_is_written_under_its_name_only_when_whole(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import transformers

    from nanbeige.trainer.checkpoints import save_checkpoint
    from nanbeige.trainer.model import World
    from nanbeige.trainer.train import TrainConfig

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    optimizer = torch.optim.AdamW(model.parameters())
    config = TrainConfig(data=[], model=str(tiny), out=tmp_path)
    real_save = torch.save

    def killed_mid_write(value: object, path: object) -> None:
        real_save(value, path)
        Path(str(path)).write_bytes(Path(str(path)).read_bytes()[:100])
        raise SystemExit(137)  # as the kill lands

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(SystemExit):
        save_checkpoint(model, tokenizer, optimizer, 1, config, World(rank=0, size=1, device="cpu"))
    assert not (tmp_path / "checkpoint-1" / "trainer-state-rank0.pt").exists()
    assert latest_checkpoint(tmp_path) is None


def test_a_checkpoint_state_that_cannot_be_read_is_one_line(tiny: Path, tmp_path: Path) -> None:
    data, out = tmp_path / "judged.jsonl", tmp_path / "out"
    data.write_bytes(data_with())
    state = out / "checkpoint-1" / "trainer-state-rank0.pt"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"PK\x03\x04 not a whole archive")
    (state.parent / "checkpoint-complete.json").write_text('{"step": 1, "world_size": 1}')  # marked whole all the same
    result = nanbeige("train", "--data", data, "--model", tiny, "--out", out, "--steps", "1", "--resume")
    assert_refused(result, state, None, "cannot read")


def test_metrics_with_a_torn_last_line_are_cut_back_on_resume(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    steps = [json.dumps({"step": n, "loss": 0.5}) + "\n" for n in (1, 2, 3)]
    metrics.write_text("".join(steps) + '{"step": 4, "lo')
    drop_metrics_after(metrics, 2)
    assert metrics.read_text() == "".join(steps[:2])


# ---------------------------------------------------------------- train --loop: its state file

POLICY = {"model": "m", "checkpoint": None, "version": "iter-0"}
DONE = {
    "iteration": 1,
    "policy": POLICY,
    "collected": {"rollouts": 2, "pass_rate": 0.5, "model": "m"},
    "trained": {"checkpoint": "ckpt", "steps": 1, "rows": 2},
}
LOOP_STATES = {  # each a loop.json that resumes into a TypeError today; the field the error names
    "a list for the whole state": ([], "it must be an object"),
    "an object for the iterations": ({"policy": POLICY, "iterations": {"1": DONE}}, "`iterations` must be a list"),
    "text for the policy": ({"policy": "m", "iterations": []}, "`policy` must be an object"),
    "a list for the policy's model": (
        {"policy": {**POLICY, "model": ["m"]}, "iterations": []},
        "`policy.model` must be text",
    ),
    "a number for a checkpoint": (
        {"policy": POLICY, "iterations": [{**DONE, "policy": {**POLICY, "checkpoint": 5}}]},
        "`iterations[0].policy.checkpoint` must be text or null",
    ),
    "a list for an iteration": ({"policy": POLICY, "iterations": [[1]]}, "`iterations[0]` must be an object"),
    "text for the iteration's number": (
        {"policy": POLICY, "iterations": [{**DONE, "iteration": "1"}]},
        "`iterations[0].iteration` must be 1",
    ),
    "a list for the trained checkpoint": (
        {"policy": POLICY, "iterations": [{**DONE, "trained": {"checkpoint": ["ckpt"], "steps": 1, "rows": 2}}]},
        "`iterations[0].trained.checkpoint` must be text",
    ),
    "true/false for a count": (
        {"policy": POLICY, "iterations": [{**DONE, "collected": {"rollouts": True}}]},
        "`iterations[0].collected.rollouts` must be a whole number",
    ),
    "text for the sync": ({"policy": POLICY, "sync": 1, "iterations": []}, "`sync` must be text"),
    # the loop prints it in its line per iteration: text there would be shown as the console's markup
    "text for the tool-use share": (
        {"policy": POLICY, "iterations": [{**DONE, "judged": {"tool_use": "[red]100%"}}]},
        "`iterations[0].judged.tool_use` must be a number or null",
    ),
    "text for a stage's wall time": (
        {"policy": POLICY, "iterations": [{**DONE, "seconds": {"collected": "[red]5"}}]},
        "`iterations[0].seconds.collected` must be a number",
    ),
}


@pytest.mark.parametrize("case", LOOP_STATES)
def test_a_loop_state_with_a_field_of_the_wrong_type_is_one_line_naming_the_field(tmp_path: Path, case: str) -> None:
    state, why = LOOP_STATES[case]
    questions, out = tmp_path / "questions.jsonl", tmp_path / "loop"
    questions.write_bytes(jsonl({"id": "a", "question": "What is 2+2?", "answer": "4"}))
    out.mkdir()
    (out / "loop.json").write_text(json.dumps(state))
    before = files_in(out)
    result = nanbeige(
        "train",
        "--loop",
        "1",
        "--questions",
        questions,
        "--model",
        tmp_path / "no-model",
        "--out",
        out,
        "--backend",
        "transformers",
        "--no-default-servers",
        "--no-critic",
        "--sync",
        "none",
    )
    assert_refused(result, out / "loop.json", None, why)
    assert files_in(out) == before
