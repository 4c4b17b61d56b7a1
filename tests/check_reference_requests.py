"""Compare, byte for byte, every request nanbeige sends with `--reference PATH` against the requests
the reference harness's own main agent sends for the same scripted runs.

    python tests/check_reference_requests.py PATH_TO_MIROTHINKER_CHECKOUT

The model's replies and the tools' results are scripted (the same on both sides). nanbeige runs its
real loop; the reference runs its own `Orchestrator.run_main_agent` with its own OpenAI client,
prompts, parser and formatter (`reference_orchestrator.py`: only the SDK client, the tool manager
and third-party modules are stood in for). The scenarios cover every tool, a repeated query, a
malformed call, a call inside `<think>`, keep-5, the turn limit, an empty reply, a refusal and a
repeat within one reply. The tool schemas on both sides are ours, printed in the reference's form
(`test_reference_listing.py` checks that form); the descriptions on the reference side are its
servers' docstrings, read here. Messages are compared; sampling fields are not (see docs/fidelity.md).

Exit status 0 when every request matched; the first difference of each scenario is printed otherwise."""

from __future__ import annotations

import ast
import asyncio
import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from fake_openai import mcp_answer, mcp_call  # noqa: E402

from nanbeige.agent.backends.scripted import ScriptedLLM  # noqa: E402
from nanbeige.agent.reference import checkout as ref  # noqa: E402
from nanbeige.agent.reference.mcp_prompt import ordered_servers, reference_schema  # noqa: E402
from nanbeige.agent.run.loop import AgentConfig, run  # noqa: E402
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox  # noqa: E402

DATE = datetime.date.today().isoformat()  # the reference's prompt shows today's date
QUESTION = "Which planet is called the red planet, and what is 6*7?"


def result_of(tool: str, arguments: dict[str, Any]) -> str:
    return f"{tool} says: " + json.dumps(arguments, sort_keys=True)


@dataclass
class Scenario:
    name: str
    replies: list[Any]
    max_turns: int = 600


def search(q: str) -> str:
    return mcp_call("search_and_scrape_webpage", "google_search", {"q": q}, thought=f"Search {q}.")


def scenarios() -> list[Scenario]:
    python = mcp_call("tool-python", "run_python_code", {"code_block": "print(6*7)", "sandbox_id": "sbx-1"})
    scrape = mcp_call(
        "jina_scrape_llm_summary",
        "scrape_and_extract_info",
        {"url": "http://127.0.0.1/mars", "info_to_extract": "nickname"},
    )
    malformed = "<think>\nCall it.\n</think>\n\n<use_mcp_tool>\n<server_name>tool-python</server_name>"
    inside_think = "<think>\nI will " + search("mars moons") + "\n</think>\n\nDone thinking."
    refusal = "I\u2019m sorry, but I can\u2019t help with that."
    return [
        Scenario(
            "a long run: every tool, a repeat, a malformed call, a call inside <think>, keep-5",
            [
                search("red planet"),
                scrape,
                python,
                search("red planet"),
                malformed,
                inside_think,
                search("mars colour"),
                search("mars size"),
                search("mars day"),
                mcp_answer("Mars, 42"),
                mcp_answer("Mars, 42"),
            ],
        ),
        Scenario("max_turns reached", [search("a"), search("b"), search("c"), search("d"), mcp_answer("x")], 3),
        Scenario(
            "an empty reply, a refusal, a repeat within one reply",
            ["", search("a"), refusal, search("b") + "\n" + search("b"), search("a"), mcp_answer("x"), mcp_answer("x")],
        ),
    ]


def servers() -> list[ServerSpec]:
    from mcp.server.mcpserver import MCPServer

    web, pages, python = (
        MCPServer(name=n) for n in ("search_and_scrape_webpage", "jina_scrape_llm_summary", "tool-python")
    )

    @web.tool()
    def google_search(q: str) -> str:
        return result_of("google_search", {"q": q})

    @pages.tool()
    def scrape_and_extract_info(url: str, info_to_extract: str) -> str:
        return result_of("scrape_and_extract_info", {"url": url, "info_to_extract": info_to_extract})

    @python.tool()
    def run_python_code(code_block: str, sandbox_id: str) -> str:
        return result_of("run_python_code", {"code_block": code_block, "sandbox_id": sandbox_id})

    return [ServerSpec(name=s.name, server=s) for s in (web, pages, python)]


