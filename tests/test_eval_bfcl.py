"""BFCL-V4 through bfcl-eval's own pipeline, held against that pipeline: the same scripted model answers
both `nanbeige eval bfcl-*` and the package's own generator and runner (`bfcl_oracle.py`), and every
verdict and summary number must agree. The package is installed with --no-deps plus `nanbeige[bfcl]`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from bfcl_oracle import official_verdicts, run_official, script_for
from fake_openai import FakeOpenAI, Reply

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.run_config import AgentConfig, BackendConfig, RunSettings, ToolsConfig
from nanbeige.evals import bfcl, bfcl_grading
from nanbeige.evals.benchmarks import BENCHMARKS
from nanbeige.evals.runner import EvalConfig, EvalError, evaluate
from nanbeige.evals.scores import markdown
from nanbeige.evals.tasks import LoadError

# Items per category in bfcl-eval 2026.3.23 (BFCL V4), as its generator loads them.
COUNTS = {
    "simple_python": 400,
    "simple_java": 100,
    "simple_javascript": 50,
    "multiple": 200,
    "parallel": 200,
    "parallel_multiple": 200,
    "irrelevance": 240,
    "live_simple": 258,
    "live_multiple": 1053,
    "live_parallel": 16,
    "live_parallel_multiple": 24,
    "live_irrelevance": 884,
    "live_relevance": 16,
    "multi_turn_base": 200,
    "multi_turn_miss_func": 200,
    "multi_turn_miss_param": 200,
    "multi_turn_long_context": 200,
    "memory_kv": 37 + 155,
    "memory_rec_sum": 37 + 155,
}
# The items both pipelines run: the first N of every category that runs here.
SAMPLE = {
    "simple_python": 20,
    "simple_java": 4,
    "simple_javascript": 4,
    "multiple": 10,
    "parallel": 10,
    "parallel_multiple": 4,
    "irrelevance": 4,
    "live_simple": 4,
    "live_multiple": 4,
    "live_parallel": 2,
    "live_parallel_multiple": 2,
    "live_irrelevance": 3,
    "live_relevance": 3,
    "multi_turn_base": 2,
    "multi_turn_miss_func": 1,
    "multi_turn_miss_param": 1,
    "multi_turn_long_context": 1,
    "memory_kv": 37 + 6,
    "memory_rec_sum": 37 + 6,
}  # a memory category's 37 prerequisite conversations first


def settings_for(server: FakeOpenAI) -> RunSettings:
    return RunSettings(
        llm=LLMConfig(base_url=server.base_url, model="fake"),
        agent=AgentConfig(),
        backend=BackendConfig(backend="openai", base_url_given=True),
        tools=ToolsConfig(),
    )


async def run_ours(server: FakeOpenAI, category: str, limit: int, out: Path) -> dict:
    bench = BENCHMARKS[f"bfcl-{category.replace('_', '-')}"]
    config = EvalConfig(bench=bench, data=None, out=out, limit=limit, concurrency=4)
    return await evaluate(config, settings_for(server), notice=lambda text: None)


# ---------------------------------------------------------------- what is run


def test_every_category_that_runs_here_loads_whole_as_the_official_generator_loads_it() -> None:
    for category, count in COUNTS.items():
        tasks = bfcl.load(category)
        assert len(tasks) == count and len({t.id for t in tasks}) == count, category
        assert all(t.level == category and t.metadata["entry"]["id"] == t.id for t in tasks)
    assert len(bfcl.load("all")) == sum(COUNTS.values())
    java = bfcl.load("simple_java")[0].metadata["entry"]["function"][0]["description"]
    assert "Java" in java  # the generator's language hint is in the function docs, as it sends them


def test_categories_that_cannot_run_here_and_unknown_ones_are_clear_errors() -> None:
    with pytest.raises(LoadError, match="embedding model"):
        BENCHMARKS["bfcl-memory-vector"].load(None)  # named, so that the reason is given
    with pytest.raises(LoadError, match="not run for function-calling models"):
        BENCHMARKS["bfcl-format-sensitivity"].load(None)
    with pytest.raises(LoadError, match="unknown BFCL category 'simple_rust'"):
        bfcl.load("simple_rust")
    with pytest.raises(LoadError, match="leave out --data"):
        BENCHMARKS["bfcl-simple-python"].load(Path("."))
    from nanbeige.evals.grading import grader_name

    with pytest.raises(EvalError, match="leave out --grader"):
        grader_name(EvalConfig(bench=BENCHMARKS["bfcl"], data=None, out=Path("."), grader="official"))


# ---------------------------------------------------------------- the official pipeline as the oracle


@pytest.mark.slow
@pytest.mark.anyio
async def test_every_verdict_and_summary_number_is_the_official_pipelines_on_the_same_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All 19 categories that run here, answered in the shapes real models give: right, without the newlines
    the handler needs, with Python quotes, with a null argument, one good and one broken call, an unclosed
    <think>, wrong values, plain text, multi-turn calls run on the simulated backends, and memory questions
    answered after the prerequisite conversations, in their order."""
    script = script_for(SAMPLE)
    with FakeOpenAI(script, vllm=True) as server:
        ours = {
            category: await run_ours(server, category, n, tmp_path / "ours" / category)
            for category, n in SAMPLE.items()
        }
        official = run_official(server.base_url, SAMPLE, tmp_path / "official", monkeypatch)
    ids = [item_id for item_id in script.items if "_prereq_" not in item_id]  # prerequisites are not scored
    expected = official_verdicts(official, ids)
    got = {}
    for category, report in ours.items():
        done = [i for i in ids if script.items[i][0]["id"].rsplit("_", 1)[0] == category]
        got |= {item_id: item_id not in report["wrong_ids"] for item_id in done}
    assert got == expected
    assert 0 < sum(expected.values()) < len(expected)  # the replies are neither all right nor all wrong
    # per category: the official runner's own accuracy on the same items
    official_table = {}
    for path in (official / bfcl.model_dir()).rglob("*_score.json"):
        head = json.loads(path.read_text().splitlines()[0])
        official_table[path.name.removeprefix("BFCL_v4_").removesuffix("_score.json")] = head["correct_count"]
    assert {c: r["categories"][c]["correct"] for c, r in ours.items()} == official_table
    # the shapes whose official verdict our earlier decoding got wrong
    assert expected["simple_python_1"] is False  # no newlines inside <tool_call>: the handler finds no call
    assert expected["simple_python_2"] is False  # Python quotes are not JSON
    assert expected["simple_python_5"] is True  # one readable call and one broken block: the readable one counts
    assert expected["simple_python_6"] is True  # a call after an unclosed <think> counts
    assert expected["multi_turn_base_0"] is True  # four turns of calls run on the simulated file system
    assert expected["memory_kv_1-customer-1"] is True  # answered from memory after its prerequisites
    assert expected["memory_kv_0-customer-0"] is False  # "I do not know"


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_summary_numbers_are_the_official_runners_and_the_missing_weight_is_named(tmp_path: Path) -> None:
    script = script_for({"simple_python": 10, "irrelevance": 4})
    with FakeOpenAI(script, vllm=True) as server:
        report = await run_ours(server, "simple_python", 10, tmp_path / "out")
    with open(tmp_path / "out" / "bfcl" / "score" / "data_overall.csv", newline="") as stream:
        row = next(csv.DictReader(stream))
    assert report["summary"]["Overall Acc"] == row["Overall Acc"]
    assert report["categories"]["simple_python"]["correct"] == 10 - len(report["wrong_ids"])
    # simple_python alone: the official overall counts every other category as 0
    assert report["missing_weight"]["agentic"] == 40 and report["missing_weight"]["multi_turn"] == 30
    assert report["partial"] is True  # --limit: the runner's --partial-eval


