"""The real-vLLM tier: `nanbeige serve` starts vLLM's CPU build with a small real model (SmolLM2-135M-
Instruct) and every client path runs against it. These tests run where vLLM is installed in this Python
(CI installs the CPU build in an environment of its own: .ci/run; docs/serving.md says how); one server serves
the whole module. The model's choices are its own, so the tests assert what must hold whatever it says."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from conftest import free_port
from real_vllm import (
    ECHO_SERVER,
    SERVED_NAME,
    SHORT,
    Exchange,
    RecordingProxy,
    Server,
    ask,
    collect,
    distance,
    field_paths,
    greedy,
    model_logprobs,
    nanbeige,
    prefix_cache_counts,
    smollm2_hf_folder,
    start_server,
    trainer_drift,
    two_questions,
    vllm_installed,
)

from nanbeige.agent.run.tokens import full_prompt, training_rows
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

if not vllm_installed() and os.environ.get("NANBEIGE_REQUIRE_VLLM"):  # CI: a tier that skips has not run
    pytest.fail("NANBEIGE_REQUIRE_VLLM is set and vLLM is not installed in this Python", pytrace=False)
if not vllm_installed():
    pytest.skip(
        "the real-vLLM tier needs vLLM in this Python (docs/serving.md: the real-vLLM tier)", allow_module_level=True
    )

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_serve_decides_at_once_that_a_hub_model_cannot_be_had(tmp_path: Path, hub: str) -> None:
    """Before, vLLM retried the Hub for about 40 s (15 s offline) and ended in a traceback; now one line, before
    vLLM starts."""
    import subprocess

    from real_vllm import NANBEIGE

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    if hub == "unreachable":  # online, but nothing listens where the Hub would be
        env |= {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    result = subprocess.run(
        [NANBEIGE, "serve", "--model", "Org/not-here", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()  # nothing from vLLM: it was never started
    assert line.startswith("error: 'Org/not-here' is not downloaded here") and "hf download Org/not-here" in line


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_hf_folder(tmp_path_factory.mktemp("smollm2-hf"))


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(model, free_port(), tmp_path_factory.mktemp("serve") / "serve.log")
    yield running
    assert running.stop() == 130  # Ctrl-C: the server stopped in order


def test_serve_runs_vllms_cpu_build_and_says_so(server: Server, model: Path) -> None:
    assert server.stdout[:3] == [
        f"{server.url}\n",
        f"NANBEIGE_BASE_URL={server.url}\n",
        f"NANBEIGE_MODEL={SERVED_NAME}\n",
    ]
    assert "vLLM's CPU build serves the model on this machine's CPU" in server.stderr_text()
    [listed] = httpx.get(f"{server.url}/models").json()["data"]
    assert (listed["id"], listed["root"], listed["max_model_len"]) == (SERVED_NAME, str(model), 8192)


@pytest.mark.parametrize("dialect", ["mcp-xml", "tool-call"])
def test_ask_runs_against_real_vllm_in_both_dialects(server: Server, tmp_path: Path, dialect: str) -> None:
    records = ask(server.url, tmp_path, "--dialect", dialect, "--max-turns", "2")
    start, turns, end = records[0], [r for r in records if r["type"] == "turn"], records[-1]
    assert start["dialect"] == dialect and start["limits"]["server"] == server.url
    assert start["limits"]["max_context"] == 8192  # read from vLLM's max_model_len
    assert turns and all(turn["usage"]["prompt_tokens"] > 0 for turn in turns)
    assert end["type"] == "end" and end["stop_reason"] != "model_error", end


def test_token_mode_sends_and_records_exactly_the_ids_vllm_saw_and_sampled(server: Server, tmp_path: Path) -> None:
    """Every turn: the prompt ids we sent are vLLM's echo of them, and the trajectory's completion ids
    and logprobs are vLLM's own. The tokenizer is found through /v1/models' root (the served name is none)."""
    proxy = RecordingProxy(server.url)
    try:
        trajectory = tmp_path / "run.jsonl"
        result = nanbeige(
            "ask",
            "--base-url",
            proxy.url,
            "--model",
            SERVED_NAME,
            "--token-mode",
            "--trajectory",
            str(trajectory),
            *ECHO_SERVER,
            *SHORT,
            "--max-turns",
            "3",
            "--dialect",
            "mcp-xml",
            "What is 2 + 3?",
            cwd=tmp_path,
        )
        assert result.returncode in (0, 1), result.stderr
    finally:
        proxy.close()
    [run] = load_trajectories(trajectory)
    sent = [x for x in proxy.exchanges if x.path == "/v1/completions"]
    assert len(sent) == len(run.turns) >= 2
    for turn, exchange in zip(run.turns, sent):
        assert exchange.request["prompt"] == full_prompt(run.turns, turn.index) == exchange.prompt_token_ids
        assert turn.completion_ids == exchange.token_ids
        assert turn.logprobs == pytest.approx(exchange.logprobs, abs=0)
    training_rows(run.turns)  # raises unless every prefix hash and logprob checks out


def test_collect_groups_concurrently_token_exact_and_from_the_prefix_cache(
    server: Server, model: Path, tmp_path: Path
) -> None:
    questions = two_questions(tmp_path)
    queries, hits = prefix_cache_counts(server.url)
    out = tmp_path / "rollouts.jsonl"
    result = collect([server.url], questions, out, "-G", "3", "--concurrency", "6", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs = load_trajectories(out)
    assert len(runs) == 6 and sorted(r.rollout_index for r in runs) == [0, 0, 1, 1, 2, 2]
    assert len({r.group_id for r in runs}) == 2
    for run in runs:
        assert run.turns and run.stop_reason != "model_error"
        training_rows(run.turns)
    queries_after, hits_after = prefix_cache_counts(server.url)
    # Six rollouts of two questions share one system prompt and, per group, the whole first prompt.
    assert (hits_after - hits) / (queries_after - queries) > 0.6
    drift = assert_collect_samples_on_policy(model, runs, tmp_path)
    assert_the_dialects_answering_settings_sample_off_policy(server, model, questions, drift, tmp_path)


def assert_collect_samples_on_policy(model: Path, runs: list[Any], tmp_path: Path) -> float:
    """On-policy: collect samples with the temperature alone (top-p 1, no penalty), so the trainer's π_old of
    the same weights is the sampler's distribution, up to vLLM's bfloat16 arithmetic. Returns the drift."""
    assert {(r.sampling["top_p"], r.sampling["repetition_penalty"]) for r in runs} == {(1.0, 1.0)}
    drift = trainer_drift(model, runs, temperature=0.7, out=tmp_path / "train")
    print(
        f"mean |log pi_old - log pi_vllm| over {sum(len(t.completion_ids) for r in runs for t in r.turns)} "
        f"sampled tokens: {drift:.2e}"
    )
    assert drift < 0.05
    return drift


def assert_the_dialects_answering_settings_sample_off_policy(
    server: Server, model: Path, questions: Path, drift: float, tmp_path: Path
) -> None:
    """The dialect's answering settings (top-p 0.95, repetition penalty 1.05) sample another distribution:
    collect says it is off-policy, and the trainer's π_old is more than twice as far from it."""
    nucleus = tmp_path / "nucleus.jsonl"
    result = collect(
        [server.url],
        questions,
        nucleus,
        "--limit",
        "1",
        "-G",
        "2",
        "--top-p",
        "0.95",
        "--repetition-penalty",
        "1.05",
        cwd=tmp_path,
    )
    assert result.returncode == 0 and "off-policy" in result.stderr, result.stderr
    off = trainer_drift(model, load_trajectories(nucleus), temperature=0.7, out=tmp_path / "train-off")
    print(f"the same with top-p 0.95 and repetition penalty 1.05: {off:.2e}")
    assert off > 2 * drift


