"""Compare, byte for byte, every request nanbeige sends with `--reference PATH` against the requests
the reference harness's own code builds for the same scripted run.

    python tests/check_reference_requests.py PATH_TO_MIROTHINKER_CHECKOUT

The model's replies and the tools' results are scripted (the same on both sides). nanbeige runs its
real loop; the reference side is its own functions, taken from the checkout and run here: the
system, user and summary prompts (`prompt_utils.py`, `input_handler.process_input`), the reply
parser (`parsing_utils.py`), the result formatter (`output_formatter.py`), the history update
(`OpenAIClient.update_message_history`) and keep-K (`BaseClient._remove_tool_result_from_messages`),
driven by the orchestrator's main-loop flow (written out below, as its code runs it: a malformed
call or refusal rolled back, a repeated query answered with the note of v1.0 or rolled back as
later, the trailing tool result dropped before the summary prompt). The tool schemas on both sides
are ours, printed in the reference's form (`test_reference_listing.py` checks that form).

Exit status 0 when every request matched; the first difference is printed otherwise."""

from __future__ import annotations

import ast
import asyncio
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from fake_openai import mcp_answer, mcp_call  # noqa: E402

from nanbeige.agent import reference as ref  # noqa: E402
from nanbeige.agent.loop import AgentConfig, run  # noqa: E402
from nanbeige.agent.mcp_prompt import ordered_servers, reference_schema  # noqa: E402
from nanbeige.agent.scripted import ScriptedLLM  # noqa: E402
from nanbeige.agent.toolbox import ServerSpec, Toolbox  # noqa: E402

DATE = "2026-11-21"
QUESTION = "Which planet is called the red planet, and what is 6*7?"


def result_of(tool: str, arguments: dict[str, Any]) -> str:
    return f"{tool} says: " + json.dumps(arguments, sort_keys=True)


def replies() -> list[str]:
    def search(q: str) -> str:
        return mcp_call("search_and_scrape_webpage", "google_search", {"q": q}, thought=f"Search {q}.")

    python = mcp_call("tool-python", "run_python_code", {"code_block": "print(6*7)", "sandbox_id": "sbx-1"})
    scrape = mcp_call("jina_scrape_llm_summary", "scrape_and_extract_info",
                      {"url": "http://127.0.0.1/mars", "info_to_extract": "nickname"})
    malformed = "<think>\nCall it.\n</think>\n\n<use_mcp_tool>\n<server_name>tool-python</server_name>"
    inside_think = "<think>\nI will " + mcp_call("search_and_scrape_webpage", "google_search", {"q": "mars moons"}) \
        + "\n</think>\n\nDone thinking."
    return [search("red planet"), scrape, python, search("red planet"), malformed, inside_think, search("mars colour"),
            search("mars size"), search("mars day"), mcp_answer("Mars, 42"), mcp_answer("Mars, 42")]


def servers() -> list[ServerSpec]:
    from mcp.server.mcpserver import MCPServer

    web, pages, python = (MCPServer(name=n) for n in ("search_and_scrape_webpage", "jina_scrape_llm_summary",
                                                       "tool-python"))

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


async def nanbeige_requests(reference: ref.Reference) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    llm = ScriptedLLM(replies())
    async with Toolbox(servers()) as toolbox:
        await run(QUESTION, llm, toolbox, AgentConfig(date=DATE, reference=reference))
        return llm.calls, toolbox.tools


# ---------------------------------------------------------------- the reference's own code


def module(root: Path, relative: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": relative}
    exec(compile((root / relative).read_text(), relative, "exec"), namespace)
    return namespace


def method(root: Path, relative: str, cls: str, name: str, namespace: dict[str, Any]) -> Any:
    """One method of a class, run alone (its module imports what is not installed here)."""
    tree = ast.parse((root / relative).read_text())
    [body] = [n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls for n in c.body
              if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module(body=[body], type_ignores=[]), relative, "exec"), namespace)
    return namespace[name]


