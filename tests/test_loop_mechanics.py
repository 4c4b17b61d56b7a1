"""The mechanics a learning curve of the loop depends on, checked on CPU in under a minute with the tiny model (the
curve itself is tests/benchmarks/learning.py's):

1. the policy collect samples from changes each iteration and is the one just trained: every token iteration 2
   sampled has the logprob iteration 1's checkpoint gives it, computed by the trainer's own function, and not
   the base model's;
2. the trained tokens are the model's own replies, the tool call and the answer, never the tool's result; a
   rewarded rollout's with a positive advantage, a failed one's with a negative one.

The third, that a rewarded rollout's tokens become more likely after a step, is
tests/test_code_rl_end_to_end.py::test_two_grpo_steps_on_the_judged_rollouts_move_the_policy_that_sampled_them."""

from __future__ import annotations

import asyncio
import itertools
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from test_train_loop import alternating_critic, token_mode_server
from tiny_model import make_tiny_model

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.run.tokens import iter_prompts
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.collect import CollectConfig, collect
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.rewards import judge_file
from nanbeige.trainer.rollouts import read_samples
from nanbeige.trainer.train import TrainConfig

pytestmark = pytest.mark.slow

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
QUESTIONS = (
    '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'
    '{"id": "b", "question": "Name a colour.", "answer": "red"}\n'
)
SAME_POLICY = 1e-4
"""How far the sampler's logprob of a token may be from the trainer's under the policy that sampled it: both are
float32 on this CPU (measured: 9.5e-7 at most, over about 300 tokens an iteration). Under a policy one step of
training away the largest gap measured 0.21 to 0.44."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------- 1. the policy served is the one just trained


def sampler_gaps(folder: Path, rollouts: dict[int, list[Trajectory]]) -> dict[int, float]:
    """By iteration: the largest |sampler's logprob - trainer's logprob under the model in FOLDER| over every
    token its rollouts sampled (rolled-back replies too: the same policy sampled them). The trainer's logprobs are
    `token_logprobs`, which its π_old and its loss use, at the rollouts' temperature."""
    import torch
    import transformers

    from nanbeige.trainer.loss import token_logprobs

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gaps = dict.fromkeys(rollouts, 0.0)
    with torch.no_grad():
        for iteration, trajectories in rollouts.items():
            for trajectory in trajectories:
                temperature = trajectory.sampling["temperature"]
                for turn, prompt in iter_prompts(trajectory.turns):
                    ids = torch.tensor([prompt + turn.completion_ids])
                    found = token_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], temperature=temperature)
                    sampled = torch.tensor(turn.logprobs)  # None (no sampler's logprobs) fails here, as it should
                    gap = (found[0, len(prompt) - 1 :] - sampled).abs().max().item()
                    gaps[iteration] = max(gaps[iteration], gap)
    return gaps


def run_loop_command(tiny: Path, tmp_path: Path, critic_url: str) -> Path:
    """`nanbeige loop`, two iterations in process (sync none) on two questions, G=2. The tiny model's answers are
    noise, so every outcome is 0: the scripted turn critic's scores (1.0 and 0.5 alternately) and the band opened
    to 0-100% give each iteration a real nonzero update (tests/test_train_loop.py's `in_process_loop`)."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS)
    out = tmp_path / "loop"
    flags = ["--iterations", "2", "--questions", str(questions), "-G", "2", "--model", str(tiny), "--out", str(out)]
    flags += ["--backend", "transformers", "--no-default-servers", "--max-turns", "1", "--max-tokens", "8"]
    flags += ["--temperature", "1.0", "--critic-base-url", critic_url, "--sync", "none"]
    flags += ["--min-pass-rate", "0", "--max-pass-rate", "1", "--steps", "1", "--lr", "1e-3", "--seed", "1"]
    done = subprocess.run([NANBEIGE, "loop", *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_each_iteration_samples_the_policy_the_iteration_before_it_just_trained(tiny: Path, tmp_path: Path) -> None:
    with FakeOpenAI(alternating_critic()) as critic:
        out = run_loop_command(tiny, tmp_path, critic.base_url)
    first, second = json.loads((out / "loop.json").read_text())["iterations"]
    trained = [Path(entry["trained"]["checkpoint"]) for entry in (first, second)]
    assert trained == [(out / f"iter-{i}" / "train" / "checkpoint-1").resolve() for i in (1, 2)]
    # the loop's record of what each iteration sampled: the base model, then iteration 1's checkpoint
    assert first["policy"] == {"model": str(tiny), "checkpoint": None, "version": "iter-0"}
    assert second["policy"] == {"model": str(trained[0]), "checkpoint": str(trained[0]), "version": "iter-1"}
    rollouts = {i: load_trajectories(out / f"iter-{i}" / "rollouts.jsonl") for i in (1, 2)}
    assert {t.policy_version for t in rollouts[1]} == {str(tiny)} and len(rollouts[1]) == 4
    assert {t.policy_version for t in rollouts[2]} == {str(trained[0])} and len(rollouts[2]) == 4
    # and what the tokens themselves say sampled them: the trainer's logprobs of them under each policy
    policies = {"base": tiny, "iter-1": trained[0], "iter-2": trained[1]}
    gaps = {name: sampler_gaps(folder, rollouts) for name, folder in policies.items()}
    assert gaps["base"][1] < SAME_POLICY and gaps["iter-1"][1] > 100 * SAME_POLICY
    assert gaps["iter-1"][2] < SAME_POLICY and gaps["base"][2] > 100 * SAME_POLICY
    assert gaps["iter-2"][2] > 100 * SAME_POLICY  # iteration 2 trained a policy again new: the next one to serve


# ---------------------------------------------------------------- 2. what is trained: the replies, not the tool


def calls_then_answers(tokenizer: Any, right: str, wrong: str) -> Any:
    """A scripted policy that reads a page with the test server's `page` tool, then answers: the first two
    answers it gives RIGHT, the others WRONG."""
    answers = iter([right, right])
    lock = threading.Lock()

    def policy(request: dict[str, Any]) -> str:
        if tokenizer.decode(request["prompt"]).count("<|im_start|>assistant") == 1:  # the run's first reply
            return mcp_call("testkit", "page", {"topic": "sums"}, thought="Let me read about sums.")
        with lock:
            return mcp_answer(next(answers, wrong))

    return policy


async def collect_and_judge(tiny: Path, tmp_path: Path, server_url: str) -> Path:
    """The loop's collect and judge stages on one question, G=4, in token mode against the scripted server, with
    the test MCP server as the tool: the rollouts in `rollouts.jsonl`, graded by exact match into `judged.jsonl`."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS.splitlines()[0] + "\n")
    settings = RunSettings(
        llm=LLMConfig(base_url=server_url, model=str(tiny), max_tokens=128, temperature=1.0),
        agent=AgentConfig(max_turns=3, summary_turn=False),
        backend=BackendConfig(backend="openai", base_url_given=True, token_mode=True),
        tools=ToolsConfig(mcp=["testkit=" + shlex.join(TEST_SERVER)], default_servers=False),
    )
    config = CollectConfig(out=tmp_path / "rollouts.jsonl", questions=questions, group_size=4, concurrency=4)
    summary = await collect(config, settings, print)
    assert summary["rollouts"] == 4 and not summary["failed"]
    await judge_file(tmp_path / "rollouts.jsonl", tmp_path / "judged.jsonl", JudgeRunConfig(no_critic=True))
    return tmp_path / "judged.jsonl"