def test_a_question_longer_than_the_context_ends_the_run_in_one_line(server: Server, tmp_path: Path) -> None:
    long_question = "Count the words in this text. " + "alpha beta gamma delta " * 2500  # ~10k tokens > 8192
    for mode in ("--no-token-mode", "--token-mode"):
        records = ask(server.url, tmp_path, mode, question=long_question)
        assert records[-1]["stop_reason"] == "context_limit", records[-1]


def test_collect_over_a_pool_of_two_endpoints_keeps_each_run_on_one_and_token_exact(
    server: Server, tmp_path: Path
) -> None:
    """Two addresses in front of the one real vLLM (proxies that record what crosses them) as a pool: each
    rollout's turns all went through one of them, both served rollouts, and what each recorded is exactly what
    the trajectory holds (the prompt ids vLLM echoed, the ids and logprobs it sampled)."""
    questions = two_questions(tmp_path)
    proxies = [RecordingProxy(server.url), RecordingProxy(server.url)]
    out = tmp_path / "rollouts.jsonl"
    try:
        result = collect(
            [proxy.url for proxy in proxies], questions, out, "-G", "2", "--concurrency", "4", cwd=tmp_path
        )
    finally:
        for proxy in proxies:
            proxy.close()
    assert result.returncode == 0, result.stderr
    runs = load_trajectories(out)
    assert len(runs) == 4
    by_url = {proxy.url: [x for x in proxy.exchanges if x.path == "/v1/completions"] for proxy in proxies}
    assert all(by_url.values())  # both endpoints served
    assert_each_run_went_through_one_endpoint_token_exact(runs, by_url)
    assert f"endpoints: {proxies[0].url} " in result.stderr


