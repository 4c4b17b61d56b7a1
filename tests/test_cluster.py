"""`--ray` on `collect`, `eval` and `judge`: shards of the runs on Ray actors, one per node, the command's own
process the only writer of its files. Tested on a local cluster of a head and 2 worker nodes, in a network
namespace of its own (tests/ray_cluster.py): a node removed half-way loses no row and redoes only its runs
in flight, a driver killed half-way and run again writes every row once, a shard that cannot start its tool
servers stops the command naming its node. Without a cluster: tests/test_without_a_cluster.py."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from ray_cluster import (
    NANBEIGE,
    QUESTIONS,
    TESTS,
    answers_even_questions_right,
    command_env,
    ended,
    first_calls,
    local_cluster,
    quiet,
    run_in_own_network,
    wait_for,
)

from nanbeige.agent.trajectory.trajectory_file import load_trajectories
from nanbeige.evals.out_folder import read_results

TESTKIT = "testkit=" + shlex.join([sys.executable, str(TESTS / "mcp_test_server.py")])
# ---------------------------------------------------------------- run in the cluster's own network namespace


def collect_with_a_server_that_cannot_start(collect: list[str], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*collect, "--out", str(out), "--mcp", "broken=" + shlex.join([sys.executable, "-c", "raise SystemExit(3)"])],
        capture_output=True,
        text=True,
        timeout=120,
        env=command_env(),
    )


def judge_on_ray_and_in_one_process(rollouts: Path, folder: Path, address: str) -> dict[str, Any]:
    """judge --ray of the rollouts, and judge in one process: each one's exit code and stderr, by its out file."""
    found: dict[str, Any] = {}
    for name, extra in (("judged-ray", ["--ray", address]), ("judged-here", [])):
        done = subprocess.run(
            [NANBEIGE, "judge", str(rollouts), "--out", str(folder / f"{name}.jsonl"), "--no-critic", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env=command_env(),
        )
        found[name] = {"returncode": done.returncode, "stderr": done.stderr}
    return found


def collect_and_judge_on_two_nodes(folder: Path) -> dict[str, Any]:
    """collect --ray with a tool server that cannot start; then with a node removed half-way; then judge --ray
    of those rollouts on the node left, and judge in one process."""
    questions, rollouts = folder / "questions.jsonl", folder / "rollouts.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS))
    found: dict[str, Any] = {}
    with local_cluster(2) as (cluster, workers), FakeOpenAI(answers_even_questions_right(0.4)) as server:
        collect = [
            NANBEIGE,
            "collect",
            "--questions",
            str(questions),
            "-G",
            "2",
            "--base-url",
            server.base_url,
            "--no-default-servers",
            "--allow-inexact",
            "--concurrency",
            "2",
            "--ray",
            cluster.address,
        ]
        broken = collect_with_a_server_that_cannot_start(collect, folder / "none.jsonl")
        found["broken"] = {
            "returncode": broken.returncode,
            "stderr": broken.stderr,
            "nodes": [worker.node_id for worker in workers],
        }
        server.requests.clear()
        process = subprocess.Popen(
            [*collect, "--out", str(rollouts), "--mcp", TESTKIT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=command_env(),
        )
        wait_for(lambda: ended(rollouts), 8, process)
        found["removed_at"] = ended(rollouts)
        cluster.remove_node(workers[0])
        _, stderr = process.communicate(timeout=120)
        found["collect"] = {
            "returncode": process.returncode,
            "stderr": stderr,
            "removed": workers[0].node_id,
            "runs_started": first_calls(server),
        }
        found.update(judge_on_ray_and_in_one_process(rollouts, folder, cluster.address))
    return found


def eval_killed_half_way(folder: Path) -> dict[str, Any]:
    """eval --ray killed half-way and run again; the same eval in one process."""
    data = folder / "metadata.jsonl"
    data.write_text(
        "".join(
            json.dumps({"task_id": i, "Question": q, "Level": 1, "Final answer": a, "file_name": ""}) + "\n"
            for i, q, a in QUESTIONS
        )
    )
    found: dict[str, Any] = {}
    with local_cluster(2) as (cluster, _), FakeOpenAI(answers_even_questions_right(0.3)) as server:
        command = [
            NANBEIGE,
            "eval",
            "gaia",
            "--data",
            str(data),
            "-k",
            "2",
            "--concurrency",
            "2",
            "--grader",
            "gaia-exact",
            "--base-url",
            server.base_url,
            "--no-default-servers",
        ]
        on_ray = [*command, "--out", str(folder / "on-ray"), "--ray", cluster.address]
        process = subprocess.Popen(on_ray, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env())
        wait_for(lambda: len(read_results(folder / "on-ray")) if (folder / "on-ray").exists() else 0, 8, process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        found["killed_with"] = len(read_results(folder / "on-ray"))
        quiet(server)  # the killed driver's actors are ended by Ray soon after it, their runs in flight with them
        server.requests.clear()
        started = time.monotonic()
        again = subprocess.run(on_ray, capture_output=True, text=True, timeout=120, env=command_env())
        found["again"] = {
            "returncode": again.returncode,
            "stderr": again.stderr,
            "runs_started": first_calls(server),
            "seconds": time.monotonic() - started,
        }
        started = time.monotonic()
        here = subprocess.run(
            [*command, "--out", str(folder / "here")], capture_output=True, text=True, timeout=120, env=command_env()
        )
        found["here"] = {"returncode": here.returncode, "stderr": here.stderr, "seconds": time.monotonic() - started}
    return found


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("collect")
    return folder, run_in_own_network("test_cluster", "collect_and_judge_on_two_nodes", folder)


@pytest.mark.slow
def test_a_shard_whose_tool_servers_cannot_start_stops_the_command_naming_its_node(
    collected: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = collected
    broken = found["broken"]
    assert broken["returncode"] == 1 and "Traceback" not in broken["stderr"]
    [line] = [line for line in broken["stderr"].splitlines() if "error" in line.lower()]
    assert "broken" in line and any(f"({node[:8]})" in line for node in broken["nodes"])
    assert not (folder / "none.jsonl").exists() or not (folder / "none.jsonl").read_text()


@pytest.mark.slow
def test_a_node_removed_half_way_loses_no_rollout_and_redoes_only_its_runs_in_flight(
    collected: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = collected
    collect = found["collect"]
    assert collect["returncode"] == 0, collect["stderr"]
    assert 8 <= found["removed_at"] < 16  # removed while rollouts were left to do
    assert f"lost the shard on node 127.0.0.1 ({collect['removed'][:8]})" in collect["stderr"]
    trajectories = load_trajectories(folder / "rollouts.jsonl")
    assert Counter((t.group_id, t.rollout_index) for t in trajectories) == {
        (q, r): 1 for q, _, _ in QUESTIONS for r in range(2)
    }
    assert all(t.finished and {"testkit"} <= {tool["server"] for tool in t.tools} for t in trajectories)
    # the lost node ran 2 rollouts at a time: at most those 2 were started again on the other node
    assert 16 <= collect["runs_started"] <= 16 + 2


@pytest.mark.slow
def test_judging_on_the_cluster_gives_the_rewards_of_judging_in_one_process(
    collected: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = collected
    assert found["judged-ray"]["returncode"] == 0, found["judged-ray"]["stderr"]
    assert "16 trajectories judged" in found["judged-ray"]["stderr"]
    on_ray, here = (load_trajectories(folder / f"{name}.jsonl") for name in ("judged-ray", "judged-here"))
    assert sorted((t.id, t.reward) for t in on_ray) == sorted((t.id, t.reward) for t in here)
    assert Counter(t.reward for t in on_ray) == {1.0: 8, 0.0: 8}  # even questions right, odd ones wrong


@pytest.mark.slow
def test_a_driver_killed_half_way_and_run_again_writes_every_row_once_and_reports_as_one_process(
    tmp_path: Path,
) -> None:
    found = run_in_own_network("test_cluster", "eval_killed_half_way", tmp_path)
    assert found["again"]["returncode"] == 0, found["again"]["stderr"]
    assert found["here"]["returncode"] == 0, found["here"]["stderr"]
    before = found["killed_with"]
    assert 8 <= before < 16
    assert f"resuming: {before} of 16 runs already done" in found["again"]["stderr"]
    assert found["again"]["runs_started"] == 16 - before  # only the runs without a row
    rows = read_results(tmp_path / "on-ray")
    assert sorted((r["task_id"], r["run"]) for r in rows) == sorted((q, r) for q, _, _ in QUESTIONS for r in range(2))
    reports = [
        subprocess.run(
            [NANBEIGE, "eval", "report", str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=command_env(),
            timeout=60,
        )
        for name in ("on-ray", "here")
    ]
    assert reports[0].returncode == 0 and reports[0].stdout == reports[1].stdout
    assert "| pass@2 | 50.00% |" in reports[0].stdout
    # every run's trajectory, written by the driver alone
    finished = [t for t in load_trajectories(tmp_path / "on-ray" / "trajectories.jsonl") if t.finished]
    assert {t.id for t in finished} >= {r["trajectory_id"] for r in rows}
