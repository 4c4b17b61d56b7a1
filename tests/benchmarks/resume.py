"""Benchmark: the time `nanbeige resume` takes to pick up a long run, before it asks the model again.

A synthetic trajectory of T turns (default 600) is written with the real writer: each turn an mcp-xml
tool call whose tool result is R bytes (default 100 kB). Then, as `resume` does: the file is read
(`pick`: load, choose, check the token records rebuild), the trajectory cut after its last complete
turn and reopened, and the run's state rebuilt (`rebuild`: the history with its keep-K view, the
token tracker, the client's prompt state).

Modes: `chat`, turns without token records (a chat server); `token`, each turn with a token record
as token mode writes it (keep-K rewriting the prompt part-way every turn, so each delta holds the
K newest results' ids: the file is much larger), and the client's prompt state restored with the
tiny test model's tokenizer and template.

    python tests/benchmarks/resume.py [--turns 600] [--result-bytes 100000] [--keep 5] [--mode chat token]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai and tiny_model

from fake_openai import mcp_call  # noqa: E402

from nanbeige.agent.backends.scripted import ScriptedLLM  # noqa: E402
from nanbeige.agent.cli.resume import pick  # noqa: E402
from nanbeige.agent.run.restore import rebuild, reopen  # noqa: E402
from nanbeige.agent.run.tokens import TokenTracker  # noqa: E402
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn  # noqa: E402
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter  # noqa: E402

TOOL = {
    "server": "testkit",
    "name": "echo",
    "description": "Return the text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def write(path: Path, turns: int, result_bytes: int, keep: int, token: bool) -> None:
    trajectory = Trajectory(
        question="q",
        system_prompt="You can use tools.",
        user_message="q",
        tools=[TOOL],
        limits={"keep_tool_results": keep, "max_turns": turns + 5},
    )
    writer, tracker = TrajectoryWriter(path), TokenTracker()
    writer.start(trajectory)
    head, shown = list(range(1000)), []  # the prompt: a head, then per turn its completion and its result
    for index in range(turns):
        text = f"finding {index} " + "x" * result_bytes
        turn = Turn(
            index=index,
            assistant={"role": "assistant", "content": mcp_call("testkit", "echo", {"text": "a"})},
            tool_calls=[ToolCall(server="testkit", name="echo", arguments={"text": "a"})],
            tool_results=[ToolResult(text=text)],
            usage={"prompt_tokens": 1, "completion_tokens": 200},
        )
        if token:  # ids stand in for tokens: 4 bytes a token; an omitted result becomes 8 ids
            prompt = head + [i for completion, result in shown for i in completion + result]
            tracker.record(turn, prompt, [index % 700] * 200)
            shown.append(([index % 700] * 200, [7] * (len(text) // 4)))
            if len(shown) > keep:
                shown[-keep - 1] = (shown[-keep - 1][0], [9] * 8)
        writer.turn(trajectory, turn)
    writer.close()  # killed: no end line


def llm_for(token: bool) -> object:
    if not token:
        return ScriptedLLM([])
    from tiny_model import make_tiny_model

    from nanbeige.agent.backends.llm import LLMConfig
    from nanbeige.agent.backends.token_mode import TokenModeChat, load_tokenizer

    tokenizer = load_tokenizer(str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny")))[0]
    return TokenModeChat(LLMConfig(model="tiny"), tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--result-bytes", type=int, default=100_000)
    parser.add_argument("--keep", type=int, default=5)
    parser.add_argument("--mode", nargs="+", default=["chat", "token"], choices=["chat", "token"])
    args = parser.parse_args()
    for mode in args.mode:
        token = mode == "token"
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "run.jsonl"
            write(path, args.turns, args.result_bytes, args.keep, token)
            llm = llm_for(token)
            started = time.perf_counter()
            trajectory = pick(path, None)
            picked = time.perf_counter()
            reopen(trajectory)
            history, _, tracker = rebuild(trajectory, llm, args.keep)
            done = time.perf_counter()
            print(
                f"{mode}: {args.turns} turns, {args.result_bytes // 1000} kB results, file "
                f"{path.stat().st_size / 1e6:.0f} MB: read + check {picked - started:.2f} s, rebuild "
                f"{done - picked:.2f} s, total {done - started:.2f} s ({len(history.messages)} messages, "
                f"prompt state {len(tracker.ids)} ids)"
            )


if __name__ == "__main__":
    main()