def assert_each_run_went_through_one_endpoint_token_exact(runs: list[Any], by_url: dict[str, list[Exchange]]) -> None:
    """Each rollout's turns all went through one endpoint, whose record of each is exactly what the trajectory
    holds, and the endpoints passed on no request besides the rollouts' turns."""
    for run in runs:
        [endpoint] = {turn.endpoint for turn in run.turns}
        for turn in run.turns:  # the same prompt and ids twice is one rollout's twin: either will do
            prompt = full_prompt(run.turns, turn.index)
            exchange = next(
                x
                for x in by_url[endpoint]
                if x.token_ids == turn.completion_ids and x.request["prompt"] == prompt == x.prompt_token_ids
            )
            assert turn.logprobs == pytest.approx(exchange.logprobs, abs=0)
        training_rows(run.turns)
    assert sum(len(exchanges) for exchanges in by_url.values()) == sum(len(run.turns) for run in runs)


def test_a_rolled_back_reply_in_chat_mode_does_not_end_the_run_at_a_false_context_limit(
    server: Server, tmp_path: Path
) -> None:
    """A 1.3k-token prompt in a 4k context (2k of it kept for the answer): a reply cut off at 4 tokens is
    rolled back, the same prompt goes again, and the run goes on. Counting the dropped reply and the first
    prompt's estimate again made it 4.6k: the run ended at once as context_limit."""
    # greedy and 4 tokens: the model's greedy reply here is "2 + 3 = 5" (8 tokens, then it stops), so each
    # try is cut off the same way (sampled at 8 tokens, a try that said just that ended before the limit)
    records = ask(
        server.url,
        tmp_path,
        "--dialect",
        "mcp-xml",
        "--max-turns",
        "2",
        "--max-tokens",
        "4",
        "--max-context",
        "4096",
        "--temperature",
        "0",
    )
    turns = [r for r in records if r["type"] == "turn"]
    assert turns[0]["rolled_back"] and turns[0]["format_error"].endswith("cut off at the token limit")
    assert len(turns) > 2 and records[-1]["stop_reason"] != "context_limit", [t["usage"] for t in turns]