# ---------------------------------------------------------------- our conveniences around it


@pytest.mark.anyio
async def test_a_failing_model_server_leaves_the_item_undone_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    script = script_for({"simple_python": 4})
    failing = {"simple_python_2"}

    def flaky(request: dict) -> Reply | str:
        item = [i for i, (e, _, _) in script.items.items() if script.first_user(e) in request["prompt"]]
        if item and item[0] in failing:
            return Reply(status=400, body={"error": {"message": "this model is not loaded"}})
        return script(request)

    with FakeOpenAI(flaky, vllm=True) as server:
        report = await run_ours(server, "simple_python", 4, tmp_path / "out")
        assert report["items_done"] == 3 and report["failed_runs"] == 1
        [failed] = report["failed_run_errors"]  # with the server's words, in the report too
        assert failed["task_id"] == "simple_python_2" and "this model is not loaded" in failed["error"], failed
        assert f"- simple_python_2 run 0: {failed['error']}" in markdown(report)
        assert "simple_python_2" not in bfcl.done_ids(tmp_path / "out")
        # a torn last line (a kill mid-write) is dropped, not fatal
        result = next((tmp_path / "out" / "bfcl" / "result").rglob("*_result.json"))
        result.write_text(result.read_text() + '{"id": "simple_python_3", "res')
        failing.clear()
        asked = len(server.requests)
        report = await run_ours(server, "simple_python", 4, tmp_path / "out")
    assert report["items_done"] == 4 and report["failed_runs"] == 0
    assert len(server.requests) - asked == 1  # only the item that had failed ran again
    trajectories = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    starts = [t for t in trajectories if t["type"] == "start"]
    assert sorted(t["group_id"] for t in starts) == [f"simple_python_{i}" for i in range(4)]
    assert all("<|im_start|>system" in t["user_message"] for t in starts)  # the handler's prompt, as sent


