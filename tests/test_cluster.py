"""`--ray` on `collect`, `eval` and `judge`: shards of the runs on Ray actors, one per node, the command's own
process the only writer of its files. Tested on a local cluster of a head and 2 worker nodes, in a network
namespace of its own (tests/ray_cluster.py): a node removed half-way loses no row and redoes only its runs
in flight, a driver killed half-way and run again writes every row once, a shard that cannot start its tool
servers stops the command naming its node. Without `--ray`, Ray is never loaded."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import mcp_test_server
import pytest
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from ray_cluster import (
    NANBEIGE,
    QUESTIONS,
    SAYS_IF_RAY_LOADED,
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

from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.loop import AgentConfig, run
from nanbeige.agent.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory_file import TrajectoryWriter, load_trajectories
from nanbeige.evals.out_folder import read_results

TESTKIT = "testkit=" + shlex.join([sys.executable, str(TESTS / "mcp_test_server.py")])
# ---------------------------------------------------------------- run in the cluster's own network namespace


def collect_and_judge_on_two_nodes(folder: Path) -> dict[str, Any]:
    """collect --ray with a tool server that cannot start; then with a node removed half-way; then judge --ray
    of those rollouts on the node left, and judge in one process."""
    questions, rollouts = folder / "questions.jsonl", folder / "rollouts.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS))
    found: dict[str, Any] = {}
    with local_cluster(2) as (cluster, workers), FakeOpenAI(answers_even_questions_right(0.4)) as server:
        collect = [NANBEIGE, "collect", "--questions", str(questions), "-G", "2", "--base-url", server.base_url,
                   "--no-default-servers", "--allow-inexact", "--concurrency", "2", "--ray", cluster.address]
        broken = subprocess.run([*collect, "--out", str(folder / "none.jsonl"), "--mcp",
                                 "broken=" + shlex.join([sys.executable, "-c", "raise SystemExit(3)"])],
                                capture_output=True, text=True, timeout=120, env=command_env())
        found["broken"] = {"returncode": broken.returncode, "stderr": broken.stderr,
                           "nodes": [worker.node_id for worker in workers]}
        server.requests.clear()
        process = subprocess.Popen([*collect, "--out", str(rollouts), "--mcp", TESTKIT], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=command_env())
        wait_for(lambda: ended(rollouts), 8, process)
        found["removed_at"] = ended(rollouts)
        cluster.remove_node(workers[0])
        _, stderr = process.communicate(timeout=120)
        found["collect"] = {"returncode": process.returncode, "stderr": stderr, "removed": workers[0].node_id,
                            "runs_started": first_calls(server)}
        for name, extra in (("judged-ray", ["--ray", cluster.address]), ("judged-here", [])):
            done = subprocess.run([NANBEIGE, "judge", str(rollouts), "--out", str(folder / f"{name}.jsonl"),
                                   "--no-critic", *extra], capture_output=True, text=True, timeout=120,
                                  env=command_env())
            found[name] = {"returncode": done.returncode, "stderr": done.stderr}
    return found


def eval_killed_half_way(folder: Path) -> dict[str, Any]:
    """eval --ray killed half-way and run again; the same eval in one process."""
    data = folder / "metadata.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "Question": q, "Level": 1, "Final answer": a, "file_name": ""})
                            + "\n" for i, q, a in QUESTIONS))
    found: dict[str, Any] = {}
    with local_cluster(2) as (cluster, _), FakeOpenAI(answers_even_questions_right(0.3)) as server:
        command = [NANBEIGE, "eval", "gaia", "--data", str(data), "-k", "2", "--concurrency", "2", "--grader",
                   "gaia-exact", "--base-url", server.base_url, "--no-default-servers"]
        on_ray = [*command, "--out", str(folder / "on-ray"), "--ray", cluster.address]
        process = subprocess.Popen(on_ray, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=command_env())
        wait_for(lambda: len(read_results(folder / "on-ray")) if (folder / "on-ray").exists() else 0, 8, process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        found["killed_with"] = len(read_results(folder / "on-ray"))
        quiet(server)  # the killed driver's actors are ended by Ray soon after it, their runs in flight with them
        server.requests.clear()
        started = time.monotonic()
        again = subprocess.run(on_ray, capture_output=True, text=True, timeout=120, env=command_env())
        found["again"] = {"returncode": again.returncode, "stderr": again.stderr, "runs_started": first_calls(server),
                          "seconds": time.monotonic() - started}
        started = time.monotonic()
        here = subprocess.run([*command, "--out", str(folder / "here")], capture_output=True, text=True, timeout=120,
                              env=command_env())
        found["here"] = {"returncode": here.returncode, "stderr": here.stderr, "seconds": time.monotonic() - started}
    return found


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("collect")
    return folder, run_in_own_network("test_cluster", "collect_and_judge_on_two_nodes", folder)


@pytest.mark.slow
def test_a_shard_whose_tool_servers_cannot_start_stops_the_command_naming_its_node(
        collected: tuple[Path, dict[str, Any]]) -> None:
    folder, found = collected
    broken = found["broken"]
    assert broken["returncode"] == 1 and "Traceback" not in broken["stderr"]
    [line] = [line for line in broken["stderr"].splitlines() if "error" in line.lower()]
    assert "broken" in line and any(f"({node[:8]})" in line for node in broken["nodes"])
    assert not (folder / "none.jsonl").exists() or not (folder / "none.jsonl").read_text()


@pytest.mark.slow
def test_a_node_removed_half_way_loses_no_rollout_and_redoes_only_its_runs_in_flight(
        collected: tuple[Path, dict[str, Any]]) -> None:
    folder, found = collected
    collect = found["collect"]
    assert collect["returncode"] == 0, collect["stderr"]
    assert 8 <= found["removed_at"] < 16  # removed while rollouts were left to do
    assert f"lost the shard on node 127.0.0.1 ({collect['removed'][:8]})" in collect["stderr"]
    trajectories = load_trajectories(folder / "rollouts.jsonl")
    assert Counter((t.group_id, t.rollout_index) for t in trajectories) == {(q, r): 1 for q, _, _ in QUESTIONS
                                                                            for r in range(2)}
    assert all(t.finished and {"testkit"} <= {tool["server"] for tool in t.tools} for t in trajectories)
    # the lost node ran 2 rollouts at a time: at most those 2 were started again on the other node
    assert 16 <= collect["runs_started"] <= 16 + 2


@pytest.mark.slow
def test_judging_on_the_cluster_gives_the_rewards_of_judging_in_one_process(
        collected: tuple[Path, dict[str, Any]]) -> None:
    folder, found = collected
    assert found["judged-ray"]["returncode"] == 0, found["judged-ray"]["stderr"]
    assert "16 trajectories judged" in found["judged-ray"]["stderr"]
    on_ray, here = (load_trajectories(folder / f"{name}.jsonl") for name in ("judged-ray", "judged-here"))
    assert sorted((t.id, t.reward) for t in on_ray) == sorted((t.id, t.reward) for t in here)
    assert Counter(t.reward for t in on_ray) == {1.0: 8, 0.0: 8}  # even questions right, odd ones wrong


@pytest.mark.slow
def test_a_driver_killed_half_way_and_run_again_writes_every_row_once_and_reports_as_one_process(
        tmp_path: Path) -> None:
    found = run_in_own_network("test_cluster", "eval_killed_half_way", tmp_path)
    assert found["again"]["returncode"] == 0, found["again"]["stderr"]
    assert found["here"]["returncode"] == 0, found["here"]["stderr"]
    before = found["killed_with"]
    assert 8 <= before < 16
    assert f"resuming: {before} of 16 runs already done" in found["again"]["stderr"]
    assert found["again"]["runs_started"] == 16 - before  # only the runs without a row
    rows = read_results(tmp_path / "on-ray")
    assert sorted((r["task_id"], r["run"]) for r in rows) == sorted((q, r) for q, _, _ in QUESTIONS for r in range(2))
    reports = [subprocess.run([NANBEIGE, "eval", "report", str(tmp_path / name)], capture_output=True, text=True,
                              env=command_env(), timeout=60) for name in ("on-ray", "here")]
    assert reports[0].returncode == 0 and reports[0].stdout == reports[1].stdout
    assert "| pass@2 | 50.00% |" in reports[0].stdout
    # every run's trajectory, written by the driver alone
    finished = [t for t in load_trajectories(tmp_path / "on-ray" / "trajectories.jsonl") if t.finished]
    assert {t.id for t in finished} >= {r["trajectory_id"] for r in rows}


# ---------------------------------------------------------------- without a cluster


class BothWriters:
    """A run's writer that writes its file and records for the driver at once."""

    def __init__(self, *writers: Any):
        self.writers, self.secrets, self.error = writers, [], None

    def __getattr__(self, name: str) -> Any:
        return lambda *args: [getattr(writer, name)(*args) for writer in self.writers]