class _Log:
    def log_step(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Client:
    task_log = _Log()


def reference_requests(root: Path, tools: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The requests of the scripted run as the reference's code builds them (keep-5, main agent)."""
    from typing import Dict, List, Tuple

    agent = root / "apps/miroflow-agent"
    prompts = module(agent, "src/utils/prompt_utils.py")
    parse = module(agent, "src/utils/parsing_utils.py")["parse_llm_response_for_tool_calls"]
    typing_names = {"List": List, "Dict": Dict, "Tuple": Tuple, "Any": Any}
    limit = {"TOOL_RESULT_MAX_LENGTH": 100_000}  # a module constant from 2026 on (the same number inline before)
    format_result = method(agent, "src/io/output_formatter.py", "OutputFormatter", "format_tool_result_for_user",
                           typing_names | limit)
    keep_k = method(agent, "src/llm/base_client.py", "BaseClient", "_remove_tool_result_from_messages", typing_names)
    update = method(agent, "src/llm/providers/openai_client.py", "OpenAIClient", "update_message_history",
                    typing_names)
    user = ref.load(root).user_message(QUESTION)  # process_input, run alone (see agent/reference.py)
    duplicate = ref.load(root).duplicate_query

    catalogue = [{"name": server, "tools": [
        {"name": t["name"], "description": ref.load(root).tool_descriptions.get((server, t["name"]), t["description"]),
         "schema": reference_schema(t["input_schema"])} for t in tools if t["server"] == server]}
        for server in ordered_servers(tools)]
    system = (prompts["generate_mcp_system_prompt"](datetime.date.fromisoformat(DATE), catalogue)
              + prompts["generate_agent_specific_system_prompt"](agent_type="main")).strip()

    def request(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return keep_k(_Client(), [{"role": "system", "content": system}] + history, 5)

    history: list[dict[str, Any]] = [{"role": "user", "content": user}]
    sent, used, rollbacks = [], set(), 0
    for reply in replies()[:-1]:
        sent.append(request(history))
        history.append({"role": "assistant", "content": reply})
        calls = parse(reply)
        unusable = any(tag in reply for tag in prompts["mcp_tags"]) or any(k in reply for k in prompts["refusal_keywords"])
        repeated = duplicate is None and rollbacks < 4 and any(
            c["tool_name"] == "google_search" and c["arguments"].get("q") in used for c in calls)
        if (not calls and unusable) or repeated:
            history.pop()  # rolled back
            rollbacks += 1
            continue
        rollbacks = 0
        if not calls:
            break  # the model answered
        results = []
        for call in calls:
            query = call["arguments"].get("q") if call["tool_name"] == "google_search" else None
            if query is not None and query in used and duplicate is not None:
                text = duplicate.format(query=query, tool=call["tool_name"])
            else:
                text = result_of(call["tool_name"], call["arguments"])
                used.add(query)
            results.append((call["id"], format_result(
                None, {"server_name": call["server_name"], "tool_name": call["tool_name"], "result": text})))
        history = update(_Client(), history, results)
    summary = prompts["generate_agent_summarize_prompt"](QUESTION, agent_type="main")
    if history[-1]["role"] == "user":
        history.pop()
    history.append({"role": "user", "content": summary})
    sent.append(request(history))
    return sent


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1])
        return 2
    root = Path(sys.argv[1])
    reference = ref.load(root)
    ours, tools = asyncio.run(nanbeige_requests(reference))
    theirs = reference_requests(root, tools)
    for number, (mine, expected) in enumerate(zip(ours, theirs)):
        mine = [{"role": m["role"], "content": m["content"]} for m in mine]
        if json.dumps(mine) != json.dumps(expected):
            for position, (a, b) in enumerate(zip(mine, expected)):
                if a != b:
                    print(f"request {number}, message {position} differs:\n--- nanbeige\n{a}\n--- reference\n{b}")
                    return 1
            print(f"request {number}: {len(mine)} messages, the reference has {len(expected)}")
            return 1
    if len(ours) != len(theirs):
        print(f"nanbeige made {len(ours)} requests, the reference {len(theirs)}")
        return 1
    print(f"{len(ours)} requests, every message byte for byte the same (reference {reference.commit or root}, "
          f"sha256 {reference.sha256[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
