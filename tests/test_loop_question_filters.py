"""The RL loop's choice of what to train on, with a scripted policy behind a loopback vLLM: dynamic sampling
draws questions until a group is informative, and on code problems the paper's difficulty filter keeps only
the problem the policy solves sometimes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, mcp_answer
from test_train_loop import tiny, token_mode_server  # noqa: F401 (tiny: the fixture)

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.loop_config import LoopConfig, LoopError
from nanbeige.trainer.rl_loop import run_loop
from nanbeige.trainer.train import TrainConfig
from nanbeige.trainer.train_config import GroupRule


def scripted_loop(tiny: Path, tmp_path: Path, server: FakeOpenAI, out: Path, **loop: Any) -> LoopConfig:
    questions = tmp_path / "pool.jsonl"
    questions.write_text(
        '{"id": "easy", "question": "What is 2+2?", "answer": "4"}\n'
        '{"id": "hard", "question": "Name a colour.", "answer": "red"}\n'
        '{"id": "fair", "question": "Name a fruit.", "answer": "apple"}\n'
    )
    settings = RunSettings(
        llm=LLMConfig(base_url=server.base_url, model=str(tiny), max_tokens=64, temperature=1.0),
        agent=AgentConfig(max_turns=1, summary_turn=False),
        backend=BackendConfig(backend="openai", base_url_given=True, token_mode=True),
        tools=ToolsConfig(default_servers=False),
    )
    train = TrainConfig(
        data=[], model=str(tiny), out=out, steps=1, step_tokens=4000, micro_tokens=4000, lr=1e-3, off_policy=True
    )  # the scripted policy is not the tiny model
    return LoopConfig(
        out=out,
        questions=questions,
        settings=settings,
        judge=JudgeRunConfig(no_critic=True),
        train=train,
        group_size=4,
        sync="none",
        **loop,
    )


def easy_hard_and_fair(tokenizer: Any) -> Any:
    """A scripted policy that always answers `easy` right, never `hard`, and `fair` right 2 times of 4."""
    answered: dict[str, int] = {}
    lock = threading.Lock()

    def policy(request: dict[str, Any]) -> str:
        prompt = tokenizer.decode(request["prompt"])
        question = "easy" if "2+2" in prompt else "hard" if "colour" in prompt else "fair"
        with lock:
            n = answered[question] = answered.get(question, 0) + 1
        return mcp_answer({"easy": "4", "hard": "blue", "fair": "apple" if n <= 2 else "pear"}[question])

    return policy


def test_dynamic_sampling_draws_questions_until_a_group_is_informative(tiny: Path, tmp_path: Path) -> None:
    """A scripted policy that always answers `easy` right, never `hard`, and `fair` right 2 times of 4: with
    one question a draw, the loop draws easy (too easy), hard (too hard), then fair (inside the band)."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tokenizer = load_tokenizer(str(tiny))[0]
    notices: list[str] = []
    with token_mode_server(tokenizer, easy_hard_and_fair(tokenizer)) as server:
        config = scripted_loop(
            tiny,
            tmp_path,
            server,
            tmp_path / "loop",
            iterations=1,
            questions_per_iteration=1,
            min_informative_groups=1,
            max_draws=3,
        )
        asyncio.run(run_loop(config, notices.append))
        drawn = [json.loads(line)["id"] for line in (tmp_path / "loop" / "iter-1" / "questions.jsonl").open()]
        assert drawn == ["easy", "hard", "fair"]
        assert sum("drawing 1 more questions" in text for text in notices) == 2
        judged = json.loads((tmp_path / "loop" / "loop.json").read_text())["iterations"][0]["judged"]
        assert (judged["groups"], judged["informative_groups"], judged["questions"]) == (3, 1, 3)
        [step] = [json.loads(line) for line in (tmp_path / "loop" / "iter-1" / "train" / "metrics.jsonl").open()]
        assert step["groups"] == {
            "groups_read": 3,
            "groups_kept": 1,
            "groups_too_easy": 1,
            "groups_too_hard": 1,
            "groups_no_reward": 0,
        }
        # with two draws at most, no informative group is found: the trainer says there is nothing to train on
        capped = scripted_loop(
            tiny,
            tmp_path,
            server,
            tmp_path / "capped",
            iterations=1,
            questions_per_iteration=1,
            min_informative_groups=1,
            max_draws=2,
        )
        with pytest.raises(LoopError, match="iteration 1, train: nothing to train on"):
            asyncio.run(run_loop(capped, notices.append))
    drawn = [json.loads(line)["id"] for line in (tmp_path / "capped" / "iter-1" / "questions.jsonl").open()]
    assert drawn == ["easy", "hard"]