@pytest.mark.anyio
@pytest.mark.parametrize("whole", [False, True])
async def test_the_records_a_shard_sends_back_are_written_byte_for_byte_as_the_run_would(tmp_path: Path,
                                                                                        whole: bool) -> None:
    from nanbeige.agent.cluster import Recorder, replay

    secret = "sk-never-written-0123"
    own, driven = tmp_path / "own.jsonl", tmp_path / "driven.jsonl"
    writer, recorder = TrajectoryWriter(own, secrets=[secret], whole=whole), Recorder([secret])
    llm = ScriptedLLM([mcp_call("testkit", "echo", {"text": secret}), mcp_answer("done"), mcp_answer("done")])
    async with Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)]) as tools:
        await run("Echo the key.", llm, tools, AgentConfig(), BothWriters(writer, recorder))
        # a model with nothing to say: the run ends as model_error, not on its own
        await run("Then fail.", ScriptedLLM([]), tools, AgentConfig(), BothWriters(writer, recorder))
    writer.close()
    driver = TrajectoryWriter(driven, secrets=[secret], whole=whole)
    replay(recorder.calls, driver)
    driver.close()
    assert driven.read_bytes() == own.read_bytes() and secret not in driven.read_text()
    # whole (collect): the failed run is left out, as its own writer left it out
    assert [t.stop_reason for t in load_trajectories(driven)] == ["answered", *([] if whole else ["model_error"])]




