"""`nanbeige eval`: every task k times against a loopback model, graded, scored, resumable."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Reply

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run.loop import AgentConfig
from nanbeige.agent.run.run_config import RunSettings, ToolsConfig
from nanbeige.evals.benchmarks import BENCHMARKS
from nanbeige.evals.judges import JUDGE_ENDPOINT
from nanbeige.evals.out_folder import read_results
from nanbeige.evals.runner import EvalConfig, evaluate

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")

# Our own questions in GAIA's metadata.jsonl format, and what the scripted model answers to each.
TASKS = [
    ("t1", "1", "Which city is the capital of France?", "Paris"),
    ("t2", "1", "What is six times seven?", "42"),
    ("t3", "2", "Name the first two letters of the alphabet.", "a, b"),
    ("t4", "3", "How many days are in a week?", "7"),
]
ANSWERS = {"t1": ["paris."], "t2": ["41", "42"], "t3": ["b, a"], "t4": ["7.0"]}


def write_gaia(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metadata.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": tid,
                    "Question": q,
                    "Level": int(level),
                    "Final answer": gold,
                    "file_name": "",
                    "Annotator Metadata": {},
                }
            )
            + "\n"
            for tid, level, q, gold in TASKS
        )
    )
    return path


def scripted_model(delay_s: float = 0.0, hold_after: int | None = None) -> Any:
    """Answers each question as ANSWERS plans: the n-th run of a task takes the n-th planned answer (the
    last one from then on); the summary turn repeats the answer the run gave. With `hold_after`, runs
    after that many started get no answer in time (an hour's wait): they are in flight until stopped."""
    started: Counter[str] = Counter()

    def reply(request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        if len(messages) > 2:  # the summary turn: the answer given before, boxed again
            given = re.findall(r"\\boxed\{([^}]*)\}", messages[-2]["content"])[-1]
            return Reply(content=f"<think>\nSo.\n</think>\n\\boxed{{{given}}}", delay_s=delay_s)
        if hold_after is not None and sum(started.values()) >= hold_after:
            return Reply(content="too late", delay_s=3600)
        task = next(tid for tid, _, q, _ in TASKS if messages[1]["content"].startswith(q))
        plan = ANSWERS[task]
        answer = plan[min(started[task], len(plan) - 1)]
        started[task] += 1
        return Reply(content=f"<think>\nI know this.\n</think>\n\\boxed{{{answer}}}", delay_s=delay_s)

    return reply


def settings_for(server: FakeOpenAI) -> RunSettings:
    return RunSettings(
        llm=LLMConfig(base_url=server.base_url, model="fake"),
        agent=AgentConfig(),
        tools=ToolsConfig(default_servers=False),
    )


@pytest.mark.anyio
async def test_every_task_runs_k_times_and_is_scored_by_hand_checked_metrics(tmp_path: Path) -> None:
    data = write_gaia(tmp_path / "gaia")
    config = EvalConfig(
        bench=BENCHMARKS["gaia"], grader="official", data=data, out=tmp_path / "out", k=3, concurrency=4
    )
    with FakeOpenAI(scripted_model()) as server:
        report = await evaluate(config, settings_for(server), notice=lambda text: None)
    rows = read_results(tmp_path / "out")
    assert sorted((r["task_id"], r["run"]) for r in rows) == [(t, r) for t, *_ in TASKS for r in range(3)]
    # t1 right 3 times ("paris." matches "Paris"), t2 2 times, t3 never (order matters), t4 3 times ("7.0" = 7)
    assert Counter(r["task_id"] for r in rows if r["correct"]) == {"t1": 3, "t2": 2, "t4": 3}
    assert report["avg_at_k"] == round(100 * 8 / 12, 2) and report["pass_at_k"] == 75.0
    assert sorted(report["runs"]) == [50.0, 75.0, 75.0]  # the run that got "41" scored 2 of 4
    levels = {
        level: {k: v for k, v in scores.items() if k not in ("std_kind", "avg_at_k_ci95")}
        for level, scores in report["levels"].items()
    }
    assert levels == {
        "1": {
            "tasks": 2,
            "avg_at_k": round(100 * 5 / 6, 2),
            "pass_at_k": 100.0,
            "best_at_1": 100.0,
            "std": report["levels"]["1"]["std"],
            "runs": report["levels"]["1"]["runs"],
        },
        "2": {"tasks": 1, "avg_at_k": 0.0, "pass_at_k": 0.0, "best_at_1": 0.0, "std": 0.0, "runs": [0.0] * 3},
        "3": {"tasks": 1, "avg_at_k": 100.0, "pass_at_k": 100.0, "best_at_1": 100.0, "std": 0.0, "runs": [100.0] * 3},
    }
    # each level's interval: a resample of its tasks' scores (level 1: t1 3 of 3, t2 2 of 3)
    assert {level: report["levels"][level].pop("avg_at_k_ci95") for level in "123"} == {
        "1": [round(100 * 2 / 3, 2), 100.0],
        "2": [0.0, 0.0],
        "3": [100.0, 100.0],
    }
    assert report["stop_reasons"] == {"answered": 12} and report["mean_turns"] == 2  # the answer + the summary
    row = next(r for r in rows if r["task_id"] == "t3")
    assert (row["prediction"], row["gold"], row["grader"], row["level"]) == ("b, a", "a, b", "gaia-exact", "2")
    trajectories = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    ends = {t["trajectory_id"] for t in trajectories if t["type"] == "end"}
    assert {r["trajectory_id"] for r in rows} == ends  # every row names its trajectory in the out folder
    assert json.loads((tmp_path / "out" / "report.json").read_text())["avg_at_k"] == report["avg_at_k"]


@pytest.mark.anyio
async def test_a_judge_profile_grades_through_the_judge_endpoint(tmp_path: Path) -> None:
    data = write_gaia(tmp_path / "gaia")

    def judge(request: dict[str, Any]) -> str:
        prompt = request["messages"][-1]["content"]
        return "Correct" if "paris" in prompt.lower() else "Incorrect"

    with FakeOpenAI(scripted_model()) as model, FakeOpenAI(judge) as judge_server:
        config = EvalConfig(
            bench=BENCHMARKS["gaia"],
            data=data,
            out=tmp_path / "out",
            k=1,
            limit=1,
            grader="equivalent/reference",
            judge=replace(JUDGE_ENDPOINT, base_url=judge_server.base_url, model="judge"),
        )
        report = await evaluate(config, settings_for(model), notice=lambda text: None)
    [row] = read_results(tmp_path / "out")
    assert (row["correct"], row["grader"], row["judge_model"]) == (True, "equivalent/reference", "judge")
    assert report["avg_at_k"] == 100.0 and report["tasks"] == 1  # --limit 1: the first task only
    assert len(judge_server.requests) <= 1  # "paris." is not "Paris" verbatim, so the judge was asked at most once


@pytest.mark.anyio
async def test_keys_the_model_or_judge_quote_never_reach_the_results_file(tmp_path: Path) -> None:
    data = write_gaia(tmp_path / "gaia")
    model_key, judge_key = "sk-model-0123456789", "sk-judge-9876543210"

    def leaky(request: dict[str, Any]) -> Reply:
        return Reply(content=f"\\boxed{{{model_key} {judge_key}}}")

    def judge(request: dict[str, Any]) -> str:
        return f"extracted_final_answer: {judge_key}\nreasoning: it quotes {model_key}\ncorrect: no\nconfidence: 50"

    with FakeOpenAI(leaky) as model, FakeOpenAI(judge) as judge_server:
        settings = settings_for(model)
        settings.llm.api_key = model_key
        config = EvalConfig(
            bench=BENCHMARKS["gaia"],
            data=data,
            out=tmp_path / "out",
            k=1,
            limit=1,
            grader="browsecomp-zh/official",
            judge=replace(JUDGE_ENDPOINT, base_url=judge_server.base_url, model="judge", api_key=judge_key),
        )
        await evaluate(config, settings, notice=lambda text: None)
    written = (tmp_path / "out" / "results.jsonl").read_text()
    assert model_key not in written and judge_key not in written
    [row] = read_results(tmp_path / "out")
    assert row["prediction"] == "[REDACTED] [REDACTED]" and "[REDACTED]" in row["reason"]  # the judge quoted it


def eval_command(data: Path, out: Path, server: FakeOpenAI) -> list[str]:
    return [
        NANBEIGE,
        "eval",
        "gaia",
        "--data",
        str(data),
        "--out",
        str(out),
        "-k",
        "3",
        "--concurrency",
        "2",
        "--base-url",
        server.base_url,
        "--no-default-servers",
        "--grader",
        "official",
    ]


def wait_for_results(out: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while len(read_results(out)) < count and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_eval_resumes_without_redoing_finished_runs(tmp_path: Path, how: signal.Signals) -> None:
    data, out = write_gaia(tmp_path / "gaia"), tmp_path / "out"
    env = {**os.environ, "COLUMNS": "200"}
    # four runs can finish, the others wait for answers until the signal: some done, some not, however
    # long the signal takes to land
    with FakeOpenAI(scripted_model(delay_s=0.15, hold_after=4)) as server:
        process = subprocess.Popen(
            eval_command(data, out, server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        wait_for_results(out, 3, process)
        process.send_signal(how)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL), stderr
    assert "Traceback" not in stderr
    before = read_results(out)
    assert 3 <= len(before) < 12
    with FakeOpenAI(scripted_model()) as server:
        finished = subprocess.run(eval_command(data, out, server), capture_output=True, text=True, env=env, timeout=120)
        first_calls = [r for r in server.requests if len(r["messages"]) == 2]
    assert finished.returncode == 0, finished.stderr
    rows = read_results(out)
    assert sorted((r["task_id"], r["run"]) for r in rows) == [(t, r) for t, *_ in TASKS for r in range(3)]
    assert len(first_calls) == 12 - len(before)  # only the missing runs were run again
    assert f"resuming: {len(before)} of 12 runs already done" in finished.stderr
    assert "| pass@3 | 75.00% |" in finished.stdout
    again = subprocess.run([NANBEIGE, "eval", "report", str(out)], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "| pass@3 | 75.00% |" in again.stdout and "| level |" in again.stdout


def test_bad_input_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    data = write_gaia(tmp_path / "gaia")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [NANBEIGE, "eval", *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=60
        )

    cases = [
        (run("nope", "--data", str(data)), "unknown benchmark 'nope'"),
        (run("gaia"), "--data is required"),
        (run("gaia", "--data", str(tmp_path / "missing.jsonl")), "no such file"),
        (run("browsecomp", "--data", str(data), "--out", str(tmp_path / "o1")), "metadata.jsonl"),
        (
            run("gaia", "--data", str(data), "--grader", "equivalent/reference", "--out", str(tmp_path / "o2")),
            "NANBEIGE_JUDGE_API_KEY",
        ),
        (run("report", str(tmp_path)), "eval.json"),
    ]
    for result, words in cases:
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert words in result.stderr and "crashed" not in result.stderr, (words, result.stderr)
        assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1, result.stderr
    assert not (tmp_path / "o2").exists()  # refused before anything was written


def test_attachments_are_named_in_the_question_and_their_folder_is_uploadable(tmp_path: Path) -> None:
    from nanbeige.agent.setup.setup import default_servers
    from nanbeige.evals.runner import load_tasks, with_out

    folder = tmp_path / "gaia"
    folder.mkdir()
    (folder / "sheet.csv").write_text("a,b\n1,2\n")
    (folder / "metadata.jsonl").write_text(
        json.dumps(
            {
                "task_id": "f1",
                "Question": "What is in the sheet?",
                "Level": 1,
                "Final answer": "2",
                "file_name": "sheet.csv",
            }
        )
        + "\n"
    )
    config = EvalConfig(bench=BENCHMARKS["gaia"], grader="official", data=folder, out=tmp_path / "out")
    [task] = load_tasks(config)
    assert str(folder / "sheet.csv") in task.question and task.files == [folder / "sheet.csv"]
    settings = with_out(RunSettings(), config, [task])
    assert settings.trajectory == tmp_path / "out" / "trajectories.jsonl"
    [python] = [
        s
        for s in default_servers(settings.llm, lambda text: None, settings.tools.upload_dirs)
        if s.name == "tool-python"
    ]
    assert str(folder) in python.env["NANBEIGE_SANDBOX_UPLOAD_DIRS"].split(os.pathsep)


@pytest.mark.anyio
async def test_a_judge_that_refuses_stops_the_eval_and_scores_nothing(tmp_path: Path) -> None:
    from nanbeige.evals.runner import EvalError

    data = write_gaia(tmp_path / "gaia")
    with FakeOpenAI(scripted_model()) as model, FakeOpenAI([], default=Reply(status=401)) as judge_server:
        config = EvalConfig(
            bench=BENCHMARKS["gaia"],
            data=data,
            out=tmp_path / "out",
            k=1,
            concurrency=1,
            grader="equivalent/reference",
            judge=replace(JUDGE_ENDPOINT, base_url=judge_server.base_url, model="judge"),
        )
        with pytest.raises(EvalError, match="the judge cannot be used: judge answered HTTP 401"):
            await evaluate(config, settings_for(model), notice=lambda text: None)
    assert read_results(tmp_path / "out") == []  # nothing scored wrong for the judge's sake: a resume grades them


@pytest.mark.anyio
async def test_an_eval_with_a_reference_checkout_reports_it_and_resumes_only_with_it(tmp_path: Path) -> None:
    import dataclasses

    from reference_tree import make_reference

    from nanbeige.agent.reference.checkout import load
    from nanbeige.evals.runner import EvalError

    checkout = make_reference(tmp_path / "miro")
    data = write_gaia(tmp_path / "gaia")
    config = EvalConfig(bench=BENCHMARKS["gaia"], grader="official", data=data, out=tmp_path / "out", k=1, limit=1)
    with FakeOpenAI(scripted_model()) as server:
        settings = dataclasses.replace(settings_for(server), reference=checkout)
        report = await evaluate(config, settings, notice=lambda text: None)
        assert report["reference"] == load(checkout).identity()
        assert server.requests[0]["messages"][1]["content"].endswith("PLACEHOLDER-SUFFIX in \\boxed{}.")
        # the checkout's sampling where none was given (its YAML: temperature 0.3, top-p 0.95; no penalty)
        assert (server.requests[0]["temperature"], server.requests[0]["top_p"]) == (0.3, 0.95)
        with pytest.raises(EvalError, match="reference"):  # the same out folder, our own prompts: not the same eval
            await evaluate(config, settings_for(server), notice=lambda text: None)