CODE_PROBLEMS = [
    {"id": "echo", "statement": "Print the line you read.", "tests": [{"input": "hi\n", "output": "hi\n"}]},
    {"id": "negate", "statement": "Print minus the integer.", "tests": [{"input": "3\n", "output": "-3\n"}]},
    {
        "id": "double",
        "statement": "Print twice the integer.",
        "tests": [{"input": "4\n", "output": "8\n"}, {"input": "0\n", "output": "0\n"}],
    },
]


def test_the_loop_runs_code_rl_with_the_papers_difficulty_filter(tiny: Path, tmp_path: Path) -> None:
    """`train --loop` on code problems: the questions are the problems, each program runs against its tests in
    the sandbox, and the paper's stage-1 filter (1 to 3 of 4 solved here) keeps only the problem a scripted
    policy solves sometimes: `echo` always (too easy), `negate` never (too hard), `double` 2 times of 4."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(row) + "\n" for row in CODE_PROBLEMS))
    tokenizer = load_tokenizer(str(tiny))[0]
    answered: dict[str, int] = {}
    lock = threading.Lock()
    programs = {"echo": "print(input())", "negate": "print(input())", "double": "print(2 * int(input()))"}

    def policy(request: dict[str, Any]) -> str:
        prompt = tokenizer.decode(request["prompt"])
        problem = "echo" if "line you read" in prompt else "negate" if "minus" in prompt else "double"
        with lock:
            n = answered[problem] = answered.get(problem, 0) + 1
        program = programs[problem] if problem != "double" or n <= 2 else "print(8)"
        return f"<think>\nWrite it.\n</think>\n\n```python\n{program}\n```\n\\boxed{{done}}"

    with token_mode_server(tokenizer, policy) as server:
        config = scripted_loop(tiny, tmp_path, server, tmp_path / "loop", iterations=1)
        judge = dataclasses.replace(config.judge, grader="code-tests", problems=problems)
        train = dataclasses.replace(config.train, groups=GroupRule(counts="solved", k_of_n=(1, 3, 4)))
        asyncio.run(run_loop(dataclasses.replace(config, questions=problems, judge=judge, train=train), lambda _: None))
    iteration = tmp_path / "loop" / "iter-1"
    drawn = [json.loads(line) for line in (iteration / "questions.jsonl").open()]
    assert [row["id"] for row in drawn] == ["echo", "negate", "double"]
    assert "one ```python code block" in drawn[0]["question"]  # asked as `collect --bench code` asks
    judged = load_trajectories(iteration / "judged.jsonl")
    solved = {problem: sorted(t.judge["solved"] for t in judged if t.group_id == problem) for problem in programs}
    assert solved == {"echo": [True] * 4, "negate": [False] * 4, "double": [False, False, True, True]}
    rewards = sorted(t.reward for t in judged if t.group_id == "double")
    assert rewards == [0.5, 0.5, 1.0, 1.0]  # "print(8)" passes one test of two
    [step] = [json.loads(line) for line in (iteration / "train" / "metrics.jsonl").open()]
    assert step["groups"] == {
        "groups_read": 3,
        "groups_kept": 1,
        "groups_too_easy": 1,
        "groups_too_hard": 1,
        "groups_no_reward": 0,
    }