def trained_ids(sample: Any) -> list[int]:
    return [token for token, trained in zip(sample.ids, sample.loss_mask) if trained]


def positions_of(tokenizer: Any, ids: list[int], text: str) -> list[int]:
    """The positions in IDS of the tokens that spell TEXT (its first occurrence in their decoded text), each
    token decoded alone: the row's ids as they are, not a re-tokenization of the text."""
    pieces = [tokenizer.decode([token]) for token in ids]
    start = "".join(pieces).index(text)
    ends = list(itertools.accumulate(len(piece) for piece in pieces))
    return [i for i, end in enumerate(ends) if start < end and end - len(pieces[i]) < start + len(text)]


def test_the_trainer_trains_the_tool_call_and_the_answer_and_never_the_tool_result(tiny: Path, tmp_path: Path) -> None:
    """Through the loop's own path (collect with a real MCP tool, judge by exact match, the trainer's rows), where
    tests/test_trainer_data.py checks `samples_from` on hand-made ids and tests/test_training_rows.py the rows of
    a token-mode run that nothing judged: here the tool result is found in the row by its text."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tokenizer = load_tokenizer(str(tiny))[0]
    with token_mode_server(tokenizer, calls_then_answers(tokenizer, "4", "5")) as server:
        judged = asyncio.run(collect_and_judge(tiny, tmp_path, server.base_url))
    trajectories = {t.id: t for t in load_trajectories(judged)}
    assert sorted(t.reward for t in trajectories.values()) == [0.0, 0.0, 1.0, 1.0]  # the grader's verdicts
    # the rows the trainer reads (with GRPO's default band: 2 of 4 pass)
    samples, _, _ = read_samples(TrainConfig(data=[judged], model=str(tiny), out=tmp_path / "train"))
    assert sorted(s.trajectory_id for s in samples) == sorted(trajectories)  # one row each: nothing rewritten

    def tokens(text: str) -> list[int]:  # a reply as the server sampled it: its text's ids, then the stop token
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [server.stop_id]

    call = tokens(mcp_call("testkit", "page", {"topic": "sums"}, thought="Let me read about sums."))
    for sample in samples:
        trajectory = trajectories[sample.trajectory_id]
        [result] = trajectory.turns[0].tool_results
        assert result.text.startswith("sums: ") and not result.is_error  # the real tool answered
        answer = tokens(mcp_answer("4" if trajectory.reward else "5"))
        # exactly the model's two replies are trained: the tool's result, read in between, is not
        assert trained_ids(sample) == call + answer
        read = positions_of(tokenizer, sample.ids, result.text)  # the result as the model read it, in the row ...
        assert read and all(sample.loss_mask[i] == 0 for i in read)  # ... with no loss on any of its tokens
        assert not set(result.text.split()[1:]) & set(tokenizer.decode(trained_ids(sample)).split())
        # the answer's advantage: up for the rewarded rollouts, down for the failed ones
        at = len(sample.ids) - len(answer)
        assert sample.ids[at:] == answer
        assert all((a > 0) if trajectory.reward else (a < 0) for a in sample.advantages[at:])
