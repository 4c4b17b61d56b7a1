"""`nanbeige collect`: G token-exact rollouts per question, written whole as they end, resumable."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer
from tiny_model import make_tiny_model

from nanbeige.agent.run.tokens import training_rows
from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.questions import question_id, read_questions
from nanbeige.evals.tasks import LoadError

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def questions_file(folder: Path) -> Path:
    path = folder / "questions.jsonl"
    path.write_text(
        '{"id": "q1", "question": "What is 2+2?", "answer": "4"}\n'
        '{"question": "Name a colour.", "answer": "red"}\n'
        '{"id": "q3", "question": "Who wrote Hamlet?"}\n'
    )
    return path


def collect_command(tiny: Path, questions: Path, out: Path, *extra: str) -> list[str]:
    return [
        NANBEIGE,
        "collect",
        "--questions",
        str(questions),
        "--group-size",
        "4",
        "--out",
        str(out),
        "--backend",
        "transformers",
        "--model",
        str(tiny),
        "--max-turns",
        "2",
        "--max-tokens",
        "12",
        "--mcp",
        TESTKIT,
        "--concurrency",
        "2",
        # The tiny model's replies are all cut off at 12 tokens: kept, not sampled again up to ten times, each
        # time pre-filling the built-in servers' whole catalogue
        "--no-rollback",
        *extra,
    ]  # the built-in stdio servers, and testkit


@pytest.mark.slow
def test_rollouts_are_exact_grouped_and_resumed_after_a_kill_without_loss_or_duplicates(
    tiny: Path, tmp_path: Path
) -> None:
    questions, out = questions_file(tmp_path), tmp_path / "rollouts.jsonl"
    env = {**os.environ, "COLUMNS": "200"}
    process = subprocess.Popen(
        collect_command(tiny, questions, out, "--policy-version", "step-7"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline
        and process.poll() is None
        and (not out.exists() or out.read_text().count('"type":"end"') < 3)
    ):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    before = len(load_trajectories(out))
    assert 3 <= before < 12
    finished = subprocess.run(
        collect_command(tiny, questions, out, "--policy-version", "step-7"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr
    assert f"resuming: {before} of 12 rollouts already in" in finished.stderr
    trajectories = load_trajectories(out)
    keys = Counter((t.group_id, t.rollout_index) for t in trajectories)
    ids = ["q1", question_id("Name a colour."), "q3"]
    assert keys == {(q, r): 1 for q in ids for r in range(4)}  # every rollout once: none lost, none twice
    for trajectory in trajectories:
        assert trajectory.finished and trajectory.policy_version == "step-7"
        assert trajectory.tokenizer is not None  # prompts rendered here: exact ids
        assert {"tool-python", "jina_scrape_llm_summary", "testkit"} <= {tool["server"] for tool in trajectory.tools}
        rows = training_rows(trajectory.turns)  # raises unless every prefix hash and logprob checks out
        assert rows and all(
            turn.completion_ids and len(turn.logprobs) == len(turn.completion_ids) for turn in trajectory.turns
        )
    by_group = {t.group_id: t for t in trajectories}
    assert (by_group["q1"].reference_answer, by_group["q3"].reference_answer) == ("4", None)
    # whole trajectories only: no start line without its end line
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert Counter(r["type"] for r in records)["start"] == Counter(r["type"] for r in records)["end"] == 12


def test_a_chat_endpoint_is_refused_unless_inexact_rollouts_are_allowed(tmp_path: Path) -> None:
    questions, out = questions_file(tmp_path), tmp_path / "rollouts.jsonl"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        base = [
            NANBEIGE,
            "collect",
            "--questions",
            str(questions),
            "-G",
            "2",
            "--out",
            str(out),
            "--base-url",
            server.base_url,
            "--no-default-servers",
        ]
        refused = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "token-exact" in refused.stderr and "--allow-inexact" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not out.exists() or out.read_text() == ""  # nothing collected
        allowed = subprocess.run([*base, "--allow-inexact", "--limit", "1"], capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert "pass rate (exact match) 100.0%" in allowed.stderr
    assert [(t.group_id, t.rollout_index, t.answer) for t in load_trajectories(out)] in (
        [("q1", 0, "4"), ("q1", 1, "4")],
        [("q1", 1, "4"), ("q1", 0, "4")],
    )


def test_where_rollouts_go_is_said_only_once_the_run_starts(tmp_path: Path) -> None:
    questions, out = questions_file(tmp_path), tmp_path / "rollouts.jsonl"
    announced = f"collect: rollouts go to {out}"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        base = [
            NANBEIGE,
            "collect",
            "--questions",
            str(questions),
            "-G",
            "1",
            "--limit",
            "1",
            "--out",
            str(out),
            "--base-url",
            server.base_url,
            "--no-default-servers",
        ]
        env = {**os.environ, "COLUMNS": "300"}  # the path on one line
        refused = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
        started = subprocess.run([*base, "--allow-inexact"], capture_output=True, text=True, timeout=60, env=env)
    # refused by a check (a chat endpoint gives no exact token ids): the error alone, no promise of rollouts
    assert refused.returncode == 1 and "--allow-inexact" in refused.stderr
    assert "rollouts go to" not in refused.stderr
    assert started.returncode == 0, started.stderr
    assert started.stderr.count(announced) == 1


def test_questions_files_and_their_errors(tmp_path: Path) -> None:
    csv = tmp_path / "q.csv"
    csv.write_text("question,answer\nWhat is 2+2?,4\nName a colour.,\n")
    tasks = read_questions(csv)
    assert [(t.id, t.question, t.answer) for t in tasks] == [
        (question_id("What is 2+2?"), "What is 2+2?", "4"),
        (question_id("Name a colour."), "Name a colour.", ""),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok"}\n{"answer": "no question"}\n')
    with pytest.raises(LoadError, match=r"bad.jsonl row 2: no `question`"):
        read_questions(bad)
    bad.write_text('{"id": "a", "question": "one"}\n{"id": "a", "question": "two"}\n')
    with pytest.raises(LoadError, match="the id 'a' is given to more than one question"):
        read_questions(bad)
    bad.write_text("not json\n")
    with pytest.raises(LoadError, match=r"bad.jsonl line 1: not JSON"):
        read_questions(bad)


def test_the_policy_version_defaults_to_the_weights_the_server_names() -> None:
    from nanbeige.agent.backends.llm import probe_server

    entry = {"id": "policy", "object": "model", "owned_by": "vllm", "root": "/ckpt/step-9", "max_model_len": 32768}
    with FakeOpenAI([], models=[entry]) as server:
        assert probe_server(server.base_url, None, model="policy").weights == "/ckpt/step-9"
    with FakeOpenAI([]) as server:
        assert probe_server(server.base_url, None).weights is None  # a server that does not say


def collect_with_a_tool_turn(questions: Path, rollouts: Path) -> None:
    """Two rollouts of the first question into `rollouts`: each an echo call to the test server, then answer 4."""
    call = (
        "<use_mcp_tool>\n<server_name>testkit</server_name>\n<tool_name>echo</tool_name>\n<arguments>\n"
        '{"text": "four"}\n</arguments>\n</use_mcp_tool>'
    )
    model = [f"<think>\nI will check.\n</think>\n{call}", mcp_answer("4"), mcp_answer("4")] * 2
    with FakeOpenAI(model) as server:
        collected = subprocess.run(
            [
                NANBEIGE,
                "collect",
                "--questions",
                str(questions),
                "-G",
                "2",
                "--limit",
                "1",
                "--out",
                str(rollouts),
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--mcp",
                TESTKIT,
                "--allow-inexact",
                "--concurrency",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert collected.returncode == 0, collected.stderr


def test_collected_rollouts_are_judged_by_the_judge_command(tmp_path: Path) -> None:
    questions, rollouts, judged = questions_file(tmp_path), tmp_path / "rollouts.jsonl", tmp_path / "judged.jsonl"
    collect_with_a_tool_turn(questions, rollouts)
    scores = json.dumps(
        {
            d: {"score": s, "reason": "ok"}
            for d, s in [("logical_soundness", 5), ("tool_call_accuracy", 4), ("information_gain", 2)]
        }
    )
    with FakeOpenAI([], default=f"```json\n{scores}\n```") as critic:
        result = subprocess.run(
            [
                NANBEIGE,
                "judge",
                str(rollouts),
                "--out",
                str(judged),
                "--critic-base-url",
                critic.base_url,
                "--critic-model",
                "critic",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert "2 trajectories judged" in result.stderr
    for trajectory in load_trajectories(judged):
        assert trajectory.reward == 1.0 and trajectory.judge["grader"] == "gaia-exact"  # answer 4, reference 4
        tool_turn, *answer_turns = trajectory.turns
        # information gain 2 < 3: the tool turn fails and is masked; the answer turns pass on soundness alone
        assert (tool_turn.mask, tool_turn.reward, tool_turn.critic["passed"]) == (0, None, False)
        assert all(turn.mask == 1 and turn.reward == 1.0 for turn in answer_turns)
    again = subprocess.run(
        [NANBEIGE, "judge", str(rollouts), "--out", str(judged), "--no-critic"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "0 trajectories judged" in again.stderr  # both already in OUT


def test_questions_can_come_from_an_eval_benchmark(tmp_path: Path) -> None:
    data, out = tmp_path / "metadata.jsonl", tmp_path / "rollouts.jsonl"
    data.write_text(
        json.dumps({"task_id": "g1", "Question": "What is 2+2?", "Level": 1, "Final answer": "4", "file_name": ""})
        + "\n"
    )
    with FakeOpenAI([], default=mcp_answer("5")) as server:
        result = subprocess.run(
            [
                NANBEIGE,
                "collect",
                "--bench",
                "gaia",
                "--data",
                str(data),
                "-G",
                "2",
                "--out",
                str(out),
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--allow-inexact",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert "pass rate (exact match) 0.0%" in result.stderr  # 5 is not 4
    assert sorted((t.group_id, t.rollout_index, t.reference_answer, t.grader) for t in load_trajectories(out)) == [
        ("g1", 0, "4", "equivalent/reference"),
        ("g1", 1, "4", "equivalent/reference"),
    ]  # GAIA's default grader
    missing = subprocess.run(
        [NANBEIGE, "collect", "--bench", "gaia", "--out", str(out)], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "--data is required with --bench gaia" in missing.stderr
