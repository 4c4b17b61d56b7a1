"""What a tool's answer becomes before the model reads it: the text of MCP's content blocks, with chat
control tokens defused and cut to size; and what else the toolbox says of a call: how a result it wrote for
a call that got no answer begins, what the call cost, and where its results come from (for the cache)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from mcp.types import TextContent

from nanbeige.agent.trajectory.trajectory import ToolCall
from nanbeige.agent.trajectory.trajectory_file import redact

# Text spelling a chat control token (a scraped page quoting "<|im_end|>") would become the real
# token once rendered into a prompt and tokenized, and could end the tool turn and start a forged
# one. A zero-width space keeps it readable and makes it plain text.
CONTROL_TOKEN = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


def defuse_control_tokens(text: str) -> str:
    return CONTROL_TOKEN.sub("<\u200b|\\1|>", text)


def result_text(content: list[Any]) -> str:
    return "\n".join(block.text if isinstance(block, TextContent) else f"[{block.type} omitted]" for block in content)


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + "\n... [Result truncated]", True  # the reference harness's marker


def origin(info: Any, tool: dict[str, Any]) -> str:
    """Where a tool's results come from, for the cache: the name and version the server gave for itself
    and a digest of the tool's description and schema (a tool that changed may answer differently)."""
    about = json.dumps([tool["description"], tool["input_schema"]], sort_keys=True, default=str)
    server = f"{info.name} {info.version}".strip() if info is not None else "an unnamed server"
    return f"{server}; {tool['name']} {hashlib.sha256(about.encode()).hexdigest()[:12]}"


def redact_values(value: Any, secrets: list[str]) -> Any:
    """A JSON value with the secrets taken out of every string in it (keys of objects too)."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact(str(k), secrets): redact_values(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_values(v, secrets) for v in value]
    return value


def paid_usage(meta: dict[str, Any] | None) -> dict[str, float] | None:
    """What the call cost, as our own servers report it in the result's `_meta` (numbers only: a server
    the user plugged in could send anything there)."""
    reported = (meta or {}).get("nanbeige/usage")
    if not isinstance(reported, dict):
        return None
    return {k: v for k, v in reported.items() if isinstance(k, str) and isinstance(v, (int, float))} or None


def failure_prefix(call: ToolCall) -> str:
    """How a result the runtime wrote for a call that got no answer begins (the reference harness's words)."""
    return f"Tool call to {call.name} on {call.server} failed. Error: "
