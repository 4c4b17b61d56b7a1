"""`train --loop` over several vLLM engines: each new policy is synced to every engine (a LoRA adapter
hot-loaded, or full weights reloaded in place), an iteration is synced only when every engine says it
serves the new policy, a rerun syncs only the engines that lack it, and collection does not start while
the engines serve different policies. The engines are loopback fakes that answer as the recorded vLLM did
(tests/golden/vllm_sync/, `fake_vllm_engine.py`)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI, mcp_answer
from fake_vllm_engine import GOLDEN, FakeEngine
from tiny_model import make_tiny_model
from typer.testing import CliRunner

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli.program import app
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.loop_config import LoopConfig, LoopError
from nanbeige.trainer.loop_state import read_state
from nanbeige.trainer.rl_loop import run_loop
from nanbeige.trainer.train import TrainConfig

QUESTIONS = (
    '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'
    '{"id": "b", "question": "Name a colour.", "answer": "red"}\n'
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def half_right(tiny: Path) -> dict[str, Any]:
    """A scripted policy answering the first two rollouts of each question (per model asked) right, the
    others wrong (a 50% pass rate: a GRPO signal), and what token mode needs to talk to it."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tokenizer = load_tokenizer(str(tiny))[0]
    answered: dict[tuple[str, str], int] = {}
    lock = threading.Lock()

    def policy(request: dict[str, Any]) -> str:
        question = "a" if "2+2" in tokenizer.decode(request["prompt"]) else "b"
        with lock:
            n = answered[request["model"], question] = answered.get((request["model"], question), 0) + 1
        return mcp_answer({"a": "4", "b": "red"}[question] if n <= 2 else "nothing")

    return {
        "replies": policy,
        "tokenize": lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        "stop_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }


def loop_for(tiny: Path, out: Path, urls: list[str], iterations: int, sync: str, **loop: Any) -> LoopConfig:
    """A loop of one-turn rollouts in token mode, collected from `urls` (the first its base URL)."""
    questions = out.parent / "questions.jsonl"
    questions.write_text(QUESTIONS)
    settings = RunSettings(
        llm=LLMConfig(
            base_url=urls[0], more_base_urls=tuple(urls[1:]), model=str(tiny), max_tokens=64, temperature=1.0
        ),
        agent=AgentConfig(max_turns=1, summary_turn=False),
        backend=BackendConfig(backend="openai", base_url_given=True, token_mode=True),
        tools=ToolsConfig(default_servers=False),
    )
    # the scripted policy is not the tiny model: its rollouts are off-policy for the trainer
    train = TrainConfig(
        data=[],
        model=str(tiny),
        out=out,
        steps=1,
        step_tokens=4000,
        micro_tokens=4000,
        lr=1e-3,
        lora_rank=4 if sync == "lora" else 0,
        off_policy=True,
    )
    return LoopConfig(
        iterations=iterations,
        out=out,
        questions=questions,
        settings=settings,
        judge=JudgeRunConfig(no_critic=True),
        train=train,
        group_size=4,
        sync=sync,
        **loop,
    )


def root(engine: FakeOpenAI) -> str:
    return engine.base_url.removesuffix("/v1")


def test_the_fake_engine_answers_the_recorded_calls_as_vllm_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call of the recorded exchange, in its order, against the fake: the same status and body (the
    recorded paths are relative, so the fake runs where they name real folders)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoint-1").mkdir()
    with FakeEngine() as engine:
        for name, call in GOLDEN.items():
            answer = httpx.request(call["method"], root(engine) + call["path"], json=call["request"])
            assert answer.status_code == call["status"], name
            if name.startswith("models"):  # another model; an adapter is listed as vLLM lists one
                recorded = json.loads(call["response_text"])["data"]
                listed = answer.json()["data"]
                assert [(m["owned_by"], m["root"], m["parent"]) for m in listed[1:]] == [
                    (m["owned_by"], m["root"], m["parent"].replace("smollm2", "fake-model")) for m in recorded[1:]
                ]
            elif name == "load_lora_adapter_again":  # the same refusal, in fewer words
                assert recorded_words(call).startswith(answer.json()["error"]["message"])
            elif name == "load_lora_adapter":
                assert answer.text == call["response_text"]
            else:
                assert answer.json() == json.loads(call["response_text"]), name
    assert engine.admin_calls == [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
        "/collective_rpc",
        "/resume",
    ]


def recorded_words(call: dict[str, Any]) -> str:
    return json.loads(call["response_text"])["error"]["message"]


def test_three_engines_behind_a_router_one_refusing_the_adapter(tiny: Path, tmp_path: Path) -> None:
    """Collection goes through a router (the only base URL); the adapters go to the engines behind it
    (`admin_urls`). One engine was started without runtime LoRA updates: the iteration is not synced, and
    the rerun, once it takes adapters, loads the adapter there alone. Later that engine restarts, losing its
    adapters: the next iteration's collection does not start, and the rerun loads it there again."""
    out = tmp_path / "loop"
    script = half_right(tiny)
    with (
        FakeOpenAI(script.pop("replies"), vllm=True, **script) as router,
        FakeEngine() as one,
        FakeEngine() as two,
        FakeEngine() as three,
    ):
        admin = tuple(e.base_url for e in (one, two, three))  # /v1 or not: the same engine
        three.broken = "lora"
        with pytest.raises(
            LoopError,
            match=r"iteration 1, sync: 1 of 3 engines did not take the new policy: the "
            rf"model server at {root(three)} refused the LoRA adapter .*HTTP 404",
        ):
            asyncio.run(run_loop(loop_for(tiny, out, [router.base_url], 1, "lora", admin_urls=admin), print))
        state = json.loads((out / "loop.json").read_text())
        assert "trained" in state["iterations"][0] and "synced" not in state["iterations"][0]
        assert state["engines"] == {root(one): "iter-1", root(two): "iter-1"}
        checkpoint = state["iterations"][0]["trained"]["checkpoint"]
        assert one.adapters == two.adapters == {checkpoint: str(Path(checkpoint) / "adapter")}

        three.broken = None  # restarted with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
        asyncio.run(run_loop(loop_for(tiny, out, [router.base_url], 1, "lora", admin_urls=admin), print))
        assert [len(e.lora_requests) for e in (one, two, three)] == [1, 1, 2]  # the rerun loaded three alone
        state = json.loads((out / "loop.json").read_text())
        assert state["iterations"][0]["synced"]["model"] == checkpoint == state["policy"]["model"]
        assert state["engines"] == {root(e): "iter-1" for e in (one, two, three)}

        two.restart()  # its adapters are gone
        with pytest.raises(
            LoopError,
            match=rf"iteration 2, collect: .*{root(two)} serves no adapter {checkpoint}\); "
            "iteration 1 is no longer synced: run the same loop again",
        ):
            asyncio.run(run_loop(loop_for(tiny, out, [router.base_url], 2, "lora", admin_urls=admin), print))
        assert not (out / "iter-2" / "rollouts.jsonl").exists()
        assert checkpoint not in {r["model"] for r in router.requests}  # nothing sampled from a mixed policy
        state = json.loads((out / "loop.json").read_text())
        assert "synced" not in state["iterations"][0] and state["engines"][root(two)] is None

        summary = asyncio.run(run_loop(loop_for(tiny, out, [router.base_url], 2, "lora", admin_urls=admin), print))
        # iteration 1's adapter again into two alone, then iteration 2's into each
        assert [len(e.lora_requests) for e in (one, two, three)] == [2, 3, 3]
    assert [s["mean_reward"] for s in summary["iterations"]] == [0.5, 0.5]
    for trajectory in load_trajectories(out / "iter-2" / "rollouts.jsonl"):
        assert trajectory.model == checkpoint  # sampled from iteration 1's adapter, through the router


def test_three_engines_of_a_pool_one_failing_to_reload_the_weights(tiny: Path, tmp_path: Path) -> None:
    """Full weights to the engines of the pool itself (every base URL). Before the first iteration every
    engine must report the same weights; after a reload, the checkpoint's path as its weight version. One
    engine cannot read the checkpoint (its disk is another machine's): not synced; the rerun reloads it alone."""
    out = tmp_path / "loop"
    script = half_right(tiny)
    with FakeEngine(**script) as one, FakeEngine(**script) as two, FakeEngine(**script) as three:
        urls = [e.base_url for e in (one, two, three)]
        two.weight_version = str(tmp_path / "another-loop" / "checkpoint-9")  # left by another run
        with pytest.raises(
            LoopError,
            match=rf"iteration 1, collect: .*{root(two)} serves weights "
            r"'.*another-loop.*'\); start every engine on the same model",
        ):
            asyncio.run(run_loop(loop_for(tiny, out, urls, 1, "weights"), print))
        assert not any(e.requests for e in (one, two, three))  # nothing was collected

        two.restart()
        two.broken = "reload"
        with pytest.raises(
            LoopError,
            match=rf"1 of 3 engines did not take the new policy: the model server at "
            rf"{root(two)} could not reload the weights .*HTTP 500 Call to "
            "collective_rpc method failed",
        ):
            asyncio.run(run_loop(loop_for(tiny, out, urls, 1, "weights"), print))
        checkpoint = json.loads((out / "loop.json").read_text())["iterations"][0]["trained"]["checkpoint"]
        assert (one.weight_version, two.weight_version, three.weight_version) == (checkpoint, "default", checkpoint)
        full = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
        assert (one.admin_calls, two.admin_calls, three.admin_calls) == (
            full,
            ["/pause", "/collective_rpc", "/resume"],
            full,
        )

        two.broken = None
        summary = asyncio.run(run_loop(loop_for(tiny, out, urls, 1, "weights"), print))
        assert (one.admin_calls, three.admin_calls) == (full, full)  # asked, not reloaded again
        assert two.admin_calls[3:] == full and two.weights_path == checkpoint
    state = json.loads((out / "loop.json").read_text())
    assert summary["iterations"][0]["synced_model"] == str(tiny)  # the same served model, new weights
    assert state["iterations"][0]["synced"]["checkpoint"] == checkpoint
    assert state["engines"] == {root(e): "iter-1" for e in (one, two, three)}


def test_an_engines_record_of_the_wrong_type_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "loop.json").write_text(
        json.dumps(
            {
                "policy": {"model": "m", "checkpoint": None, "version": "iter-0"},
                "iterations": [],
                "engines": {"http://127.0.0.1:1": 3},
            }
        )
    )
    with pytest.raises(LoopError, match=r"`engines\['http://127.0.0.1:1'\]` must be text or null, not 3"):
        read_state(tmp_path, "m")
    (tmp_path / "loop.json").write_text(
        json.dumps(
            {
                "policy": {"model": "m", "checkpoint": None, "version": "iter-0"},
                "iterations": [],
                "engines": ["http://127.0.0.1:1"],
            }
        )
    )
    with pytest.raises(LoopError, match="`engines` must be an object, not a list"):
        read_state(tmp_path, "m")