@pytest.mark.anyio
async def test_a_prompt_too_long_for_the_server_is_the_items_outcome_not_a_failure(tmp_path: Path) -> None:
    script = script_for({"simple_python": 2})
    too_long = Reply(
        status=400,
        body={
            "error": {
                "message": "This model's maximum context length is 2048 tokens. However, you requested 4196 tokens.",
                "code": 400,
            }
        },
    )

    def model(request: dict) -> Reply | str:
        return (
            too_long if script.first_user(script.items["simple_python_1"][0]) in request["prompt"] else script(request)
        )

    with FakeOpenAI(model, vllm=True) as server:
        report = await run_ours(server, "simple_python", 2, tmp_path / "out")
    assert report["items_done"] == 2 and report["failed_runs"] == 0 and "simple_python_1" in report["wrong_ids"]
    line = next(
        json.loads(x)
        for x in next((tmp_path / "out" / "bfcl" / "result").rglob("*.json")).open()
        if json.loads(x)["id"] == "simple_python_1"
    )
    assert line["result"].startswith("Error during inference: ")  # as the official generator writes it


@pytest.mark.anyio
async def test_requests_carry_what_the_official_generator_sends(tmp_path: Path) -> None:
    script = script_for({"simple_python": 1})
    with FakeOpenAI(script, vllm=True) as server:
        await run_ours(server, "simple_python", 1, tmp_path / "out")
    (request,) = server.requests
    fields = {k: v for k, v in request.items() if not k.startswith("_")}
    assert set(fields) == {"model", "prompt", "max_tokens", "temperature"}
    assert fields["temperature"] == bfcl.TEMPERATURE and fields["max_tokens"] == 4096
    assert fields["prompt"].startswith("<|im_start|>system\n") and fields["prompt"].endswith("<|im_start|>assistant\n")


@pytest.mark.anyio
async def test_one_item_is_scored_even_where_the_official_summary_table_fails(tmp_path: Path) -> None:
    """The official runner needs two items for its latency statistics; with one it raises after writing
    the category's score. The report keeps the score and says why there is no summary."""
    script = script_for({"simple_python": 1})
    with FakeOpenAI(script, vllm=True) as server:
        report = await run_ours(server, "simple_python", 1, tmp_path / "out")
    assert report["categories"]["simple_python"] == {"accuracy": 100.0, "correct": 1, "total": 1}
    assert "StatisticsError" in report["runner_error"] and report["summary"] == {}


def test_eval_report_regrades_a_bfcl_folder_with_the_official_runner(tmp_path: Path) -> None:
    import anyio

    script = script_for({"simple_python": 3})

    async def main() -> dict:
        with FakeOpenAI(script, vllm=True) as server:
            return await run_ours(server, "simple_python", 3, tmp_path / "out")

    first = anyio.run(main)
    (tmp_path / "out" / "report.json").unlink()
    again = bfcl_grading.rerender(tmp_path / "out")
    assert again["categories"] == first["categories"] and again["wrong_ids"] == first["wrong_ids"]


