"""A node lost half-way through `eval --ray` and `judge --ray` (tests/test_cluster.py has `collect --ray`'s):
every row is written once, only the lost node's runs in flight are run again on the node left, and the
command says so in one line naming the node. On a local cluster of a head and 2 worker nodes of one CPU,
each shard running one item at a time, in a network namespace of its own (tests/ray_cluster.py)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply
from ray_cluster import (
    NANBEIGE,
    QUESTIONS,
    answers_even_questions_right,
    command_env,
    ended,
    first_calls,
    local_cluster,
    run_in_own_network,
    wait_for,
)

from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.out_folder import read_results

RUNS = 2 * len(QUESTIONS)  # each question twice: -k 2, or -G 2


def critic_that_passes_every_turn(delay_s: float) -> Any:
    """A turn critic that takes `delay_s` a turn and scores every dimension 5."""
    scores = json.dumps(
        {name: {"score": 5, "reason": "ok"} for name in ("logical_soundness", "tool_call_accuracy", "information_gain")}
    )
    return lambda request: Reply(content=scores, delay_s=delay_s)


def results(folder: Path) -> int:
    return len(read_results(folder)) if (folder / "results.jsonl").exists() else 0


def remove_half_way(cluster: Any, worker: Any, count: Any, command: list[str]) -> dict[str, Any]:
    """Run `command`, remove `worker` once `count()` reaches half the runs, and let the command end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env())
    wait_for(count, RUNS // 2, process)
    removed_at = count()
    cluster.remove_node(worker)
    _, stderr = process.communicate(timeout=120)
    return {"returncode": process.returncode, "stderr": stderr, "removed_at": removed_at, "removed": worker.node_id}


def write_questions(folder: Path) -> Path:
    """The questions as GAIA's metadata.jsonl, for eval (its path is returned), and as questions.jsonl, for collect."""
    data = folder / "metadata.jsonl"
    data.write_text(
        "".join(
            json.dumps({"task_id": i, "Question": q, "Level": 1, "Final answer": a, "file_name": ""}) + "\n"
            for i, q, a in QUESTIONS
        )
    )
    (folder / "questions.jsonl").write_text(
        "".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS)
    )
    return data


def collect_in_one_process(questions: Path, rollouts: Path, model_flags: list[str]) -> None:
    collected = subprocess.run(
        [
            NANBEIGE,
            "collect",
            "--questions",
            str(questions),
            "-G",
            "2",
            "--out",
            str(rollouts),
            "--allow-inexact",
            *model_flags,
            "--concurrency",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=command_env(),
    )
    assert collected.returncode == 0, collected.stderr


def eval_command(data: Path, out: Path, model_flags: list[str], address: str) -> list[str]:
    """eval --ray of each question twice, one run at a time, so that a node removed half-way has one in flight."""
    return [
        NANBEIGE,
        "eval",
        "gaia",
        "--data",
        str(data),
        "-k",
        "2",
        "--grader",
        "gaia-exact",
        *model_flags,
        "--concurrency",
        "1",
        "--out",
        str(out),
        "--ray",
        address,
    ]


def judge_command(rollouts: Path, out: Path, critic_url: str, address: str) -> list[str]:
    """judge --ray with the critic, one trajectory at a time, so that a node removed half-way has one in flight."""
    return [
        NANBEIGE,
        "judge",
        str(rollouts),
        "--out",
        str(out),
        "--concurrency",
        "1",
        "--critic-base-url",
        critic_url,
        "--critic-model",
        "critic",
        "--ray",
        address,
    ]


def eval_and_judge_losing_a_node(folder: Path) -> dict[str, Any]:
    """eval --ray with a node removed half-way; then, with a node added back, judge --ray of rollouts collected
    in one process, with a node removed half-way."""
    data, rollouts = write_questions(folder), folder / "rollouts.jsonl"
    found: dict[str, Any] = {}
    with (
        local_cluster(2) as (cluster, workers),
        FakeOpenAI(answers_even_questions_right(0.4)) as model,
        FakeOpenAI(critic_that_passes_every_turn(0.4)) as critic,
    ):
        model_flags = ["--base-url", model.base_url, "--no-default-servers"]
        found["eval"] = remove_half_way(
            cluster,
            workers[0],
            lambda: results(folder / "eval"),
            eval_command(data, folder / "eval", model_flags, cluster.address),
        )
        found["eval"]["runs_started"] = first_calls(model)
        collect_in_one_process(folder / "questions.jsonl", rollouts, model_flags)
        workers = [workers[1], cluster.add_node(num_cpus=1)]
        cluster.wait_for_nodes()
        found["judge"] = remove_half_way(
            cluster,
            workers[0],
            lambda: ended(folder / "judged.jsonl"),
            judge_command(rollouts, folder / "judged.jsonl", critic.base_url, cluster.address),
        )
        found["judge"]["critic_calls"] = len(critic.requests)  # one a turn
    return found


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("lost")
    return folder, run_in_own_network("test_cluster_lost", "eval_and_judge_losing_a_node", folder)


def said_once(stderr: str, node_id: str) -> None:
    """The loss is one line, naming the node."""
    [line] = [line for line in stderr.splitlines() if "lost the shard" in line]
    assert f"lost the shard on node 127.0.0.1 ({node_id[:8]})" in line and "(1 left)" in line
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_an_eval_that_loses_a_node_half_way_writes_every_run_once_and_redoes_only_its_run_in_flight(
    lost: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = lost
    run = found["eval"]
    assert run["returncode"] == 0, run["stderr"]
    assert RUNS // 2 <= run["removed_at"] < RUNS  # removed while runs were left to do
    said_once(run["stderr"], run["removed"])
    rows = read_results(folder / "eval")
    assert Counter((row["task_id"], row["run"]) for row in rows) == {
        (q, r): 1 for q, _, _ in QUESTIONS for r in range(2)
    }
    assert Counter(row["correct"] for row in rows) == {True: RUNS // 2, False: RUNS // 2}  # even questions right
    # the lost node ran one run at a time: at most that one was started again on the other node
    assert RUNS <= run["runs_started"] <= RUNS + 1
    # and a run lost in flight left nothing in the trajectories: each row's trajectory is there once
    trajectories = load_trajectories(folder / "eval" / "trajectories.jsonl")
    assert sorted(t.id for t in trajectories) == sorted(row["trajectory_id"] for row in rows)


@pytest.mark.slow
def test_a_judge_that_loses_a_node_half_way_writes_every_trajectory_once_and_redoes_only_its_one_in_flight(
    lost: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = lost
    run = found["judge"]
    assert run["returncode"] == 0, run["stderr"]
    assert f"{RUNS} trajectories judged" in run["stderr"]
    assert RUNS // 2 <= run["removed_at"] < RUNS
    said_once(run["stderr"], run["removed"])
    rollouts, judged = (load_trajectories(folder / name) for name in ("rollouts.jsonl", "judged.jsonl"))
    assert Counter(t.id for t in judged) == {t.id: 1 for t in rollouts} and len(rollouts) == RUNS
    assert Counter(t.reward for t in judged) == {1.0: RUNS // 2, 0.0: RUNS // 2}
    assert all(turn.critic["passed"] for t in judged for turn in t.turns)
    # the lost node judged one trajectory at a time: at most that one's turns were sent to the critic again
    turns = sum(len(t.turns) for t in rollouts)
    assert turns <= run["critic_calls"] <= turns + max(len(t.turns) for t in rollouts)
