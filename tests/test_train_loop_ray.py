"""`nanbeige loop --ray` (`train --loop --ray`, its older spelling, runs the same): the loop's collect and judge
run in shards on a Ray cluster (a local one of a head and 2 worker nodes, in a network namespace of its own:
tests/ray_cluster.py), training in the command's own process; the iteration's files are those of the same loop
without Ray. Without `--ray` the loop never loads Ray, and `--ray` where it makes no sense is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, mcp_answer
from ray_cluster import NANBEIGE, SAYS_IF_RAY_LOADED, command_env, local_cluster, run_in_own_network
from tiny_model import make_tiny_model

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

QUESTIONS = [("a", "What is 2+2?", "4"), ("b", "Name a colour.", "red")]
GROUP = 2


def loop_command(questions: Path, tiny: Path, base_url: str) -> list[str]:
    """One iteration of the loop in token mode, its output folder still to add."""
    # every group is all right or all wrong: the band is opened so that training has rows
    return [
        sys.executable,
        "-c",
        SAYS_IF_RAY_LOADED,
        "loop",
        "--iterations",
        "1",
        "--questions",
        str(questions),
        "-G",
        str(GROUP),
        "--model",
        str(tiny),
        "--base-url",
        base_url,
        "--token-mode",
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
        "--off-policy",
    ]


def loop_with_and_without_ray(folder: Path) -> dict[str, Any]:
    """One iteration of the loop with --ray, then the same without, against a loopback vLLM whose scripted
    policy answers `a` right and `b` wrong every time, whichever node asks."""
    from nanbeige.agent.backends.token_mode import load_tokenizer

    tiny = make_tiny_model(folder / "tiny")
    tokenizer = load_tokenizer(str(tiny))[0]
    questions = folder / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS))

    def policy(request: dict[str, Any]) -> str:
        return mcp_answer("4" if "2+2" in tokenizer.decode(request["prompt"]) else "blue")

    found: dict[str, Any] = {}
    with (
        local_cluster(2) as (cluster, _),
        FakeOpenAI(
            policy,
            vllm=True,
            tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        ) as server,
    ):
        loop = loop_command(questions, tiny, server.base_url)
        for name, extra in (("on-ray", ["--ray", cluster.address]), ("here", [])):
            done = subprocess.run(
                [*loop, "--out", str(folder / name), *extra],
                capture_output=True,
                text=True,
                timeout=240,
                env=command_env(),
            )
            found[name] = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    return found


@pytest.fixture(scope="module")
def looped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("loop")
    return folder, run_in_own_network("test_train_loop_ray", "loop_with_and_without_ray", folder, timeout=540)


def keys(path: Path) -> Counter:
    return Counter((t.group_id, t.rollout_index) for t in load_trajectories(path))


@pytest.mark.slow
def test_the_loops_collect_and_judge_on_the_cluster_write_the_files_of_the_loop_without_it(
    looped: tuple[Path, dict[str, Any]],
) -> None:
    folder, found = looped
    for name in ("on-ray", "here"):
        assert found[name]["returncode"] == 0, found[name]["stderr"][-3000:]
    assert found["on-ray"]["stderr"].count("running on 2 Ray nodes") == 2  # collect, then judge
    assert found["on-ray"]["stdout"].strip().endswith("ray loaded")
    assert found["here"]["stdout"].strip().endswith("ray not loaded")
    every_rollout_once = {(q, r): 1 for q, _, _ in QUESTIONS for r in range(GROUP)}
    on_ray, here = folder / "on-ray" / "iter-1", folder / "here" / "iter-1"
    for name in ("rollouts.jsonl", "judged.jsonl"):
        assert keys(on_ray / name) == keys(here / name) == every_rollout_once
    judged = [
        sorted((t.group_id, t.rollout_index, t.reward) for t in load_trajectories(where / "judged.jsonl"))
        for where in (on_ray, here)
    ]
    assert judged[0] == judged[1] == [("a", 0, 1.0), ("a", 1, 1.0), ("b", 0, 0.0), ("b", 1, 0.0)]
    # and the train stage, in the command's own process, trained on them
    [iteration] = json.loads((folder / "on-ray" / "loop.json").read_text())["iterations"]
    assert iteration["collected"]["rollouts"] == 4 and iteration["judged"]["judged"] == 4
    assert Path(iteration["trained"]["checkpoint"]).is_dir() and "synced" in iteration


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--ray", "auto"], None, "--ray runs the loop's collect and judge on a Ray cluster: it needs --loop"),
        (
            ["--loop", "1", "--questions", "q.jsonl", "--ray", "auto"],
            {"WORLD_SIZE": "2", "RANK": "1"},
            "and torchrun starts several: run `nanbeige train --loop N --ray ...` without torchrun",
        ),
        (
            ["--loop", "1", "--questions", "q.jsonl", "--ray", "head-node"],
            None,
            "--ray takes auto or HOST:PORT (the head node's address), not 'head-node'",
        ),
    ],
)
def test_ray_where_it_makes_no_sense_is_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str] | None, said: str
) -> None:
    done = subprocess.run(
        [NANBEIGE, "train", "--model", "m", "--out", str(tmp_path / "o"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=command_env() | (env or {}),
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran
