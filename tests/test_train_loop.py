"""`trainer/rl_loop.py` on CPU: collect -> judge -> train -> sync for two iterations with the tiny model in
process (sync none) and against a loopback vLLM (LoRA hot-load), resumed after a stop at any stage."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer
from tiny_model import make_tiny_model

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.critic import CRITIC_ENDPOINT
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.loop_config import LoopConfig, LoopError
from nanbeige.trainer.rl_loop import run_loop
from nanbeige.trainer.sync import SyncError, load_adapter
from nanbeige.trainer.train import TrainConfig
from nanbeige.trainer.train_config import GroupRule

QUESTIONS = (
    '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'
    '{"id": "b", "question": "Name a colour.", "answer": "red"}\n'
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def alternating_critic() -> Any:
    """A turn critic that scores each question's turns 5, 3, 5, 3, ... in the order it is asked about that
    question: every turn passes, with reward 1.0 or 0.5, so the two turns of a group of two differ however
    the judge orders its concurrent requests (one counter for all questions let a group get 5, 5 when the
    other question's turn came between)."""
    counts: dict[str, itertools.count] = {}
    lock = threading.Lock()

    def reply(request: dict[str, Any]) -> str:
        prompt = json.dumps(request["messages"])
        question = next((q for q in ("What is 2+2?", "Name a colour.") if q in prompt), "")
        with lock:
            score = 5 if next(counts.setdefault(question, itertools.count())) % 2 == 0 else 3
        return json.dumps(
            {
                name: {"score": score, "reason": "ok"}
                for name in ("logical_soundness", "tool_call_accuracy", "information_gain")
            }
        )

    return reply


def weights(folder: Path) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def in_process_loop(tiny: Path, out: Path, critic: FakeOpenAI, iterations: int, **train: Any) -> LoopConfig:
    """The tiny model's answers are noise, so every outcome reward is 0 and no group passes GRPO's
    default 10-90% pass-rate band (nor has a passing rollout for SFT). What it can learn from honestly is
    the turn critic: its turn rewards give Â_turn within each group, so with the band opened to 0-100%
    the all-failed groups are kept (Â_outcome = 0) and train on λ·Â_turn alone, a real nonzero update."""
    questions = out.parent / "questions.jsonl"
    questions.write_text(QUESTIONS)
    settings = RunSettings(
        llm=LLMConfig(model=str(tiny), max_tokens=8, temperature=1.0),
        agent=AgentConfig(max_turns=1),
        backend=BackendConfig(backend="transformers"),
        tools=ToolsConfig(default_servers=False),
    )
    critic_endpoint = dataclasses.replace(
        CRITIC_ENDPOINT, base_url=critic.base_url, model="critic", retries=0, retry_wait_s=0.0
    )
    judge = JudgeRunConfig(critic=critic_endpoint, concurrency=1)
    options = {
        "steps": 1,
        "step_tokens": 4000,
        "micro_tokens": 4000,
        "lr": 1e-3,
        "groups": GroupRule(min_pass_rate=0.0, max_pass_rate=1.0),
    } | train
    return LoopConfig(
        iterations=iterations,
        out=out,
        questions=questions,
        settings=settings,
        judge=judge,
        train=TrainConfig(data=[], model=str(tiny), out=out, **options),
        group_size=4,
        collect_concurrency=2,
        sync="none",
    )


def stamps(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def token_mode_server(tokenizer: Any, policy: Any) -> FakeOpenAI:
    """A loopback vLLM in token mode, with the tiny model's tokenizer, whose scripted POLICY answers."""
    return FakeOpenAI(
        policy,
        vllm=True,
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )


def test_two_iterations_in_process_and_a_second_call_only_does_the_second(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "loop"
    seen: list[tuple[str, list[list[str]]]] = []  # each loop notice, with the stages the state file then held

    def notice(text: str) -> None:
        if text.startswith("loop: "):
            state = json.loads((out / "loop.json").read_text())
            done = [[s for s in e if s not in ("iteration", "policy", "seconds")] for e in state["iterations"]]
            seen.append((text, done))

    with FakeOpenAI(alternating_critic()) as critic:
        first = asyncio.run(run_loop(in_process_loop(tiny, out, critic, 1), notice))
        before = stamps(out / "iter-1")
        second = asyncio.run(run_loop(in_process_loop(tiny, out, critic, 2), notice))
    assert [stages for _, stages in seen] == [
        [["collected"]],
        [["collected", "judged"]],
        [["collected", "judged", "trained"]],
        [["collected", "judged", "trained", "synced"]],
    ] + [
        [["collected", "judged", "trained", "synced"], done]
        for done in (
            ["collected"],
            ["collected", "judged"],
            ["collected", "judged", "trained"],
            ["collected", "judged", "trained", "synced"],
        )
    ]
    assert all("iteration 2" in text for text, _ in seen[4:])  # the second call did iteration 2 alone
    assert stamps(out / "iter-1") == before  # iteration 1 untouched: not collected, judged or trained again
    [one] = first["iterations"]
    assert one.pop("seconds") > 0  # the wall time of its stages, summed
    checkpoint = out / "iter-1" / "train" / "checkpoint-1"
    assert one == {
        "iteration": 1,
        "model": str(tiny),
        "rollouts": 8,
        "mean_reward": 0.0,
        "pass_rate": 0.0,
        "tool_use": 0.0,  # the tiny model calls no tool: its answers are noise
        "train_steps": 1,
        "checkpoint": str(checkpoint.resolve()),
        "synced_model": str(checkpoint.resolve()),
    }
    assert {**second["iterations"][0], "seconds": 0} == {**one, "seconds": 0}
    assert second["iterations"][1]["model"] == str(checkpoint.resolve())
    for trajectory in load_trajectories(out / "iter-2" / "rollouts.jsonl"):  # sampled by iteration 1's policy
        assert trajectory.model == trajectory.policy_version == str(checkpoint.resolve())
    state = json.loads((out / "loop.json").read_text())
    final = out / "iter-2" / "train" / "checkpoint-1"
    assert state["policy"] == {"model": str(final.resolve()), "checkpoint": str(final.resolve()), "version": "iter-2"}
    start, middle, end = weights(tiny), weights(checkpoint), weights(final)
    assert any((start[n] != middle[n]).any() for n in start)  # the critic's turn rewards trained the model
    assert any((middle[n] != end[n]).any() for n in start)  # and iteration 2 went on from there


def test_a_failed_stage_stops_the_loop_and_the_next_call_resumes_it(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "loop"
    with FakeOpenAI([], default=Reply(status=401)) as critic:  # a critic without our key: judging stops
        with pytest.raises(LoopError, match=r"iteration 1, judge: .*401.* run the same loop again to resume"):
            asyncio.run(run_loop(in_process_loop(tiny, out, critic, 1, save_every=1, steps=2), print))
    state = json.loads((out / "loop.json").read_text())
    assert list(state["iterations"][0]) == ["iteration", "policy", "collected", "seconds"]
    assert list(state["iterations"][0]["seconds"]) == ["collected"]  # the failed stage's time is not recorded
    rollouts = stamps(out / "iter-1")["rollouts.jsonl"]
    with FakeOpenAI(alternating_critic()) as critic:
        asyncio.run(run_loop(in_process_loop(tiny, out, critic, 1, save_every=1, steps=2), print))
        assert stamps(out / "iter-1")["rollouts.jsonl"] == rollouts  # collect was not run again
        # as if killed during training's second step: its checkpoint and the stages after it never happened
        import shutil

        shutil.rmtree(out / "iter-1" / "train" / "checkpoint-2")
        state = json.loads((out / "loop.json").read_text())
        del state["iterations"][0]["trained"], state["iterations"][0]["synced"]
        (out / "loop.json").write_text(json.dumps(state))
        summary = asyncio.run(run_loop(in_process_loop(tiny, out, critic, 1, save_every=1, steps=2), print))
    steps = [json.loads(line)["step"] for line in (out / "iter-1" / "train" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # training went on from checkpoint-1; the lost step's line is logged once
    assert summary["iterations"][0]["checkpoint"].endswith("checkpoint-2")
    with pytest.raises(LoopError, match="already holds a loop"):
        asyncio.run(run_loop(in_process_loop(tiny, out, critic, 1), print, resume=False))


def test_lora_adapters_are_hot_loaded_and_the_next_iteration_samples_from_them(tiny: Path, tmp_path: Path) -> None:
    """Against a loopback vLLM in token mode, whose scripted policy answers the first two rollouts of each
    question right: a real GRPO signal (pass rate 50%) with the default band."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tokenizer = load_tokenizer(str(tiny))[0]
    out = tmp_path / "loop"
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS)
    with token_mode_server(tokenizer, first_two_right(tokenizer)) as server:
        settings = RunSettings(
            llm=LLMConfig(base_url=server.base_url, model=str(tiny), max_tokens=64, temperature=1.0),
            agent=AgentConfig(max_turns=1, summary_turn=False),
            backend=BackendConfig(backend="openai", base_url_given=True, token_mode=True),
            tools=ToolsConfig(default_servers=False),
        )
        # the scripted policy is not the tiny model, so its rollouts are off-policy for the trainer
        train = TrainConfig(
            data=[],
            model=str(tiny),
            out=out,
            steps=1,
            step_tokens=4000,
            micro_tokens=4000,
            lr=1e-3,
            lora_rank=4,
            off_policy=True,
        )
        config = LoopConfig(
            iterations=2,
            out=out,
            questions=questions,
            settings=settings,
            judge=JudgeRunConfig(no_critic=True),
            train=train,
            group_size=4,
            sync="lora",
        )
        summary = asyncio.run(run_loop(config, print))
    first, second = (out / f"iter-{i}" / "train" / "checkpoint-1" for i in (1, 2))
    assert server.lora_requests == [
        {"lora_name": str(c.resolve()), "lora_path": str((c / "adapter").resolve())} for c in (first, second)
    ]
    assert [s["mean_reward"] for s in summary["iterations"]] == [0.5, 0.5]
    assert {r["model"] for r in server.requests} == {str(tiny), str(first.resolve())}
    for trajectory in load_trajectories(out / "iter-2" / "rollouts.jsonl"):  # the adapter's path, as vLLM lists it
        assert trajectory.policy_version == str((first / "adapter").resolve())
    assert_the_second_adapter_went_on_from_the_first(first, second)


def first_two_right(tokenizer: Any) -> Any:
    """A scripted policy that answers the first two rollouts of each question, for each model, right."""
    answered: dict[tuple[str, str], int] = {}
    lock = threading.Lock()

    def policy(request: dict[str, Any]) -> str:
        prompt = tokenizer.decode(request["prompt"])
        question = "a" if "2+2" in prompt else "b"
        with lock:
            n = answered[request["model"], question] = answered.get((request["model"], question), 0) + 1
        right = {"a": "4", "b": "red"}[question]
        return mcp_answer(right if n <= 2 else "nothing")

    return policy


def assert_the_second_adapter_went_on_from_the_first(first: Path, second: Path) -> None:
    # iteration 2 went on training iteration 1's adapter on the base model, from where it was
    import safetensors.torch

    before = safetensors.torch.load_file(first / "adapter" / "adapter_model.safetensors")
    after = safetensors.torch.load_file(second / "adapter" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and any((before[k] != after[k]).any() for k in before)
    # with iteration 1's optimizer state too: AdamW has counted both iterations' steps
    import torch

    state = torch.load(second / "trainer-state-rank0.pt", weights_only=True)["optimizer"]["state"]
    assert {float(p["step"]) for p in state.values()} == {2.0}


def test_load_adapter_posts_the_absolute_path_once_and_names_the_fix_when_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    adapter = Path("ckpt") / "adapter"
    with FakeOpenAI([], vllm=True) as server:
        asyncio.run(load_adapter(server.base_url, "policy-1", adapter))
        asyncio.run(load_adapter(server.base_url, "policy-1", adapter))  # a resumed sync: already loaded
        assert server.lora_requests == [{"lora_name": "policy-1", "lora_path": str(tmp_path / "ckpt" / "adapter")}]
        models = {m["id"]: m for m in httpx.get(server.base_url + "/models").json()["data"]}
        assert models["policy-1"]["root"] == str(tmp_path / "ckpt" / "adapter") and models["policy-1"]["parent"]
        with pytest.raises(
            SyncError,
            match=r"HTTP 400 The lora adapter 'policy-1' has already been loaded.*"
            r"--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
        ):
            asyncio.run(load_adapter(server.base_url, "policy-1", Path("other")))
    with pytest.raises(SyncError, match="cannot reach the model server"):
        asyncio.run(load_adapter(server.base_url, "policy-2", adapter))


def test_a_loop_that_cannot_sync_is_refused_before_anything_runs(tiny: Path, tmp_path: Path) -> None:
    with FakeOpenAI([]) as critic:
        config = in_process_loop(tiny, tmp_path / "loop", critic, 1)
    with pytest.raises(LoopError, match="the in-process backend has none: use sync none"):
        asyncio.run(
            run_loop(
                dataclasses.replace(config, sync="lora", train=dataclasses.replace(config.train, lora_rank=4)), print
            )
        )
    with pytest.raises(LoopError, match="train with a LoRA rank, or use sync none"):
        asyncio.run(run_loop(dataclasses.replace(config, sync="lora"), print))
    assert not (tmp_path / "loop").exists()


@pytest.mark.slow
def test_the_loop_command_and_train_loop_run_the_same_loop_from_their_flags(tmp_path: Path) -> None:
    import subprocess
    import sys

    nanbeige = str(Path(sys.executable).parent / "nanbeige")
    tiny = make_tiny_model(tmp_path / "tiny")
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "a", "question": "What is 2+2?", "answer": "4"}\n')
    # the tiny model's answers are noise: every outcome is 0, so the band is opened to keep the group
    flags = [
        "--questions",
        str(questions),
        "-G",
        "2",
        "--model",
        str(tiny),
        "--backend",
        "transformers",
        "--no-default-servers",
        "--no-critic",
        "--sync",
        "none",
        "--min-pass-rate",
        "0",
        "--max-pass-rate",
        "1",
        "--step-tokens",
        "100000",
        "--seed",
        "1",
    ]
    runs = {
        name: one_iteration([nanbeige, *spelled, *flags, "--out", str(tmp_path / name)], tmp_path / name)
        for name, spelled in (("loop", ["loop", "--iterations", "1"]), ("train", ["train", "--loop", "1"]))
    }
    # the same files and the same stages, each spelling in its own folder
    assert runs["loop"][0] == runs["train"][0]
    assert runs["loop"][2] == runs["train"][2]
    # the old spelling says once, at the end, that the loop is its own command now
    assert "nanbeige loop" not in runs["loop"][1]
    assert "nanbeige loop --iterations N" in runs["train"][1].strip().splitlines()[-1]
    missing = subprocess.run(
        [nanbeige, "train", "--loop", "1", "--model", str(tiny), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "--loop needs --questions" in missing.stderr


def one_iteration(command: list[str], out: Path) -> tuple[list[str], str, tuple[Any, ...]]:
    """Runs a one-iteration loop command into OUT: the files it wrote, its stderr, and its state's stages."""
    import subprocess

    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    state = json.loads((out / "loop.json").read_text())
    [iteration] = state["iterations"]
    assert {"collected", "judged", "trained", "synced"} <= set(iteration)
    assert iteration["collected"]["rollouts"] == 2 and Path(iteration["trained"]["checkpoint"]).is_dir()
    assert "iteration 1: 2 rollouts" in result.stderr
    files = sorted(
        re.sub(r"tfevents\..*", "tfevents", str(path.relative_to(out)))  # named by time and host
        for path in out.rglob("*")
        if path.is_file()
    )
    stages = {stage: sorted(record) for stage, record in iteration.items() if isinstance(record, dict)}
    return files, result.stderr, (state["sync"], state["policy"]["version"], stages)
