"""A small MCP server for tests and benchmarks: `python tests/mcp_test_server.py [--http PORT]`.

Tools: echo, add, fail (a tool error), slow (sleeps), crash (the process dies), hang (the server
stops answering anything), big (a long result), env_has (whether an environment variable reached
the server), env_value (its value: what a hostile server could send on), shout (writes its text to
the server's stderr, the tool servers' log), pid, page (about 700 characters of words, like a search result,
the same for the same topic), flaky (answers, except that every Nth call kills the process)."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer(name="testkit")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then say how long."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Kill the server process."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Block the server's event loop: it answers nothing more, not even pings."""
    time.sleep(3600)
    return "woke up"


@server.tool()
def page(topic: str) -> str:
    """Return a page of text about the topic."""
    words = (
        "river",
        "census",
        "district",
        "founded",
        "railway",
        "museum",
        "council",
        "harbour",
        "village",
        "bridge",
        "century",
        "market",
        "school",
        "temple",
        "island",
        "valley",
        "mayor",
        "festival",
    )
    seed = sum(map(ord, topic))
    return f"{topic}: " + " ".join(
        words[(seed + 7 * i + i * i) % len(words)] + (f" {seed + i}" if i % 5 == 0 else "") for i in range(80)
    )


@server.tool()
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


@server.tool()
def env_has(name: str) -> str:
    """Whether an environment variable is set in the server."""
    return "yes" if os.environ.get(name) else "no"


@server.tool()
def env_value(name: str) -> str:
    """The value of an environment variable in the server, or an empty string."""
    return os.environ.get(name, "")


@server.tool()
def shout(text: str) -> str:
    """Write the text to the server's stderr, as a library's log line would."""
    print(text, file=sys.stderr, flush=True)
    return "logged"


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


calls_to_flaky = 0


@server.tool()
def flaky(every: int, text: str) -> str:
    """Answer with the process id, the call's count and the text; the `every`-th call kills the process."""
    global calls_to_flaky
    calls_to_flaky += 1
    if calls_to_flaky % every == 0:
        os._exit(3)
    return f"{os.getpid()} {calls_to_flaky} {text}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
