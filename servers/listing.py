"""How the servers list their tools, in the two layouts the model learned.

In the harness the model was evaluated in, `tool-python` ran on the standalone fastmcp framework
and the search and scrape servers on the MCP SDK's FastMCP. The two described a tool differently,
and the model read both in its system prompt:

- the SDK passed the function's docstring through as written (Python 3.12 keeps its indentation): a
  leading newline, every line indented by 4 spaces, a last line of 4 spaces; and its input schema
  carries a top-level `title` (`<tool>Arguments`);
- fastmcp cleaned the docstring (flush left, no blank first or last line) and dropped that title.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.tools import Tool


def sdk_description(fn: Callable[..., Any]) -> str:
    """`fn`'s docstring laid out as the MCP SDK under Python 3.12 gave it."""
    return "\n" + textwrap.indent(inspect.cleandoc(fn.__doc__ or ""), "    ") + "\n    "


def fastmcp_tool(fn: Callable[..., Any]) -> Tool:
    """`fn` as a tool listed the way fastmcp listed it: cleaned description, no schema title."""
    tool = Tool.from_function(fn, description=inspect.cleandoc(fn.__doc__ or ""), structured_output=False)
    tool.parameters.pop("title", None)
    return tool


def server_version() -> str:
    """The version our servers give for themselves (the tool-result cache records it with each result)."""
    try:
        return importlib.metadata.version("nanbeige")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
