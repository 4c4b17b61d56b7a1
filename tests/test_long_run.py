"""A 600-turn run with a 100 kB tool result every turn: the prompt stays within the context budget
(keep-K), and with `release_results` the process's memory stays flat while the trajectory file
keeps every result."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import LLMConfig, OpenAIChat
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.context import estimate_tokens
from nanbeige.agent.run.loop import RELEASED, AgentConfig, run
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter, load_trajectories

pytestmark = pytest.mark.anyio
TURNS, RESULT = 600, 100_000
CONTEXT = 400_000  # tokens: five 100 kB results fit (about 170k by the runtime's estimate), fifty would not


def rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def researcher(prompts: list[int]) -> ScriptedLLM:
    """Reads 100 kB every turn for TURNS turns, then answers; notes each prompt's size."""

    def reply(messages: list[dict]) -> str:
        prompts.append(sum(estimate_tokens(m["content"] or "") for m in messages))
        step = sum(m["role"] == "assistant" for m in messages)
        return mcp_call("testkit", "big", {"n": RESULT}, thought=f"Step {step}.") if step < TURNS else mcp_answer("42")

    llm = ScriptedLLM([], default=reply, record=False)
    llm.config.max_tokens = 4096
    return llm


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc")
async def test_600_turns_of_100_kb_results_stay_in_budget_and_flat_in_memory(tmp_path: Path) -> None:
    prompts: list[int] = []
    rss: dict[int, int] = {}

    def on_event(kind: str, data: object) -> None:
        if kind == "turn" and data.index + 1 in (100, TURNS):  # type: ignore[attr-defined]
            rss[data.index + 1] = rss_kib()  # type: ignore[attr-defined]

    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    config = AgentConfig(max_turns=TURNS, max_context=CONTEXT, summary_turn=False)  # the defaults release results
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)], max_result_chars=RESULT) as toolbox:
        trajectory = await run("q", researcher(prompts), toolbox, config, writer, on_event)
    writer.close()
    # 600 turns with tool calls, then the limit's final-answer turn
    assert trajectory.stop_reason == "max_turns" and trajectory.answer == "42", trajectory.error
    assert len(trajectory.turns) == TURNS + 1 and len(prompts) == TURNS + 1
    # keep-5: the prompt stops growing once five results are shown, far below what 600 would be
    assert max(prompts) + 4096 + config.context_reserve <= CONTEXT
    # what still grows is each turn's short reply and the placeholder of its result: under 100 tokens
    assert (max(prompts) - prompts[10]) / (TURNS - 10) < 100
    # memory: turns 100 to 600 added 50 MB of results, all on disk, almost nothing in memory
    assert rss[TURNS] - rss[100] < 8 * 1024, rss
    texts = [r.text for turn in trajectory.turns for r in turn.tool_results]
    assert texts[-5:] == ["x" * RESULT] * 5 and set(texts[:-5]) == {RELEASED}
    [saved] = load_trajectories(tmp_path / "run.jsonl")
    assert all(r.text == "x" * RESULT for turn in saved.turns for r in turn.tool_results)
    assert sum(len(turn.tool_results) for turn in saved.turns) == TURNS


async def test_without_release_every_result_stays_in_the_trajectory_in_memory(tmp_path: Path) -> None:
    llm = ScriptedLLM([mcp_call("testkit", "big", {"n": 1000})] * 8 + [mcp_answer("42")])
    config = AgentConfig(keep_tool_results=2, summary_turn=False, release_results=False)
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)]) as toolbox:
        trajectory = await run("q", llm, toolbox, config, TrajectoryWriter(tmp_path / "run.jsonl"))
    assert [r.text for turn in trajectory.turns for r in turn.tool_results] == ["x" * 1000] * 8


async def test_rolled_back_replies_do_not_use_up_turns(tmp_path: Path) -> None:
    """The turn count is kept as the run goes (a turn's cost stays flat); replies rolled back and
    sampled again still do not count."""
    cut_off = Completion(message={"role": "assistant", "content": "<think>\nLet me"}, finish_reason="length")
    calls = [mcp_call("testkit", "echo", {"text": str(i)}) for i in range(3)]
    llm = ScriptedLLM([calls[0], cut_off, calls[1], cut_off, cut_off, calls[2], mcp_answer("late")])
    async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)]) as toolbox:
        trajectory = await run("q", llm, toolbox, AgentConfig(max_turns=3, summary_turn=False))
    assert [turn.rolled_back for turn in trajectory.turns] == [False, True, False, True, True, False, False]
    assert (trajectory.stop_reason, trajectory.answer) == ("max_turns", "late")


async def test_600_turns_through_a_crashing_tool_server_and_a_restarting_model_server(tmp_path: Path) -> None:
    """The tool server dies on every 50th call and the model server goes down twice mid-run: every turn
    still happens, the only error results are the 12 crashes (each says the server was restarted), and
    every call after a restart is answered by the new server, in the trajectory file as in memory."""
    holder: dict[str, FakeOpenAI] = {}
    requests = iter(range(10**6))

    def reply(request: dict) -> Reply | str:
        if next(requests) in (200, 400):
            holder["server"].outage(1.0)  # this request is cut; the next ones are refused for a second
            return Reply(content="never sent")
        step = sum(m["role"] == "assistant" for m in request["messages"])
        if step >= TURNS:
            return mcp_answer("done")
        return mcp_call("testkit", "flaky", {"every": 50, "text": f"step {step}"}, thought=f"Step {step}.")

    config = AgentConfig(max_turns=TURNS + 1, summary_turn=False)
    with FakeOpenAI(reply) as server:
        holder["server"] = server
        llm = OpenAIChat(
            LLMConfig(
                base_url=server.base_url, model="fake-model", retry_wait_s=0.05, max_retry_wait_s=0.5, max_retry_s=60.0
            )
        )
        writer = TrajectoryWriter(tmp_path / "run.jsonl")
        async with Toolbox([ServerSpec(name="testkit", command=TEST_SERVER)]) as toolbox:
            trajectory = await run("q", llm, toolbox, config, writer)
        writer.close()
        await llm.aclose()
    assert (trajectory.stop_reason, trajectory.answer) == ("answered", "done"), trajectory.error
    [saved] = load_trajectories(tmp_path / "run.jsonl")
    results = [(turn.tool_calls[0].arguments["text"], turn.tool_results[0]) for turn in saved.turns if turn.tool_calls]
    assert [text for text, _ in results] == [f"step {step}" for step in range(TURNS)]
    crashes = [result for _, result in results if result.is_error]
    assert len(crashes) == TURNS // 50 and all("was restarted" in r.text for r in crashes)
    answered = [(text, result.text.split(" ", 2)) for text, result in results if not result.is_error]
    assert all(said == text for text, (_, _, said) in answered)  # each a real answer to its own call
    assert len({pid for _, (pid, _, _) in answered}) == len(crashes)  # the 600th call is the 12th server's last
    assert len(server.requests) >= TURNS + 1 + 2
