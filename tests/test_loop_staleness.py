"""`nanbeige loop --max-staleness K`: sampling and training overlap. Iteration i samples once iteration i-1-K is
synced, so its policy is at most K versions behind the one it trains from; each iteration trains from the newest
policy; nothing sampled is dropped, and a loop stopped half way goes on, training every iteration once. Against
a loopback vLLM engine (`FakeEngine`: completions in token mode and runtime LoRA, as vLLM answered them)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import Reply, mcp_answer
from fake_vllm_engine import FakeEngine
from test_sync_engines import loop_for, tiny  # noqa: F401 (tiny: the fixture)

from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.loop_config import LoopError
from nanbeige.trainer.rl_loop import run_loop


def half_right(tiny: Path) -> dict[str, Any]:  # noqa: F811
    """A scripted policy answering two of every four rollouts of a question right, whichever model is asked
    (two iterations may sample one policy here), and what token mode needs to talk to it."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tokenizer = load_tokenizer(str(tiny))[0]
    answered: dict[str, int] = {}
    lock = threading.Lock()

    def policy(request: dict[str, Any]) -> str:
        question = "a" if "2+2" in tokenizer.decode(request["prompt"]) else "b"
        with lock:
            n = answered[question] = answered.get(question, 0) + 1
        return mcp_answer({"a": "4", "b": "red"}[question] if n % 4 in (1, 2) else "nothing")

    return {
        "replies": policy,
        "tokenize": lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        "stop_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }


def optimizer_steps(out: Path, iterations: int) -> list[int]:
    """AdamW's step count in each iteration's checkpoint: with LoRA each iteration goes on from the optimizer
    state of the policy it trains from, so 1, 2, 3 says each trained once, from the one before."""
    import torch

    return [
        int(
            torch.load(out / f"iter-{i}" / "train" / "checkpoint-1" / "trainer-state-rank0.pt", weights_only=True)[
                "optimizer"
            ]["state"][0]["step"]
        )
        for i in range(1, iterations + 1)
    ]


def sampled_versions(out: Path) -> list[str]:
    """The version of the policy each iteration sampled, as loop.json records it."""
    return [entry["policy"]["version"] for entry in json.loads((out / "loop.json").read_text())["iterations"]]


def test_with_k_1_an_iteration_samples_while_the_one_before_trains_and_trains_from_the_newest_policy(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "loop"
    with FakeEngine(**half_right(tiny)) as engine:
        summary = asyncio.run(run_loop(loop_for(tiny, out, [engine.base_url], 3, "lora", max_staleness=1), print))
        adapters = [request["lora_name"] for request in engine.lora_requests]
    state = json.loads((out / "loop.json").read_text())
    checkpoints = [entry["trained"]["checkpoint"] for entry in state["iterations"]]
    # iteration 2 was admitted before iteration 1 had trained (it samples the start: one version behind the
    # policy it trains from), iteration 3 once iteration 1 was synced
    assert sampled_versions(out) == ["iter-0", "iter-0", "iter-1"]
    models = [{t.model for t in load_trajectories(out / f"iter-{i}" / "rollouts.jsonl")} for i in (1, 2, 3)]
    assert models == [{str(tiny)}, {str(tiny)}, {checkpoints[0]}]
    # each iteration trained once, from the newest policy: iteration 2 from iteration 1's adapter, although
    # it sampled the start
    assert adapters == checkpoints and len(set(checkpoints)) == 3 and optimizer_steps(out, 3) == [1, 2, 3]
    assert all(Path(c).parent == out / f"iter-{i}" / "train" for i, c in enumerate(checkpoints, 1))
    assert state["policy"]["checkpoint"] == checkpoints[2] and state["engines"] == {
        engine.base_url.removesuffix("/v1"): "iter-3"
    }
    assert [item["rollouts"] for item in summary["iterations"]] == [8, 8, 8]


def test_with_k_0_each_iteration_samples_the_policy_the_one_before_trained(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "loop"
    with FakeEngine(**half_right(tiny)) as engine:
        asyncio.run(run_loop(loop_for(tiny, out, [engine.base_url], 2, "lora"), print))
    assert sampled_versions(out) == ["iter-0", "iter-1"]


def test_a_loop_stopped_by_a_failed_sync_goes_on_and_trains_every_iteration_once(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Iteration 2's sync fails (the engine stops taking adapters) while iteration 3 samples: the loop stops in
    one line, and the same loop run again syncs iteration 2, finishes iteration 3's rollouts where they
    stopped, from the policy it had admitted them with, and trains iteration 3 from iteration 2's adapter."""
    out = tmp_path / "loop"
    with FakeEngine(**half_right(tiny)) as engine:

        def notice(line: str) -> None:
            if line.startswith("loop: iteration 1 synced"):
                engine.broken = "lora"  # restarted without runtime LoRA updates

        config = loop_for(tiny, out, [engine.base_url], 3, "lora", max_staleness=1)
        with pytest.raises(LoopError, match="iteration 2, sync: 1 of 1 engines did not take the new policy"):
            asyncio.run(run_loop(config, notice))
        state = json.loads((out / "loop.json").read_text())
        assert "trained" in state["iterations"][1] and "synced" not in state["iterations"][1]

        engine.broken = None
        summary = asyncio.run(run_loop(config, print))
        adapters = [request["lora_name"] for request in engine.lora_requests if "lora_name" in request]
    state = json.loads((out / "loop.json").read_text())
    checkpoints = [entry["trained"]["checkpoint"] for entry in state["iterations"]]
    assert sampled_versions(out) == ["iter-0", "iter-0", "iter-1"]
    assert adapters == checkpoints  # each loaded once, in order: iteration 2's on the second run
    assert optimizer_steps(out, 3) == [1, 2, 3]
    for i in (1, 2, 3):  # one training each: a step's checkpoint, none twice
        assert sorted(p.name for p in (out / f"iter-{i}" / "train").glob("checkpoint-*")) == ["checkpoint-1"]
        ids = [t.id for t in load_trajectories(out / f"iter-{i}" / "rollouts.jsonl")]
        assert len(ids) == len(set(ids)) == 8
    assert [item["rollouts"] for item in summary["iterations"]] == [8, 8, 8]


def test_with_k_1_an_engine_that_fails_a_sync_is_left_out_of_sampling_until_it_serves_the_policy(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two engines in a pool; the second refuses adapters until iteration 2 has trained. Iteration 1's sync
    reaches the first alone: the loop goes on, iteration 3 (which samples iteration 1's adapter) asks the first
    engine alone, and from iteration 2's sync on both serve the policy again."""
    out = tmp_path / "loop"
    script = half_right(tiny)
    with FakeEngine(**script) as one, FakeEngine(**script) as two:
        two.broken = "lora"

        def notice(line: str) -> None:
            if line.startswith("loop: iteration 2 trained"):
                two.broken = None  # restarted with runtime LoRA updates

        config = loop_for(tiny, out, [one.base_url, two.base_url], 3, "lora", max_staleness=1)
        summary = asyncio.run(run_loop(config, notice))
        first = json.loads((out / "loop.json").read_text())["iterations"][0]["trained"]["checkpoint"]
        asked = [{r["model"] for r in engine.requests if "prompt" in r} for engine in (one, two)]
        assert first in asked[0] and first not in asked[1]  # the stale engine never sampled iteration 3
        assert str(tiny) in asked[1]  # it sampled the start's iterations, which it served
        assert {"refused": True} in two.lora_requests
    assert sampled_versions(out) == ["iter-0", "iter-0", "iter-1"]
    state = json.loads((out / "loop.json").read_text())
    assert state["engines"] == {one.base_url.removesuffix("/v1"): "iter-3", two.base_url.removesuffix("/v1"): "iter-3"}
    assert [item["rollouts"] for item in summary["iterations"]] == [8, 8, 8]


def test_an_iteration_admitted_with_a_policy_no_engine_serves_any_more_samples_the_newest_never_an_older(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Iteration 3 was admitted with iteration 1's policy and stopped before it sampled; then the engine
    restarted, losing its adapters. The rerun admits iteration 3 again with the newest policy (iteration 2's)
    and syncs that again: it never syncs iteration 1's back, nor trains iteration 3 from it."""
    out = tmp_path / "loop"
    with FakeEngine(**half_right(tiny)) as engine:
        asyncio.run(run_loop(loop_for(tiny, out, [engine.base_url], 2, "lora", max_staleness=1), print))
        state = json.loads((out / "loop.json").read_text())
        state["iterations"].append({"iteration": 3, "policy": state["iterations"][0]["synced"], "seconds": {}})
        (out / "loop.json").write_text(json.dumps(state))
        engine.restart()
        config = loop_for(tiny, out, [engine.base_url], 3, "lora", max_staleness=1)
        with pytest.raises(LoopError, match="iteration 3, collect: .*iteration 2 is no longer synced"):
            asyncio.run(run_loop(config, print))
        asyncio.run(run_loop(config, print))
        adapters = [request["lora_name"] for request in engine.lora_requests]
    checkpoints = [
        entry["trained"]["checkpoint"] for entry in json.loads((out / "loop.json").read_text())["iterations"]
    ]
    assert sampled_versions(out) == ["iter-0", "iter-0", "iter-2"]
    assert optimizer_steps(out, 3) == [1, 2, 3]
    assert adapters == [checkpoints[0], checkpoints[1], checkpoints[1], checkpoints[2]]  # after the restart: 2 again


def test_when_sampling_fails_while_an_iteration_trains_its_training_is_finished_and_recorded(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Training runs in a thread a cancel cannot stop: a collect that fails meanwhile stops the loop once the
    training in progress is recorded, so the rerun does not train it again."""
    out = tmp_path / "loop"
    script = half_right(tiny)
    replies = script.pop("replies")
    asked = [0]

    def first_iteration_only(request: dict[str, Any]) -> Any:
        asked[0] += 1
        return replies(request) if asked[0] <= 8 else Reply(status=400, body={"error": {"message": "gone"}})

    with FakeEngine(first_iteration_only, **script) as engine:
        config = loop_for(tiny, out, [engine.base_url], 2, "lora", max_staleness=1)
        with pytest.raises(LoopError, match="iteration 2, collect: 8 runs in a row failed"):
            asyncio.run(run_loop(config, print))
    first = json.loads((out / "loop.json").read_text())["iterations"][0]
    assert "trained" in first and "synced" not in first


@pytest.mark.parametrize("staleness", [-1, 1])
def test_a_staleness_that_cannot_work_is_refused_before_anything_is_written(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
    staleness: int,
) -> None:
    out = tmp_path / "loop"
    config = loop_for(tiny, out, ["http://127.0.0.1:9/v1"], 1, "none", max_staleness=staleness)
    said = "must be 0 or more, not -1" if staleness < 0 else "sync none syncs nothing"
    with pytest.raises(LoopError, match=said):
        asyncio.run(run_loop(config, print))
    assert not out.exists()


NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def loop_command(tiny: Path, questions: Path, out: Path, url: str) -> list[str]:  # noqa: F811
    """`nanbeige loop` as a user runs it with K = 1: three iterations of one-turn rollouts in token mode."""
    return [
        *(NANBEIGE, "loop", "--iterations", "3", "--max-staleness", "1", "--questions", str(questions)),
        *("-G", "4", "--model", str(tiny), "--out", str(out), "--base-url", url, "--token-mode"),
        *("--no-default-servers", "--no-critic", "--sync", "lora", "--lora-rank", "4", "--steps", "1"),
        *("--step-tokens", "4000", "--micro-tokens", "4000", "--lr", "1e-3", "--off-policy"),
        *("--max-turns", "1", "--max-tokens", "64", "--temperature", "1.0", "--no-summary-turn"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("killed_at", ["iter-2/rollouts.jsonl", "iter-2/train", "iter-3/judged.jsonl"])
def test_killed_with_sigkill_anywhere_the_same_command_goes_on_training_each_iteration_once(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
    killed_at: str,
) -> None:
    """The loop process is killed (SIGKILL) as soon as `killed_at` appears: mid-collect of the iteration sampled
    while the first trains, mid-training, mid-judge; run again, it finishes with every rollout once, every
    iteration trained once from the one before, and the policies it had admitted."""
    out = tmp_path / "loop"
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'
        '{"id": "b", "question": "Name a colour.", "answer": "red"}\n'
    )
    with FakeEngine(**half_right(tiny)) as engine:
        command = loop_command(tiny, questions, out, engine.base_url)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None and not (out / killed_at).exists():
            time.sleep(0.02)
        assert process.poll() is None, "the loop ended before it could be killed"
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        # an iteration's policy is on disk before its first rollout: what a rerun samples the rest with
        admitted = json.loads((out / "loop.json").read_text())["iterations"]
        assert len(admitted) >= int(killed_at.split("/")[0].removeprefix("iter-"))
        finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert finished.returncode == 0, finished.stderr[-3000:]
        adapters = [request["lora_name"] for request in engine.lora_requests]
    state = json.loads((out / "loop.json").read_text())
    checkpoints = [entry["trained"]["checkpoint"] for entry in state["iterations"]]
    assert sampled_versions(out) == ["iter-0", "iter-0", "iter-1"]
    assert optimizer_steps(out, 3) == [1, 2, 3]
    assert list(dict.fromkeys(adapters)) == checkpoints  # loaded in order (a sync cut short may be asked again)
    for i in (1, 2, 3):
        ids = [(t.group_id, t.rollout_index) for t in load_trajectories(out / f"iter-{i}" / "rollouts.jsonl")]
        assert len(ids) == len(set(ids)) == 8
        assert len(load_trajectories(out / f"iter-{i}" / "judged.jsonl")) == 8