def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    address = f"127.0.0.1:{closed_port()}"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        done = subprocess.run([NANBEIGE, "collect", "--questions", str(questions), "--out", str(tmp_path / "o.jsonl"),
                               "--base-url", server.base_url, "--no-default-servers", "--allow-inexact", "--ray",
                               address], capture_output=True, text=True, timeout=60, env=command_env())
    assert done.returncode == 1 and "Traceback" not in done.stderr
    said = (f"error: no Ray cluster answers at {address} (Connection refused); start one with `ray start --head` "
            "there, or pass another --ray")
    assert done.stderr.strip().splitlines() == [said]
    assert not (tmp_path / "o.jsonl").exists()


def test_without_ray_the_commands_never_load_it(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    data = tmp_path / "metadata.jsonl"
    data.write_text(json.dumps({"task_id": "t", "Question": "What is 2+2?", "Level": 1, "Final answer": "4",
                                "file_name": ""}) + "\n")
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        model = ["--base-url", server.base_url, "--no-default-servers"]
        commands = [["collect", "--questions", str(questions), "-G", "1", "--out", str(tmp_path / "r.jsonl"),
                     "--allow-inexact", *model],
                    ["eval", "gaia", "--data", str(data), "-k", "1", "--grader", "gaia-exact", "--out",
                     str(tmp_path / "eval"), *model],
                    ["judge", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "j.jsonl"), "--no-critic"]]
        for command in commands:
            done = subprocess.run([sys.executable, "-c", SAYS_IF_RAY_LOADED, *command], capture_output=True,
                                  text=True, timeout=120, env=command_env())
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip().endswith("ray not loaded"), done.stdout
    assert len(load_trajectories(tmp_path / "j.jsonl")) == 1  # each command ran to its end


@pytest.mark.parametrize("command", [["collect", "--questions", "q.jsonl", "--out", "r.jsonl"],
                                     ["eval", "gaia", "--out", "runs"], ["judge", "r.jsonl", "--out", "j.jsonl"]])
def test_a_ray_address_of_the_wrong_form_is_one_line_before_anything_runs(tmp_path: Path, command: list[str]) -> None:
    done = subprocess.run([NANBEIGE, *command, "--ray", "head-node"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=command_env())
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --ray takes auto or HOST:PORT (the head node's address), not 'head-node'"], done.stderr
    assert list(tmp_path.iterdir()) == []
