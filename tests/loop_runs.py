"""What the loop's tests share: a run of the loop on a scripted model and the test MCP server."""

from __future__ import annotations

from pathlib import Path

import mcp_test_server

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.scripted import ScriptedLLM
from nanbeige.agent.run.loop import AgentConfig, run
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter


def toolbox(**options: object) -> Toolbox:
    return Toolbox([ServerSpec(name="testkit", server=mcp_test_server.server)], **options)


def restate(messages: list[dict]) -> str:
    """The scripted model's reply to the summary turn, once its script ran out: its latest boxed answer
    again, or that it has none."""
    answers = [m["content"] for m in messages if m["role"] == "assistant" and "\\boxed{" in m["content"]]
    return answers[-1] if answers else "I could not find the answer."


async def ask(
    replies: list, config: AgentConfig | None = None, path: Path | None = None, llm_config: LLMConfig | None = None
):
    llm = ScriptedLLM(replies, default=restate, config=llm_config)
    writer = TrajectoryWriter(path) if path else None
    # ample for a call (milliseconds; a first one a tenth of a second on a busy machine), short to wait out
    async with toolbox(call_timeout_s=2.0) as tools:
        trajectory = await run("What is 2+3?", llm, tools, config or AgentConfig(date="2026-11-21"), writer)
    if writer:
        writer.close()
    return trajectory, llm
