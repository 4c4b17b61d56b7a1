"""`nanbeige resume`: a run cut short (killed, Ctrl-C, SIGTERM) goes on from its last complete turn, in
the same file, and the model is asked exactly what it would have been asked had the run not stopped. Here
the loop resumed in process, token mode's chain included; the command on a real process is
`tests/test_resume_command.py`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mcp_test_server
import pytest
from fake_openai import FakeOpenAI, mcp_answer, mcp_call

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.backends.token_mode import TokenModeChat
from nanbeige.agent.cli.resume import check_unchanged, pick, settings_for
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.run.restore import used_wall_s
from nanbeige.agent.run.tokens import last_prompt, rebuild_segments
from nanbeige.agent.setup.setup_checks import SetupError
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import (
    TrajectoryWriter,
    end_record,
    load_trajectories,
    read_records,
    resume_record,
)

BROKEN = "<use_mcp_tool>\n<server_name>testkit</server_name>\n</use_mcp_tool>"  # a malformed call: rolled back


def toolbox() -> Toolbox:
    return Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)])


def comparable(turn: Any) -> dict[str, Any]:
    """A turn without its timings, which differ from run to run."""
    record = dataclasses.asdict(turn)
    record.pop("latency_s")
    for result in record["tool_results"]:
        result.pop("latency_s")
    return record


def cut(full: Path, to: Path, turns: int, end: str | None = None) -> None:
    """The file a run cut short after `turns` turns would have left: killed (no end line), or closed
    with an end line of stop reason `end`."""
    lines = full.read_text().splitlines()
    kept = lines[: 1 + turns]
    if end is not None:
        [trajectory] = load_trajectories(full)
        trajectory.turns, trajectory.answer, trajectory.stop_reason = trajectory.turns[:turns], None, end
        kept.append(json.dumps(end_record(trajectory)))
    to.write_text("\n".join(kept) + "\n")


# ---------------------------------------------------------------- the loop, resumed at every turn

CALLS = [mcp_call("testkit", "echo", {"text": f"finding {i}"}, thought=f"Step {i}.") for i in range(4)]
FUNCTION_CALLS = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "echo", "arguments": json.dumps({"text": f"finding {i}"})},
            }
        ],
    }
    for i in range(3)
]
SCRIPTS = {
    # rolled-back replies, keep-2 hiding older results, an answer, then the summary turn
    "answers": [CALLS[0], "", CALLS[1], CALLS[2], BROKEN, CALLS[3], mcp_answer("42"), mcp_answer("42")],
    # unusable replies rolled back with no cap in a row (an empty one uses up its turn), then an answer
    "rollbacks": [CALLS[0], BROKEN, BROKEN, "", BROKEN, BROKEN, mcp_answer("7"), mcp_answer("7")],
    # tool-call: function calls, an empty reply answered with a message, max_turns, then the final-answer turn
    "tool-call at max turns": [*FUNCTION_CALLS[:2], "", FUNCTION_CALLS[2], "The answer is 9."],
}
CONFIGS = {"tool-call at max turns": {"dialect": "tool-call", "max_turns": 4}}


async def full_run(replies: list[Any], path: Path, **config: Any) -> tuple[Any, ScriptedLLM]:
    llm = ScriptedLLM(list(replies))
    writer = TrajectoryWriter(path)
    async with toolbox() as tools:
        # every result kept in memory (and so in a resumed run, which takes the recorded settings): the
        # tests compare the runs' turns whole
        config = {"keep_tool_results": 2, "date": "2026-11-21", "release_results": False} | config
        trajectory = await run("What is it?", llm, tools, AgentConfig(**config), writer)
    writer.close()
    return trajectory, llm


async def resume_in_process(path: Path, replies: list[Any]) -> tuple[Any, ScriptedLLM]:
    trajectory = pick(path, None)
    config = settings_for(trajectory, path).agent
    llm = ScriptedLLM(replies)
    writer = TrajectoryWriter(path)
    async with toolbox() as tools:
        resumed = await run(trajectory.question, llm, tools, config, writer, resume_from=trajectory)
    writer.close()
    return resumed, llm


@pytest.mark.anyio
@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("end", [None, "interrupted"])
async def test_a_run_resumed_after_any_turn_asks_what_the_whole_run_asked(
    script: str, end: str | None, tmp_path: Path
) -> None:
    replies = SCRIPTS[script]
    whole, whole_llm = await full_run(replies, tmp_path / "whole.jsonl", **CONFIGS.get(script, {}))
    assert len(whole.turns) == len(replies) and whole.turns[-1].instruction is not None  # the summary turn
    for turns in range(len(whole.turns) + 1):
        path = tmp_path / f"cut-{turns}.jsonl"
        cut(tmp_path / "whole.jsonl", path, turns, end)
        # a final-answer turn without the end line after it is asked again
        done = min(turns, len(whole.turns) - 1)
        resumed, llm = await resume_in_process(path, replies[done:])
        assert llm.calls == whole_llm.calls[done:], f"resumed after {turns} turns"
        assert [comparable(t) for t in resumed.turns] == [comparable(t) for t in whole.turns]
        assert (resumed.answer, resumed.stop_reason) == (whole.answer, whole.stop_reason)
        [saved] = load_trajectories(path)  # the resumed trajectory reads back as one, its new end line the truth
        assert [t.index for t in saved.turns] == list(range(len(whole.turns)))
        assert (saved.answer, saved.stop_reason) == (whole.answer, whole.stop_reason)
        assert saved.usage == whole.usage  # budgets and totals count the turns made before the resume


@pytest.mark.anyio
async def test_a_turn_whose_tool_calls_lack_results_is_made_again(tmp_path: Path) -> None:
    replies = SCRIPTS["answers"]
    whole, whole_llm = await full_run(replies, tmp_path / "whole.jsonl")
    path = tmp_path / "torn.jsonl"
    cut(tmp_path / "whole.jsonl", path, 3)
    lines = path.read_text().splitlines()
    torn = json.loads(lines[3])  # turn 2, a call to echo: as if its result were never recorded
    torn["tool_results"] = []
    # and killed while writing turn 3: its line was cut off mid-way
    path.write_text("\n".join([*lines[:3], json.dumps(torn), lines[3][:40]]))
    resumed, llm = await resume_in_process(path, replies[2:])
    assert llm.calls == whole_llm.calls[2:]
    records = read_records(path)
    assert [r["type"] for r in records][3:6] == ["turn", "resume", "turn"]  # the torn line is passed over
    assert records[4]["num_turns"] == 2 and records[5]["index"] == 2
    [saved] = load_trajectories(path)
    assert [comparable(t) for t in saved.turns] == [comparable(t) for t in whole.turns]


@pytest.mark.anyio
async def test_the_wall_time_limit_counts_the_time_already_used(tmp_path: Path) -> None:
    await full_run(SCRIPTS["answers"], tmp_path / "whole.jsonl")
    path = tmp_path / "cut.jsonl"
    cut(tmp_path / "whole.jsonl", path, 3, end="interrupted")
    lines = path.read_text().splitlines()
    start, end = json.loads(lines[0]), json.loads(lines[-1])
    start["limits"]["timeout_s"], end["timings"]["wall_s"] = 60.0, 75.0  # it ran 75 s of its 60 before Ctrl-C
    path.write_text("\n".join([json.dumps(start), *lines[1:-1], json.dumps(end)]) + "\n")
    resumed, llm = await resume_in_process(path, SCRIPTS["answers"][3:])
    assert resumed.stop_reason == "timeout" and llm.calls == [] and len(resumed.turns) == 3
    assert resumed.timings["wall_s"] >= 75.0


def test_a_run_killed_after_a_resume_counts_the_resume_time_and_its_later_turns(tmp_path: Path) -> None:
    trajectory = Trajectory(question="q")
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    writer.start(trajectory)
    for index in range(3):
        turn = Turn(
            index=index,
            assistant={"role": "assistant", "content": "..."},
            latency_s=2.0,
            tool_calls=[ToolCall(server="s", name="t", arguments={})],
            tool_results=[ToolResult("r", latency_s=1.0)],
        )
        trajectory.turns.append(turn)
        writer.turn(trajectory, turn)
        if index == 1:  # Ctrl-C after 40 s, then resumed
            trajectory.stop_reason, trajectory.timings = "interrupted", {"wall_s": 40.0}
            writer.end(trajectory)
            writer.write(resume_record(trajectory, used_wall_s(trajectory)))
    writer.close()  # then killed: no end line
    [saved] = load_trajectories(path)
    assert saved.stop_reason is None and len(saved.turns) == 3
    assert used_wall_s(saved) == 40.0 + 3.0  # the resume's 40 s, and the model and tool time of the turn after it
    killed = [line for line in path.read_text().splitlines() if json.loads(line)["type"] in ("start", "turn")]
    (tmp_path / "killed.jsonl").write_text("\n".join(killed) + "\n")
    assert used_wall_s(load_trajectories(tmp_path / "killed.jsonl")[0]) == 9.0  # killed before any end line


def test_which_trajectory_of_a_file_is_resumed(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    writer = TrajectoryWriter(path)
    for question in ("a", "b", "c"):
        trajectory = Trajectory(question=question)
        writer.start(trajectory)
        if question == "a":
            trajectory.stop_reason = "answered"
            writer.end(trajectory)
        if question == "b":
            trajectory.stop_reason = "interrupted"
            writer.end(trajectory)
    writer.close()
    a, b, c = load_trajectories(path)
    with pytest.raises(SetupError, match=f"2 trajectories that can be resumed \\({b.id}, {c.id}\\): pass --id"):
        pick(path, None)
    assert pick(path, c.id).question == "c"
    with pytest.raises(SetupError, match="finished on its own \\(stop reason answered\\)"):
        pick(path, a.id)
    with pytest.raises(SetupError, match="no trajectory 'nope'"):
        pick(path, "nope")


# ---------------------------------------------------------------- token mode: the same token chain


async def token_mode_run(
    tokenizer: Any, replies: list[Any], path: Path, resume_from: Trajectory | None = None
) -> tuple[Trajectory, list[list[int]]]:
    def sampled_letter_by_letter(text: str) -> list[int]:  # valid ids, but not how the text re-tokenizes
        return [i for char in text for i in tokenizer(char, add_special_tokens=False)["input_ids"]]

    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeOpenAI(list(replies), tokenize=sampled_letter_by_letter, stop_id=stop_id) as server:
        config = AgentConfig(keep_tool_results=2, max_context=10**6, date="2026-11-21", release_results=False)
        llm_config = LLMConfig()
        if resume_from is not None:
            settings = settings_for(resume_from, path, base_url=[server.base_url], backend="openai", token_mode=True)
            config, llm_config = settings.agent, settings.llm
        # a new client, as a new process has: nothing of the first run's prompt state is in it
        llm = TokenModeChat(dataclasses.replace(llm_config, base_url=server.base_url, model="tiny"), tokenizer)
        writer = TrajectoryWriter(path)
        async with toolbox() as tools:
            if resume_from is not None:
                check_unchanged(resume_from, llm, tools.tools)
            trajectory = await run("What is it?", llm, tools, config, writer, resume_from=resume_from)
        writer.close()
        await llm.aclose()
    return trajectory, [request["prompt"] for request in server.requests]


@pytest.mark.slow
@pytest.mark.anyio
async def test_in_token_mode_a_resumed_run_extends_the_same_token_ids(tokenizer: Any, tmp_path: Path) -> None:
    replies = [CALLS[0], CALLS[1], "", CALLS[2], BROKEN, CALLS[3], mcp_answer("42"), mcp_answer("42")]
    whole, prompts = await token_mode_run(tokenizer, replies, tmp_path / "whole.jsonl")
    assert len({turn.segment for turn in whole.turns}) > 1  # keep-2 rewrote the history: segments changed
    for turns in range(1, len(whole.turns) + 1):  # the prompt a resumed run starts from, rebuilt backwards
        assert last_prompt(whole.turns[:turns]) == (whole.turns[turns - 1], prompts[turns - 1])
    for turns in range(len(whole.turns)):
        path = tmp_path / f"cut-{turns}.jsonl"
        cut(tmp_path / "whole.jsonl", path, turns, end="interrupted" if turns % 2 else None)
        resumed, resumed_prompts = await token_mode_run(tokenizer, replies[turns:], path, pick(path, None))
        assert resumed_prompts == prompts[turns:], f"resumed after {turns} turns"
        # segment, prompt_keep, prefix_hash, deltas: the chain an uninterrupted run made
        assert [comparable(t) for t in resumed.turns] == [comparable(t) for t in whole.turns]
        [saved] = load_trajectories(path)
        assert rebuild_segments(saved.turns) == rebuild_segments(whole.turns)


@pytest.mark.anyio
async def test_a_backend_that_would_build_prompts_otherwise_is_refused(tokenizer: Any, tmp_path: Path) -> None:
    replies = [CALLS[0], mcp_answer("42"), mcp_answer("42")]
    await token_mode_run(tokenizer, replies, tmp_path / "whole.jsonl")
    cut(tmp_path / "whole.jsonl", tmp_path / "cut.jsonl", 1)
    trajectory = pick(tmp_path / "cut.jsonl", None)
    with pytest.raises(SetupError, match="built with tokenizer .*: resume with the backend flags the run had"):
        check_unchanged(trajectory, ScriptedLLM([]), trajectory.tools)  # a chat server would render them
    with pytest.raises(SetupError, match="missing testkit/echo"):
        check_unchanged(trajectory, ScriptedLLM([]), [t for t in trajectory.tools if t["name"] != "echo"])