async def nanbeige_requests(
    reference: ref.Reference, scenario: Scenario
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    llm = ScriptedLLM(list(scenario.replies))
    async with Toolbox(servers()) as toolbox:
        await run(QUESTION, llm, toolbox, AgentConfig(date=DATE, reference=reference, max_turns=scenario.max_turns))
        return llm.calls, toolbox.tools


# ---------------------------------------------------------------- the reference's own code


def docstrings(root: Path) -> dict[tuple[str, str], str]:
    """The reference servers' tool descriptions as MCP SDK 1.x on Python 3.12 lists them (`__doc__`)."""
    found = {}
    for server, relative in (
        ("tool-python", "mcp_servers/python_mcp_server.py"),
        ("search_and_scrape_webpage", "dev_mcp_servers/search_and_scrape_webpage.py"),
        ("jina_scrape_llm_summary", "dev_mcp_servers/jina_scrape_llm_summary.py"),
    ):
        tree = ast.parse((root / "libs/miroflow-tools/src/miroflow_tools" / relative).read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
                found[(server, node.name)] = ast.get_docstring(node, clean=False) or ""
    return found


def reference_requests(
    root: Path, tools: list[dict[str, Any]], scenario: Scenario, log_dir: Path
) -> list[dict[str, Any]]:
    """The requests of the scripted run as the checkout's own main agent makes them."""
    import logging

    from reference_orchestrator import run as run_reference

    described = docstrings(root)
    definitions = [
        {
            "name": server,
            "tools": [
                {
                    "name": t["name"],
                    "description": described.get((server, t["name"]), t["description"]),
                    "schema": reference_schema(t["input_schema"]),
                }
                for t in tools
                if t["server"] == server
            ],
        }
        for server in ordered_servers(tools)
    ]

    def result(server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"server_name": server, "tool_name": tool, "result": result_of(tool, arguments)}

    logging.disable(logging.CRITICAL)
    return run_reference(root, QUESTION, scenario.replies, definitions, result, scenario.max_turns, log_dir)


def compare(ours: list[list[dict[str, Any]]], theirs: list[dict[str, Any]]) -> str | None:
    """The first difference between our requests' messages and the reference's, or None."""
    for number, (mine, request) in enumerate(zip(ours, theirs)):
        mine = [{"role": m["role"], "content": m["content"]} for m in mine]
        expected = [{"role": m["role"], "content": m["content"]} for m in request["messages"]]
        if json.dumps(mine) != json.dumps(expected):
            for position, (a, b) in enumerate(zip(mine, expected)):
                if a != b:
                    return f"request {number}, message {position}:\n--- nanbeige\n{a}\n--- reference\n{b}"
            return f"request {number}: {len(mine)} messages, the reference sent {len(expected)}"
    if len(ours) != len(theirs):
        return f"nanbeige made {len(ours)} requests, the reference {len(theirs)}"
    return None


def main() -> int:
    import tempfile

    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1])
        return 2
    root = Path(sys.argv[1])
    reference = ref.load(root)
    failed = 0
    for scenario in scenarios():
        ours, tools = asyncio.run(nanbeige_requests(reference, scenario))
        with tempfile.TemporaryDirectory() as logs:
            theirs = reference_requests(root, tools, scenario, Path(logs))
        difference = compare(ours, theirs)
        failed += difference is not None
        print(
            f"{'differs' if difference else 'same'}: {scenario.name} ({len(theirs)} requests)"
            + (f"\n{difference}" if difference else "")
        )
    print(
        f"reference {reference.commit or root}, sha256 {reference.sha256[:12]}: "
        f"{len(scenarios()) - failed} of {len(scenarios())} scenarios sent byte for byte the same messages"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
