"""A pool of model endpoints: several `--base-url` serving one model, used as one. Runs spread over them
by requests in flight, each run stays on its endpoint, a failed endpoint is left for a cooldown while its
runs go on elsewhere from their last complete turn, and endpoints that differ are refused at start. The
endpoints are real loopback HTTP servers (`fake_openai.py`) and the commands run as a user runs them."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call

from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.model_server import EndpointUnavailable
from nanbeige.agent.backends.pool import EndpointPool, member_config
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)


def agent_script(calls: itertools.count, delay_s: float = 0.02) -> Any:
    """A model that calls `shout` once with a text never used before (so a tool call run twice shows in the
    servers' log), then answers."""

    def reply(request: dict[str, Any]) -> Reply:
        if len(request["messages"]) > 2:  # the tool result is back
            return Reply(mcp_answer("4"), delay_s=delay_s)
        return Reply(mcp_call("testkit", "shout", {"text": f"shouted call-{next(calls)}"}), delay_s=delay_s)

    return reply


def questions(folder: Path, n: int) -> Path:
    path = folder / "questions.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"What is {i} + 4 - {i}?", "answer": "4"}) + "\n" for i in range(n)
        )
    )
    return path


def collect(
    folder: Path, urls: list[str], n: int, *extra: str, group_size: int = 2, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    command = [
        NANBEIGE,
        "collect",
        "--questions",
        str(questions(folder, n)),
        "-G",
        str(group_size),
        "--out",
        str(folder / "rollouts.jsonl"),
        "--allow-inexact",
        "--no-default-servers",
        "--mcp",
        TESTKIT,
        "--max-turns",
        "3",
        *itertools.chain.from_iterable(("--base-url", url) for url in urls),
        *extra,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "400"}
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def closed_server() -> FakeOpenAI:
    """A server whose port nothing listens on any more: connections to it are refused."""
    server = FakeOpenAI([])
    server.httpd.server_close()
    return server


def served(trajectory: Any) -> set[str | None]:
    return {turn.endpoint for turn in trajectory.turns}


def test_collect_over_three_endpoints_uses_each_keeps_runs_on_one_and_says_how_each_did(tmp_path: Path) -> None:
    calls = itertools.count()
    with ExitStack() as stack:
        servers = [stack.enter_context(FakeOpenAI(agent_script(calls))) for _ in range(3)]
        done = collect(tmp_path, [s.base_url for s in servers], 6, "--concurrency", "6")
    assert done.returncode == 0, done.stderr
    trajectories = load_trajectories(tmp_path / "rollouts.jsonl")
    assert sorted((t.group_id, t.rollout_index) for t in trajectories) == sorted(
        (f"q{i}", r) for i in range(6) for r in range(2)
    )
    urls = {s.base_url for s in servers}
    assert all(len(served(t)) == 1 and served(t) <= urls for t in trajectories)  # every turn on one endpoint
    assert all(len(s.requests) >= 4 for s in servers)  # not everything to the last --base-url
    line = next(line for line in done.stderr.splitlines() if line.startswith("endpoints: "))
    for server in servers:
        assert f"{server.base_url} {len(server.requests)} requests, 0 failures" in line


@pytest.mark.slow
def test_four_endpoints_share_the_runs_evenly(tmp_path: Path) -> None:
    calls = itertools.count()
    with ExitStack() as stack:
        servers = [stack.enter_context(FakeOpenAI(agent_script(calls, delay_s=0.05))) for _ in range(4)]
        done = collect(tmp_path, [s.base_url for s in servers], 24, "--concurrency", "8")
    assert done.returncode == 0, done.stderr
    runs = Counter(next(iter(served(t))) for t in load_trajectories(tmp_path / "rollouts.jsonl"))
    mean = sum(runs.values()) / 4
    assert len(runs) == 4 and all(abs(count - mean) <= 0.15 * mean for count in runs.values()), runs


def test_route_group_keeps_a_questions_rollouts_on_one_endpoint(tmp_path: Path) -> None:
    calls = itertools.count()
    with ExitStack() as stack:
        servers = [stack.enter_context(FakeOpenAI(agent_script(calls))) for _ in range(2)]
        done = collect(
            tmp_path, [s.base_url for s in servers], 4, "--concurrency", "4", "--route", "group", group_size=3
        )
    assert done.returncode == 0, done.stderr
    trajectories = load_trajectories(tmp_path / "rollouts.jsonl")
    by_question: dict[str, set] = {}
    for trajectory in trajectories:
        by_question.setdefault(trajectory.group_id, set()).update(served(trajectory))
    assert len(trajectories) == 12 and all(len(endpoints) == 1 for endpoints in by_question.values()), by_question
    assert len(set().union(*by_question.values())) == 2  # the questions still spread over both


@pytest.mark.slow
def test_an_endpoint_killed_a_quarter_in_costs_no_row_and_no_tool_call_twice(tmp_path: Path) -> None:
    calls, answered = itertools.count(), itertools.count()
    victim: dict[str, Any] = {}
    script = agent_script(calls)

    def dies_a_quarter_in(request: dict[str, Any]) -> Reply:
        # a run's second turn, a quarter in (of ~24 requests it would get): cut in flight, and never back
        if next(answered) >= 6 and len(request["messages"]) > 2 and not victim.get("dead"):
            victim["dead"] = True
            victim["server"].outage(3600)
        return script(request)

    with ExitStack() as stack:
        victim["server"] = stack.enter_context(FakeOpenAI(dies_a_quarter_in))
        others = [stack.enter_context(FakeOpenAI(script)) for _ in range(2)]
        done = collect(tmp_path, [victim["server"].base_url, *(s.base_url for s in others)], 18, "--concurrency", "6")
    assert done.returncode == 0, done.stderr
    trajectories = load_trajectories(tmp_path / "rollouts.jsonl")
    assert sorted((t.group_id, t.rollout_index) for t in trajectories) == sorted(
        (f"q{i}", r) for i in range(18) for r in range(2)
    )
    assert all(t.answer == "4" for t in trajectories)
    shouted = re.findall(r"shouted call-\d+", (tmp_path / "rollouts.jsonl.servers.log").read_text())
    assert len(shouted) == len(set(shouted)) >= 36  # each tool call ran once
    moved = [t for t in trajectories if len(served(t)) == 2]
    assert moved and all(victim["server"].base_url in served(t) for t in moved)  # went on elsewhere
    line = next(line for line in done.stderr.splitlines() if line.startswith("endpoints: "))
    assert re.search(re.escape(victim["server"].base_url) + r" \d+ requests, [1-9]\d* failures", line), line


def test_a_pool_is_refused_at_start_when_an_endpoint_is_missing_named_twice_or_serves_another_model(
    tmp_path: Path,
) -> None:
    other = [{"id": "another-model", "object": "model", "owned_by": "someone"}]
    with FakeOpenAI([]) as one, FakeOpenAI([]) as two, FakeOpenAI([], models=other) as odd:
        dead = closed_server()
        twice = collect(tmp_path, [one.base_url, two.base_url, one.base_url + "/"], 1)
        missing = collect(tmp_path, [one.base_url, dead.base_url], 1)
        different = collect(tmp_path, [one.base_url, two.base_url, odd.base_url], 1)
        requests = len(one.requests) + len(two.requests) + len(odd.requests)
    assert twice.returncode == 2 and f"--base-url {one.base_url}/ is given twice" in twice.stderr
    assert missing.returncode == 1 and f"the model endpoint {dead.base_url} (" in missing.stderr
    assert different.returncode == 1 and "serve different models" in different.stderr
    assert f"{odd.base_url}: ['another-model']" in different.stderr
    for refused in (twice, missing, different):
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert requests == 0 and not (tmp_path / "rollouts.jsonl").exists()  # no run began


def test_the_pool_is_named_by_repeated_flags_the_environment_or_the_settings_file(tmp_path: Path) -> None:
    """NANBEIGE_BASE_URL holds several, space-separated; the settings file a list (or one)."""
    calls = itertools.count()
    with FakeOpenAI(agent_script(calls)) as one, FakeOpenAI(agent_script(calls)) as two:
        env = {**os.environ, "NANBEIGE_BASE_URL": f"{one.base_url} {two.base_url}"}
        base = [NANBEIGE, "ask", "--no-default-servers", "--mcp", TESTKIT, "--trajectory"]
        by_env = subprocess.run(
            [*base, str(tmp_path / "env.jsonl"), "What is 4?"], capture_output=True, text=True, env=env, timeout=120
        )
        settings = tmp_path / "mine.toml"
        settings.write_text(f'base_url = ["{one.base_url}", "{two.base_url}"]\n')
        by_file = subprocess.run(
            [NANBEIGE, "--config", str(settings), *base[1:], str(tmp_path / "file.jsonl"), "What is 4?"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    for done in (by_env, by_file):
        assert done.returncode == 0, done.stderr
        assert f"endpoints: {one.base_url} " in done.stderr and f"; {two.base_url} " in done.stderr
    [trajectory] = load_trajectories(tmp_path / "env.jsonl")
    assert trajectory.answer == "4" and served(trajectory) <= {one.base_url, two.base_url}


def pool_of(*servers: FakeOpenAI, **config: Any) -> EndpointPool:
    base = LLMConfig(base_url=servers[0].base_url, model="fake-model", retry_wait_s=0.05, **config)
    return EndpointPool([OpenAIChat(member_config(base, s.base_url)) for s in servers], base)


@pytest.mark.anyio
async def test_with_every_endpoint_down_a_call_fails_naming_each_and_works_again_once_one_is_back() -> None:
    """The call's retry budget (`max_retry_s`, here 1 s; 300 s by default) is the pool's, not its members'."""
    with FakeOpenAI([], default="ok") as one, FakeOpenAI([], default="ok") as two:
        pool = pool_of(one, two, max_retry_s=1.0)
        try:
            assert (await pool.complete([{"role": "user", "content": "hi"}])).message["content"] == "ok"
            one.outage(3.0)
            two.outage(3600)
            with pytest.raises(
                EndpointUnavailable, match=r"all 2 model endpoints failed \(http://127.0\.0\.1:\d+/v1: "
            ):
                await pool.complete([{"role": "user", "content": "hi"}])
            await asyncio.sleep(3.5)  # one is back: with every endpoint out, each is probed again within 2 s
            completion = await pool.complete([{"role": "user", "content": "hi"}])
            assert completion.message["content"] == "ok" and completion.endpoint == one.base_url
        finally:
            await pool.aclose()


@pytest.mark.anyio
async def test_an_endpoint_that_keeps_answering_503_is_left_for_a_cooldown_then_probed_again() -> None:
    failing = threading.Event()
    failing.set()

    def sometimes(request: dict[str, Any]) -> Reply:
        return Reply(status=503) if failing.is_set() else Reply("ok")

    now = [0.0]
    with FakeOpenAI(sometimes) as flaky, FakeOpenAI([], default="ok") as steady:
        pool = pool_of(flaky, steady)
        pool.clock = lambda: now[0]
        try:
            first = await pool.complete([{"role": "user", "content": "hi"}])  # tries flaky (2 attempts), moves on
            assert first.endpoint == steady.base_url and len(flaky.requests) == 2
            for _ in range(3):  # new runs go to steady while flaky cools down
                assert (await pool.complete([{"role": "user", "content": "hi"}])).endpoint == steady.base_url
            assert len(flaky.requests) == 2
            failing.clear()
            now[0] += 31.0  # past the cooldown: the next new run probes flaky's model list, then uses it
            assert (await pool.complete([{"role": "user", "content": "hi"}])).endpoint == flaky.base_url
            assert flaky.gets[-1] == "/v1/models"
        finally:
            await pool.aclose()


@pytest.mark.anyio
async def test_judge_calls_spread_over_several_judge_endpoints_and_pass_over_one_that_is_down() -> None:
    """`--judge-base-url` (and the critic's) given several times: each request goes first where its hash
    says, the same request always to the same endpoint, and past one that does not answer."""
    import httpx

    from nanbeige.agent.cli.judge_options import critic_endpoint, judge_endpoint
    from nanbeige.evals.endpoint import chat_text

    with FakeOpenAI([], default="yes") as one, FakeOpenAI([], default="yes") as two:
        dead = closed_server()
        urls = [one.base_url, two.base_url, dead.base_url]
        judge = judge_endpoint(urls, "judge-model", None, None)
        assert (judge.base_url, judge.more_base_urls) == (one.base_url, (two.base_url, dead.base_url))
        assert critic_endpoint(urls[:1], None, None).more_base_urls == ()
        async with httpx.AsyncClient() as client:
            answers = [
                await chat_text(client, judge, [{"role": "user", "content": f"question {i}"}]) for i in range(30)
            ]
            again = len(one.requests)
            await chat_text(client, judge, [{"role": "user", "content": "question 0"}])
            asked_first = len(one.requests) > again
            await chat_text(client, judge, [{"role": "user", "content": "question 0"}])
            assert (len(one.requests) > again + 1) == asked_first  # the same request, the same endpoint
    assert answers == ["yes"] * 30
    assert len(one.requests) >= 10 and len(two.requests) >= 10  # a third each, and the dead one's share between them


def test_a_pools_runs_fit_its_smallest_context_and_record_its_first_endpoint_for_resume(tmp_path: Path) -> None:
    with (
        FakeOpenAI([], default=mcp_answer("4"), vllm=True, max_model_len=32768) as big,
        FakeOpenAI([], default=mcp_answer("4"), vllm=True, max_model_len=20000) as small,
    ):
        done = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "run.jsonl"),
                "--base-url",
                big.base_url,
                "--base-url",
                small.base_url,
                "What is 4?",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    [trajectory] = load_trajectories(tmp_path / "run.jsonl")
    assert trajectory.limits["max_context"] == 20000 and trajectory.limits["server"] == big.base_url


def test_doctor_checks_every_endpoint_of_a_pool(tmp_path: Path) -> None:
    with FakeOpenAI([]) as one:
        dead = closed_server()
        done = subprocess.run(
            [NANBEIGE, "doctor", "--model", "fake-model", "--base-url", one.base_url, "--base-url", dead.base_url],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "300"},
        )
    assert done.returncode == 1, done.stdout
    assert f"fake-model at {one.base_url}: an OpenAI-compatible server" in done.stdout
    assert f"no server at {dead.base_url} (" in done.stdout and "every endpoint of a pool must answer" in done.stdout
    assert "runs in this process" not in done.stdout


@pytest.mark.anyio
async def test_servers_that_all_restart_at_once_cost_the_run_only_time() -> None:
    with FakeOpenAI([], default="ok") as one, FakeOpenAI([], default="ok") as two:
        pool = pool_of(one, two, max_retry_s=60.0)
        try:
            assert (await pool.complete([{"role": "user", "content": "hi"}])).message["content"] == "ok"
            one.outage(12.0)  # longer than a member's own retries (10 s), within the call's budget
            two.outage(12.0)
            completion = await pool.complete([{"role": "user", "content": "hi"}])
            assert completion.message["content"] == "ok"
        finally:
            await pool.aclose()
