"""tests/benchmarks/learning.py's own parts: the questions it splits before anything runs, and the warm start's
teacher, whose passing rollouts the small model imitates before RL (it must solve the task from the search
tool's result alone, through the real collect, search server and judge); and the verdict it prints on what
counts as learning."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))

from learning import BIN, LOOP_SAMPLING, make_questions, search_flags, small_model_folder, verdict  # noqa: E402
from warm_start import teacher_reply, teacher_server  # noqa: E402


def test_the_three_splits_are_disjoint_people_and_the_held_out_set_does_not_move_with_the_others() -> None:
    held_out, train, warm = make_questions(0, (10, 20, 30))
    people = [{row["question"] for row in split} for split in (held_out, train, warm)]
    assert [len(p) for p in people] == [10, 20, 30]
    assert not (people[0] & people[1]) and not (people[0] & people[2]) and not (people[1] & people[2])
    assert all(row["answer"].isdigit() for row in held_out + train + warm)
    assert make_questions(0, (10, 5, 0))[0] == held_out  # a smaller run keeps the same held-out people
    assert make_questions(1, (10, 0, 0))[0] != held_out  # and another seed draws others


def result(*entries: tuple[str, str]) -> str:
    organic = [{"title": title, "link": "file:///x", "snippet": snippet} for title, snippet in entries]
    return json.dumps({"organic": organic})


def prompt(tool_result: str | None) -> str:
    text = "<|im_start|>user\nIn what year was Ada Lovelace born? Answer with the year only.<|im_end|>\n"
    if tool_result is not None:
        text += "<|im_start|>assistant\n<tool_call>...</tool_call><|im_end|>\n"
        text += f"<|im_start|>tool\n{tool_result}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def test_the_start_is_chosen_sampling_as_the_loops_collect_samples() -> None:
    """Chosen at eval's top-p 0.95, a start passed 21.9% of the training questions and 1.6% in the loop."""
    from nanbeige.agent.run.run_config import RunSettings
    from nanbeige.trainer.collect import on_policy

    assert LOOP_SAMPLING == ("--top-p", str(on_policy(RunSettings(), print).llm.top_p))


def test_the_verdict_reads_the_two_eval_folders_and_says_which_bar_of_learning_each_score_clears(
    tmp_path: Path,
) -> None:
    from nanbeige.evals.scores import scores

    def eval_folder(work: Path, name: str, right_runs: list[int]) -> dict:
        """An eval folder as `nanbeige eval` writes it, of 20 questions, k=4, question i right in its first
        right_runs[i] runs; its report's scores."""
        folder = work / f"eval-{name}"
        folder.mkdir(parents=True)
        cells = {(f"q{i}", r): r < right for i, right in enumerate(right_runs) for r in range(4)}
        rows = [{"task_id": t, "run": r, "correct": ok} for (t, r), ok in cells.items()]
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return scores(cells, [f"q{i}" for i in range(20)], 4)

    learned = tmp_path / "learned"
    start = eval_folder(learned, "start", [1] * 10 + [0] * 10)  # 12.5%
    end = eval_folder(learned, "end", [4] * 8 + [1] * 2 + [0] * 10)  # 42.5%: every question as good or better
    said = verdict(learned, start, end).splitlines()
    assert said[0].startswith("held-out: 12.5% -> 42.5%, change +30.0 points [+")
    assert said[1:] == ["yes doubled", "yes up 10 points or more", "yes intervals apart"]
    less = tmp_path / "less"
    start = eval_folder(less, "start", [2] * 10 + [0] * 10)  # 25%
    end = eval_folder(less, "end", [3] * 10 + [0] * 10)  # 37.5%
    assert verdict(less, start, end).splitlines()[1:] == [
        "NO  doubled",
        "yes up 10 points or more",
        "NO  intervals apart",
    ]


def test_the_teacher_searches_for_the_person_then_reads_the_year_off_that_persons_result_only() -> None:
    call = teacher_reply(prompt(None))
    assert call.startswith("<tool_call>") and call.endswith("</tool_call>")
    assert json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "google_search",
        "arguments": {"q": "Ada Lovelace", "num": 2},
    }
    lovelace = ("Ada Lovelace", "English mathematician (1815–1852). Ada was...")
    byron = ("Lord Byron", "English poet (1788–1824).")
    assert teacher_reply(prompt(result(byron, lovelace))) == "1815"
    assert teacher_reply(prompt(result(byron))) == "unknown"  # another person's year is never taken
    assert teacher_reply(prompt(result(("Ada Lovelace", "An English mathematician.")))) == "unknown"
    assert teacher_reply(prompt("not json")) == "unknown"


@pytest.mark.slow
def test_the_teachers_rollouts_through_collect_search_and_judge_pass_and_call_the_tool(tmp_path: Path) -> None:
    """Its rollouts are what SFT imitates: each must call the real search server on the local index, and pass
    the exact-match judge with the year it read there."""
    import subprocess

    from learning import corpus

    model = small_model_folder()
    index = subprocess.run([str(BIN / "nanbeige"), "index", "build", str(corpus()), "--out", str(tmp_path / "index")])
    assert index.returncode == 0
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in make_questions(3, (0, 0, 3))[2]))
    search, env = search_flags(tmp_path)
    with teacher_server(model) as server:
        collect = [str(BIN / "nanbeige"), "collect", "--questions", str(questions), "-G", "1", "--out"]
        collect += [str(tmp_path / "rollouts.jsonl"), "--base-url", server.base_url, "--model", model, "--token-mode"]
        collect += [*search, "--dialect", "tool-call", "--max-turns", "3"]
        done = subprocess.run(collect, capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    judged = tmp_path / "judged.jsonl"
    judge = [str(BIN / "nanbeige"), "judge", str(tmp_path / "rollouts.jsonl"), "--out", str(judged), "--no-critic"]
    assert subprocess.run(judge, capture_output=True).returncode == 0
    records = [json.loads(line) for line in judged.read_text().splitlines()]
    assert [r["reward"] for r in records if r["type"] == "end"] == [1.0, 1.0, 1.0]
    calls = [call for r in records if r["type"] == "turn" for call in r["tool_calls"]]
    assert [call["name"] for call in calls] == ["google_search"] * 3