@pytest.mark.anyio
async def test_an_out_folder_of_another_category_is_refused(tmp_path: Path) -> None:
    script = script_for({"simple_python": 1, "multiple": 1})
    with FakeOpenAI(script, vllm=True) as server:
        await run_ours(server, "simple_python", 1, tmp_path / "out")
        with pytest.raises(EvalError, match="holds an eval with bench"):
            await run_ours(server, "multiple", 1, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.anyio
async def test_nanbeige_eval_runs_bfcl_items_with_a_real_small_model_in_process(tmp_path: Path) -> None:
    """The in-process backend: SmolLM2 completes the handler's own prompts; the official runner grades."""
    from test_smollm2 import GGUF, smollm2_folder

    settings = RunSettings(
        llm=LLMConfig(model=str(smollm2_folder()), max_tokens=48),
        backend=BackendConfig(backend="transformers", gguf_file=GGUF),
        tools=ToolsConfig(),
    )
    config = EvalConfig(bench=BENCHMARKS["bfcl-simple-python"], data=None, out=tmp_path / "out", limit=2)
    report = await evaluate(config, settings, notice=lambda text: None)
    assert report["items_done"] == 2 and report["categories"]["simple_python"]["total"] == 2
    lines = [json.loads(line) for line in next((tmp_path / "out" / "bfcl" / "result").rglob("*.json")).open()]
    assert [line["id"] for line in lines] == ["simple_python_0", "simple_python_1"]
    assert all(isinstance(line["result"], str) for line in lines)  # the model's text, as the handler kept it


def test_the_command_prints_the_report_alone_on_stdout(tmp_path: Path) -> None:
    """The handler and the runner print as they go; that goes to bfcl/*.log, not into the report."""
    import subprocess
    import sys

    script = script_for({"multi_turn_base": 2})
    with FakeOpenAI(script, vllm=True) as server:
        result = subprocess.run(
            [
                str(Path(sys.executable).with_name("nanbeige")),
                "eval",
                "bfcl-multi-turn-base",
                "--limit",
                "2",
                "--base-url",
                server.base_url,
                "--out",
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## bfcl-multi-turn-base: 2 of 2 items, graded by bfcl-eval==2026.3.23")
    assert "multi_turn_base" in result.stdout and "Overall Acc" in result.stdout
    assert "Empty response" not in result.stdout + result.stderr and "🦍" not in result.stdout
    assert "Running test" in (tmp_path / "out" / "bfcl" / "runner.log").read_text()


def local_search(keywords: str, count: int) -> list[dict]:
    """A search of the local index from a worker thread, in the shape the engine's client gives."""
    import asyncio

    from nanbeige.tools.search import google_search

    found = asyncio.run(google_search(keywords, num=count))
    return [{"title": r["title"], "link": r["link"], "snippet": r["snippet"]} for r in found["organic"]]


@pytest.mark.slow
@pytest.mark.anyio
async def test_web_search_runs_on_our_search_backend_and_says_it_is_not_the_official_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's WebSearchAPI is run as it is, its engine's client answered by our local index; the
    verdicts are the official generator's and runner's with the same engine in place."""
    from nanbeige.tools.index import build_index

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "otters.md").write_text("# Sea otters\n\nSea otters hold hands while sleeping so they do not drift.")
    build_index([docs], tmp_path / "index")
    monkeypatch.setenv("NANBEIGE_SEARCH_BACKEND", "local")
    monkeypatch.setenv("NANBEIGE_INDEX", str(tmp_path / "index"))
    counts = {"web_search_base": 4, "web_search_no_snippet": 2}
    script = script_for(counts)
    with FakeOpenAI(script, vllm=True) as server:
        ours = {c: await run_ours(server, c, n, tmp_path / "ours" / c) for c, n in counts.items()}
        answered = [r["prompt"] for r in server.requests if "<tool_response>" in r["prompt"]]
        bfcl.use_search(local_search)  # the official generator's threads ask the same index
        try:
            official = run_official(server.base_url, counts, tmp_path / "official", monkeypatch)
        finally:
            bfcl.use_search(None)
    assert answered and all("Sea otters" in prompt for prompt in answered)  # the index's result reached the model
    assert any("hold hands" in p for p in answered) and not all("hold hands" in p for p in answered)  # no snippet
    expected = official_verdicts(official, list(script.items))
    got = {
        i: i not in report["wrong_ids"]
        for category, report in ours.items()
        for i in script.items
        if i.startswith(category)
    }
    assert got == expected and set(expected.values()) == {True, False}
    assert all("not the official engine" in r["search_engine"] for r in ours.values())
