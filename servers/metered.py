"""A tool's answer with what the call cost (`nanbeige.tools.paid_units`) in the result's `_meta`, under
`nanbeige/usage`: the runtime sums it per run and holds runs to their budgets. Other MCP clients
ignore it; the text the model reads is unchanged."""

from __future__ import annotations

from mcp.types import CallToolResult, TextContent

USAGE_KEY = "nanbeige/usage"


def metered_result(text: str, cost: dict[str, float], is_error: bool = False) -> CallToolResult:
    meta = {USAGE_KEY: dict(cost)} if cost else None
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error, _meta=meta)
