"""How tools are offered to the model and how its tool calls are read back.

Two dialects:
- `mcp-xml` (default): the deep-search format Nanbeige4.1-3B was trained on. Tools are described
  in the system prompt, grouped by MCP server; the model calls one with a `<use_mcp_tool>` block
  at the end of its message; results come back as the next user message; the final answer is
  wrapped in `\\boxed{}`.
- `tool-call`: general tool use. Tools go in the request's `tools=` field (OpenAI function
  calling); calls come back as `message.tool_calls` when the server parses them, or as
  `<tool_call>` JSON blocks in the text when it does not; results are `role: tool` messages.

Parsing never raises: a reply that cannot be used becomes a `format_error` message for the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import json_repair

from nanbeige.agent.reference import mcp_prompt
from nanbeige.agent.trajectory.trajectory import ToolCall, Turn

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference

DIALECTS = ("mcp-xml", "tool-call")
OMITTED = "Tool result is omitted to save tokens."
# The format error of an empty reply kept in the history with nothing after it (mcp-xml with
# rollback, as the reference v1.0 keeps one): the turn is used up and the next one follows.
EMPTY_REPLY = "The reply was empty: kept in the history, and the turn is used up."
# Model turns before the answer is asked for, when the user sets none: the reference harness's
# keep-5 deep-search configuration allows 600; general tool use needs far fewer.
MAX_TURNS = {"mcp-xml": 600, "tool-call": 200}
# Phrases that mark a refusal in the reference harness, which rolls such a reply back (case-sensitive,
# anywhere in the reply; the second one with typographic apostrophes).
REFUSALS = ("time constraint", "I\u2019m sorry, but I can\u2019t", "I'm sorry, I cannot solve")

_MCP_BLOCK = re.compile(
    r"<use_mcp_tool>\s*<server_name>(.*?)</server_name>\s*<tool_name>(.*?)</tool_name>\s*"
    r"<arguments>(.*?)</arguments>\s*</use_mcp_tool>",
    re.DOTALL,
)
# A reply without a parsable call that holds one of these is a malformed call (the reference's six).
MCP_TAGS = ("<use_mcp_tool>", "</use_mcp_tool>", "<server_name>", "</server_name>", "<arguments>", "</arguments>")
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ParsedReply:
    """What the loop needs from one assistant message."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    call_errors: dict[int, str] = field(default_factory=dict)
    """Calls (by position) that cannot be run, with the error result the model gets instead."""
    format_error: str | None = None
    """Set when the reply tried to call a tool but could not be understood."""


# ---------------------------------------------------------------- prompts


def no_tools_system_prompt(date: str) -> str:
    return f"You are a careful assistant. Answer the user's question as accurately as you can.\n\nToday is: {date}\n"


def system_prompt(
    dialect: str,
    tools: list[dict[str, Any]],
    date: str,
    template: str | None = None,
    reference: Reference | None = None,
) -> str:
    """The system prompt; `template` (with `{tools}` and `{date}`) replaces the mcp-xml one, and a
    reference checkout's own prompt replaces ours."""
    if dialect == "mcp-xml" and template is not None:
        return mcp_prompt.system_prompt(tools, date, template)
    if dialect == "mcp-xml" and tools:
        return reference.system_prompt(tools, date) if reference else mcp_prompt.system_prompt(tools, date)
    if dialect == "tool-call" and tools:
        return (
            f"You are a careful assistant that uses the tools provided to answer the user's question.\n\n"
            f"Today is: {date}\n"
        )
    return no_tools_system_prompt(date)


def user_message(dialect: str, question: str, reference: Reference | None = None) -> str:
    if dialect != "mcp-xml":
        return question
    return reference.user_message(question) if reference else mcp_prompt.user_message(question)


