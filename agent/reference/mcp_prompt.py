# ruff: noqa: E501  (each paragraph of the prompt is one line, as the model reads it)
"""The deep-search (mcp-xml) system prompt, laid out as the reference harness lays it out.

Nanbeige4.1-3B was evaluated on deep search in MiroThinker's harness (v1.0), so the prompt keeps
that harness's structure exactly: the same lines, blank lines, section headers (trailing spaces
included), the date at the end of the second paragraph, the tool catalogue's line formats, the
servers in the order the harness lists them, schemas printed as Python dicts in the form its MCP
SDK produced, and the whole text stripped at both ends. The prose is our own.

A user may replace it with a template of their own (`--system-prompt-file`), in which `{tools}`
stands for the tool catalogue and `{date}` for today's date.
"""

from __future__ import annotations

from typing import Any

# The order the reference harness lists its servers in (fixed by its code, not its config);
# servers it does not know follow in the order given.
SERVER_ORDER = ("tool-python", "search_and_scrape_webpage", "jina_scrape_llm_summary")

_HEAD = """In this environment you can use a set of tools to answer the question the user asks. 

The tools listed below are the only ones available. Use one tool in each message; its result comes back to you in the user's next message. Work through the task one tool call at a time, and let each call build on what the earlier ones returned. Today is: {date}

# Tool-Use Formatting Instructions 

A tool call is written with XML-style tags: the whole call is enclosed in <use_mcp_tool></use_mcp_tool> tags, and each of its parts is enclosed in a pair of tags of its own.

Tools are offered by MCP (Model Context Protocol) servers: programs that each provide a set of tools and resources. Every call names the server as well as the tool, using `use_mcp_tool`.

Description: 
Asks to run a tool that an MCP server provides. Each tool has an input schema that lists its required and optional parameters; the arguments must follow it.

Parameters:
- server_name: (required) The MCP server that offers the tool
- tool_name: (required) Which of the server's tools to run
- arguments: (required) A JSON object with the tool's input parameters, following the tool's input schema; escape quotes inside strings correctly and make sure the JSON is valid

Usage:
<use_mcp_tool>
<server_name>server name here</server_name>
<tool_name>tool name here</tool_name>
<arguments>
{{
"param1": "value1",
"param2": "value2 \\"escaped string\\""
}}
</arguments>
</use_mcp_tool>

Important Notes:
- Put the tool call **at the end** of your message, at the **top level**, never inside other tags.
- Keep exactly to this format, so that the call can be read and run.

Give string and scalar values as they are, and lists and objects as JSON; spaces inside values are kept as written, and the call is read with regular expressions rather than an XML parser, so write the tags exactly as shown.
The functions you can call follow, with their input schemas in JSONSchema form:

"""

_TAIL = """
# General Objective

You work through the given task step by step, splitting it into clear stages and completing each one carefully.

# Agent Specific Objective

You are an agent that solves tasks by using tools one step at a time, and your aim is a complete, accurate and well-reasoned answer to the user's question."""


def ordered_servers(tools: list[dict[str, Any]]) -> list[str]:
    servers = list(dict.fromkeys(tool["server"] for tool in tools))
    return [s for s in SERVER_ORDER if s in servers] + [s for s in servers if s not in SERVER_ORDER]


def reference_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema in the form the reference's MCP SDK gave the model: keys in alphabetical order,
    and an optional parameter (`anyOf` a type and null, default None) written as that type with its
    default, as `x: str = None` rendered there (newer SDKs write `anyOf` instead)."""

    def parameter(spec: Any) -> Any:
        if not isinstance(spec, dict):
            return spec
        options = spec.get("anyOf")
        if (
            isinstance(options, list)
            and len(options) == 2
            and {"type": "null"} in options
            and spec.get("default", ...) is None
        ):
            kept = next(option for option in options if option != {"type": "null"})
            spec = {**{k: v for k, v in spec.items() if k != "anyOf"}, **kept}
        return dict(sorted(spec.items()))

    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema = {**schema, "properties": {name: parameter(spec) for name, spec in properties.items()}}
    return dict(sorted(schema.items()))


def tool_catalogue(tools: list[dict[str, Any]]) -> str:
    """The tools by server: a `## Server name:` line (after a blank line) per server, and per tool its
    name, description and input schema lines, with no blank line between tools."""
    lines = []
    for server in ordered_servers(tools):
        lines.append(f"\n## Server name: {server}\n")
        for tool in (t for t in tools if t["server"] == server):
            lines.append(f"### Tool name: {tool['name']}\n")
            lines.append(f"Description: {tool.get('description') or ''}\n")
            lines.append(f"Input JSON schema: {reference_schema(tool.get('input_schema') or {})}\n")
    return "".join(lines)


def system_prompt(tools: list[dict[str, Any]], date: str, template: str | None = None) -> str:
    """The deep-search system prompt for these tools on this date (YYYY-MM-DD)."""
    if template is not None:
        return template.replace("{tools}", tool_catalogue(tools)).replace("{date}", date)
    return (_HEAD.format(date=date) + tool_catalogue(tools) + _TAIL).strip()


def user_message(question: str) -> str:
    """The question, then on a line of its own (as the reference adds it) the answer-format sentence."""
    return (
        question + "\nYou should follow the format instruction in the request strictly and wrap the final "
        "answer in \\boxed{}."
    )