def test_admin_urls_are_flags_of_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[LoopConfig] = []
    monkeypatch.setattr("nanbeige.agent.cli.train_commands.run_train_loop", loops.append)
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS)
    base = [
        "train",
        "--model",
        "m",
        "--out",
        str(tmp_path / "loop"),
        "--loop",
        "1",
        "--no-critic",
        "--questions",
        str(questions),
        "--lora-rank",
        "4",
        "--base-url",
        "http://127.0.0.1:9/v1",
    ]
    result = CliRunner().invoke(
        app, [*base, "--admin-url", "http://127.0.0.1:10", "--admin-url", "http://127.0.0.1:11/v1"]
    )
    assert result.exit_code == 0, result.output
    assert loops[0].admin_urls == ("http://127.0.0.1:10", "http://127.0.0.1:11/v1")
    for flags, words in (
        (["--admin-url", "127.0.0.1:10"], "is not an http:// or https:// address"),
        (["--admin-url", "http://127.0.0.1:10", "--sync", "none"], "--sync none syncs none"),
    ):
        refused = CliRunner().invoke(app, [*base, *flags])
        assert refused.exit_code == 2 and words in refused.output, refused.output
    alone = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            "m",
            "--out",
            str(tmp_path / "t"),
            "--data",
            "x.jsonl",
            "--admin-url",
            "http://127.0.0.1:10",
        ],
    )
    assert alone.exit_code == 2 and "it needs --loop" in alone.output


def test_the_command_refuses_to_collect_in_one_line_while_the_engines_differ(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS)
    with FakeEngine() as one, FakeEngine() as two:
        two.weight_version = "/elsewhere/checkpoint-3"
        result = CliRunner().invoke(
            app,
            [
                "train",
                "--loop",
                "1",
                "--sync",
                "weights",
                "--questions",
                str(questions),
                "--model",
                "m",
                "--out",
                str(tmp_path / "loop"),
                "--no-critic",
                "--no-default-servers",
                "--base-url",
                one.base_url,
                "--admin-url",
                one.base_url,
                "--admin-url",
                two.base_url,
            ],
        )
        assert not one.requests and not two.requests
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = [text for text in result.output.splitlines() if text.strip()]
    assert f"{root(two)} serves weights '/elsewhere/checkpoint-3'" in line and "collection does not start" in line