def final_answer_instruction(
    dialect: str, question: str, summary: bool = False, reference: Reference | None = None
) -> str:
    """The user message that asks for the answer without more tool calls: at the end of every run
    (the summary turn), or when limits were reached. With a reference checkout (mcp-xml), its own
    summary prompt, which the reference sends in both cases."""
    if reference is not None and dialect == "mcp-xml":
        return reference.summary_prompt(question)
    box = "Put your final answer inside \\boxed{}." if dialect == "mcp-xml" else "State your final answer plainly."
    opening = (
        "This is the end of the task: no more tools can be used. "
        if summary
        else "You have reached the limit of tool calls or context for this task, so no more tools can be used. "
    )
    # The rules an exact-match grader depends on, as the reference's summary prompt states them.
    return (
        opening + "Summarise the conversation above and give the FINAL ANSWER to the original question.\n\n"
        "If an earlier step already found a clear answer, do not work it out again: take that answer and put it in "
        "the form required below. If no answer could be settled, give your best-informed guess from what the "
        "conversation found.\n\n"
        f'The original question, for reference:\n\n"{question}"\n\n'
        f"{box} The final answer is one of:\n"
        "- a number;\n"
        "- as few words as possible;\n"
        "- a list of numbers, strings or both, separated by commas.\n\n"
        "Follow every formatting instruction of the original question exactly: alphabetical or other order, units, "
        "rounding, number of decimal places, and the like.\n"
        "Write a number in digits, not words, without thousands separators, and without units, currency signs or "
        "percent signs unless the question asks for them.\n"
        "Write a string without articles and without abbreviations (a city's full name, for instance) unless the "
        "question asks for them.\n"
        "In a list, write each element by the rule for numbers or for strings, whichever it is.\n"
        "End the answer without punctuation such as '.', '!' or '?'.\n"
        "Leave out invisible and non-printable characters.\n"
        "Do not call any tool."
    )


# ---------------------------------------------------------------- tools for the request