def test_the_training_loops_lora_sync_hot_loads_an_adapter_that_token_mode_then_samples_from(
    server: Server, model: Path, tmp_path: Path
) -> None:
    """What `train --loop --sync lora` does between iterations: a checkpoint's adapter is loaded into the
    serving vLLM under the checkpoint's path, and the next collect samples from it by that name (the
    checkpoint holds the tokenizer token mode loads)."""
    import asyncio

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nanbeige.trainer.sync import load_adapter

    checkpoint = tmp_path / "step-1"
    torch.manual_seed(0)
    adapter = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model),
        LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with torch.no_grad():  # far from the base model, so that greedy decoding must come out otherwise
        for name, weight in adapter.named_parameters():
            if "lora_" in name:
                weight.normal_(0.0, 0.5)
    adapter.save_pretrained(checkpoint / "adapter")
    AutoTokenizer.from_pretrained(model).save_pretrained(checkpoint)
    asyncio.run(load_adapter(server.url, str(checkpoint), checkpoint / "adapter"))
    listed = {entry["id"]: entry for entry in httpx.get(f"{server.url}/models").json()["data"]}
    assert listed[str(checkpoint)]["root"] == str(checkpoint / "adapter")
    asyncio.run(load_adapter(server.url, str(checkpoint), checkpoint / "adapter"))  # loaded already: a no-op
    prompt = [1, 9690, 198, 30]
    ids, logprobs = greedy(server, prompt, str(checkpoint))
    assert ids != greedy(server, prompt)[0]  # the adapter changes the model
    # and the served policy is the trained one: its logprobs are the adapter's as peft applies it (up to
    # bfloat16 arithmetic), not the base model's; an adapter loaded but not applied, or scaled otherwise, fails
    trained_error = distance(logprobs, model_logprobs(adapter, prompt, ids))
    base_error = distance(logprobs, model_logprobs(AutoModelForCausalLM.from_pretrained(model), prompt, ids))
    print(f"served logprobs vs the adapter: {trained_error:.3f}, vs the base model: {base_error:.3f}")
    assert trained_error < 0.25 and trained_error < base_error / 3
    trajectory = tmp_path / "run.jsonl"
    result = nanbeige(
        "ask",
        "--base-url",
        server.url,
        "--model",
        str(checkpoint),
        "--token-mode",
        "--trajectory",
        str(trajectory),
        *ECHO_SERVER,
        *SHORT,
        "--max-turns",
        "1",
        "What is 2 + 3?",
        cwd=tmp_path,
    )
    assert result.returncode in (0, 1), result.stderr
    [run] = load_trajectories(trajectory)
    assert run.model == str(checkpoint) and run.turns and run.turns[0].completion_ids


def test_the_loops_weight_sync_loads_a_full_checkpoint_into_the_running_server(
    server: Server, model: Path, tmp_path: Path
) -> None:
    """What `train --loop --sync weights` does between iterations: vLLM's reload_weights on the new
    checkpoint's folder, in place; the server then answers with the new weights, without a restart."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from nanbeige.trainer.sync import load_weights

    prompt = [1, 9690, 198, 30]
    before = greedy(server, prompt)
    changed = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.no_grad():  # far enough from the served weights that greedy decoding must come out otherwise
        for layer in changed.model.layers:
            layer.mlp.down_proj.weight.add_(torch.randn_like(layer.mlp.down_proj.weight) * 0.05)
    checkpoint = tmp_path / "checkpoint-1"
    changed.save_pretrained(checkpoint)
    try:
        asyncio.run(load_weights(server.url, checkpoint))
        ids, logprobs = greedy(server, prompt)
        assert (ids, logprobs) != before
        # the server's logprobs of what it said are the new model's (up to bfloat16 arithmetic), not the old one's
        new_error = distance(logprobs, model_logprobs(changed, prompt, ids))
        old_error = distance(logprobs, model_logprobs(AutoModelForCausalLM.from_pretrained(model), prompt, ids))
        print(f"served logprobs vs the new weights: {new_error:.3f}, vs the old: {old_error:.3f}")
        assert new_error < 0.25 and new_error < old_error / 3
    finally:
        asyncio.run(load_weights(server.url, model))  # the other tests' model again
    assert greedy(server, prompt)[0] == before[0]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"prompt": [1, 9690, 198], "logprobs": 0, "skip_special_tokens": False}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
    ],
)
def test_the_imitation_server_answers_with_the_fields_vllm_answers_with(
    server: Server, path: str, body: dict[str, Any]
) -> None:
    """The rest of the suite talks to tests/fake_openai.py: every field it answers with is where real vLLM
    puts it, with the same type (vLLM has more, which the client does not read)."""
    from fake_openai import FakeOpenAI

    body = {"model": SERVED_NAME, "max_tokens": 4, "temperature": 0.0, "return_token_ids": True} | body
    real = httpx.post(f"{server.url}{path}", json=body, timeout=120).json()
    with FakeOpenAI(["four"], vllm=True) as fake:
        imitation = httpx.post(f"{fake.base_url}{path}", json=body, timeout=30).json()
    missing = field_paths(imitation) - field_paths(real)
    assert not missing, f"the imitation answers with fields real vLLM does not: {sorted(missing, key=str)}"
    choice = real["choices"][0]
    assert len(choice["token_ids"]) == 4 and real["usage"]["completion_tokens"] == 4