def function_names(tools: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Function name -> (server, tool): the plain tool name when unique, else `server__tool`."""
    counts: dict[str, int] = {}
    for tool in tools:
        counts[tool["name"]] = counts.get(tool["name"], 0) + 1
    names = {}
    for tool in tools:
        name = tool["name"] if counts[tool["name"]] == 1 else f"{tool['server']}__{tool['name']}"
        names[name] = (tool["server"], tool["name"])
    return names


def request_tools(dialect: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The `tools=` field of the request: only the tool-call dialect uses it."""
    if dialect != "tool-call" or not tools:
        return None
    by_pair = {pair: name for name, pair in function_names(tools).items()}
    return [
        {
            "type": "function",
            "function": {
                "name": by_pair[(t["server"], t["name"])],
                "description": t.get("description") or "",
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


# ---------------------------------------------------------------- reading replies


def visible_text(content: str) -> str:
    """The part of a reply after its reasoning: text after the last `</think>`; nothing when a
    `<think>` was opened and never closed (the reply is all reasoning)."""
    if "</think>" in content:
        return content.rsplit("</think>", 1)[1]
    if "<think>" in content:
        return ""
    return content


def parse_arguments(raw: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """A tool call's arguments as a dict: strict JSON first, then repaired JSON; None if hopeless.
    Keys whose value is null are dropped, so tool defaults apply."""
    if isinstance(raw, dict):
        value: Any = raw
    else:
        text = (raw or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = json_repair.loads(text)
            if value == "" or value is None:
                return None
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if v is not None}


def _fix_server(server: str, name: str, tools: list[dict[str, Any]]) -> str:
    """A call naming the wrong server for a tool that only one server has goes to that server."""
    if any(t["server"] == server and t["name"] == name for t in tools):
        return server
    owners = [t["server"] for t in tools if t["name"] == name]
    return owners[0] if len(owners) == 1 else server


def parse_mcp_xml(content: str, tools: list[dict[str, Any]], tags: tuple[str, ...] = MCP_TAGS) -> ParsedReply:
    """Tool calls over the whole reply, reasoning included, as the reference reads them (a call or a
    malformed-call tag written inside `<think>` counts too)."""
    parsed = ParsedReply()
    for server, name, raw_arguments in _MCP_BLOCK.findall(content):
        server, name = server.strip(), name.strip()
        arguments = parse_arguments(raw_arguments)
        if arguments is None:
            parsed.call_errors[len(parsed.tool_calls)] = (
                f"The arguments of {name} are not a JSON object; the call was not run. Write it again with "
                "valid JSON inside <arguments>."
            )
        parsed.tool_calls.append(
            ToolCall(server=_fix_server(server, name, tools), name=name, arguments=arguments or {})
        )
    if not parsed.tool_calls and any(tag in content for tag in tags):
        parsed.format_error = (
            "Your message contains a tool call that could not be parsed. Write it as "
            "<use_mcp_tool> with <server_name>, <tool_name> and <arguments> tags, at the end "
            "of your message, exactly as in the instructions."
        )
    return parsed


def parse_tool_call(message: dict[str, Any], tools: list[dict[str, Any]]) -> ParsedReply:
    names = function_names(tools)
    raw_calls = []  # (id, name, arguments)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        raw_calls.append((call.get("id"), function.get("name", ""), function.get("arguments")))
    if not raw_calls:
        for block in _TOOL_CALL_BLOCK.findall(visible_text(message.get("content") or "")):
            data = parse_arguments(block)
            if data is None or not isinstance(data.get("name"), str):
                return ParsedReply(
                    format_error="A <tool_call> block could not be parsed. Write it as "
                    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
                )
            raw_calls.append((None, data["name"], data.get("arguments", {})))
    parsed = ParsedReply()
    for call_id, name, raw_arguments in raw_calls:
        arguments = parse_arguments(raw_arguments)
        if arguments is None:  # still answered with a result: every call id must get one
            parsed.call_errors[len(parsed.tool_calls)] = (
                f"The arguments of {name} are not a JSON object; the call was not run. Call it again with "
                "valid JSON arguments."
            )
        server, tool = names.get(name, ("", name))
        parsed.tool_calls.append(ToolCall(server=server, name=tool, arguments=arguments or {}, id=call_id))
    return parsed


def mcp_xml_answer_problem(content: str) -> str | None:
    """Why a reply without a tool call is not a usable answer in the mcp-xml dialect, or None."""
    text = visible_text(content)
    if "<tool_call>" in text:
        return (
            "Tool calls must use the <use_mcp_tool> format from the instructions, not <tool_call>. "
            "Write the call again in that format."
        )
    answer = last_boxed(text)
    if answer is None:
        return (
            "Your message has neither a tool call nor a final answer. Continue: call a tool in the "
            "<use_mcp_tool> format, or give your final answer wrapped in \\boxed{}."
        )
    if not answer:
        return "Your final answer in \\boxed{} is empty. Give the answer inside it."
    return None


def parse_reply(
    dialect: str, message: dict[str, Any], tools: list[dict[str, Any]], reference: Reference | None = None
) -> ParsedReply:
    if dialect == "mcp-xml":
        return parse_mcp_xml(message.get("content") or "", tools, reference.mcp_tags if reference else MCP_TAGS)
    return parse_tool_call(message, tools)


_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, read as the reference harness reads it: braces are
    counted, a backslash escapes the next character (`\\{` does not open), and a box left open runs
    to the end of the text. None when there is no box."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth, escaped = 1, False
    for position in range(start, len(text)):
        char = text[position]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "{}":
            depth += 1 if char == "{" else -1
            if depth == 0:
                return text[start:position].strip()
    return text[start:].strip()


def extract_answer(dialect: str, content: str) -> str:
    """The final answer in a reply without tool calls: the last `\\boxed{}` (mcp-xml) or an
    `<answer>` block if present, else the visible text."""
    text = visible_text(content).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return match.group(1).strip() if match else text


# ---------------------------------------------------------------- writing the history


def history_message(dialect: str, assistant: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as sent back to the model in later requests.

    Reasoning a server split off (`reasoning`) goes back where the chat template expects it: inside
    `content` for mcp-xml (whose template renders content verbatim), as `reasoning_content` for
    tool-call."""
    content = assistant.get("content") or ""
    reasoning = assistant.get("reasoning") or assistant.get("reasoning_content")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning and dialect == "mcp-xml":
        message["content"] = f"<think>\n{reasoning}\n</think>\n\n{content}"
    elif reasoning:
        message["reasoning_content"] = reasoning
    if dialect == "tool-call" and assistant.get("tool_calls"):
        message["tool_calls"] = assistant["tool_calls"]
    return message


def observation_messages(dialect: str, turn: Turn) -> list[dict[str, Any]]:
    """What goes back to the model after a turn: its tool results, or the format error (nothing
    after an empty reply kept as it is)."""
    if turn.format_error == EMPTY_REPLY:
        return []
    if turn.format_error is not None:
        return [{"role": "user", "content": turn.format_error}]
    if not turn.tool_calls:
        return []
    if dialect == "mcp-xml":  # as the tool gave them: the reference marks no error (the trajectory does)
        return [{"role": "user", "content": "\n".join(r.text for r in turn.tool_results)}]
    # Calls parsed from the text have no id (the server never saw them as calls), so neither do results.
    return [
        {"role": "tool", "content": _result_text(result)} | ({"tool_call_id": call.id} if call.id else {})
        for call, result in zip(turn.tool_calls, turn.tool_results)
    ]


def _result_text(result: Any) -> str:
    return f"Error: {result.text}" if result.is_error and not result.text.startswith("Error") else result.text
