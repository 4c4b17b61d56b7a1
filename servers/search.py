"""MCP server `search_and_scrape_webpage` with one tool, `google_search`.

The backend (Serper, SearXNG or a local index) comes from the environment; see
`nanbeige.tools.search`. Run it as

    python -m nanbeige.servers.search                      # stdio
    python -m nanbeige.servers.search --transport http --port 8001
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ToolAnnotations

from nanbeige.servers.listing import sdk_description, server_version
from nanbeige.servers.metered import metered_result
from nanbeige.tools import paid_units
from nanbeige.tools.search import Searcher, SearchError, format_results
from nanbeige.tools.search_config import SearchConfig, SearchUnavailable, config_from_env, search_setup_problem

NAME = "search_and_scrape_webpage"
log = logging.getLogger(__name__)


def build_server(config: SearchConfig | None = None) -> MCPServer:
    """The server; `config` defaults to the environment's search settings."""
    config = config or config_from_env()

    @asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[dict[str, Searcher]]:
        problem = search_setup_problem(config)
        if problem:  # the server still starts; every call answers with this message
            log.warning("search is not configured: %s", problem)
        async with Searcher(config) as searcher:
            yield {"searcher": searcher}

    server = MCPServer(
        name=NAME, version=server_version(), instructions="Web search in Google's result format.", lifespan=lifespan
    )

    async def google_search(
        q: str,
        gl: str = "us",
        hl: str = "en",
        location: str | None = None,
        num: int | None = None,
        tbs: str | None = None,
        page: int | None = None,
        autocorrect: bool | None = None,
        *,
        ctx: Context,
    ) -> CallToolResult:
        """Search the web (Google results) and get back JSON with the organic results: title, link,
        snippet and, when known, a date.

        Args:
            q: What to search for. Put an exact phrase in double quotes; if the quoted search finds
                nothing, the search is repeated once without the quotes.
            gl: Country to search from, as a two-letter code (us, gb, cn, de, ...).
            hl: Language of the results (en, zh-cn, fr, ...).
            location: Place the search should appear to come from, such as "Berlin, Germany".
            num: How many results to return (1-100, default 10).
            tbs: Time filter: qdr:h for the past hour, qdr:d past day, qdr:w past week,
                qdr:m past month, qdr:y past year.
            page: Which page of results, counting from 1.
            autocorrect: Whether the engine may correct the query's spelling.
        """
        searcher: Searcher = ctx.request_context.lifespan_context["searcher"]
        with paid_units.metered() as cost:
            try:
                result = await searcher.google_search(q, gl, hl, location, num, tbs, page, autocorrect)
            except (SearchError, SearchUnavailable) as exc:
                # as the reference's search server answers: a JSON object saying what failed, not a tool error
                result = {"success": False, "error": str(exc), "results": []}
        return metered_result(format_results(result), cost)

    server.add_tool(
        google_search,
        description=sdk_description(google_search),
        structured_output=False,
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True),
    )
    return server


def serve(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8001) -> None:
    """Run the server until its client goes away (stdio) or it is interrupted (http)."""
    server = build_server()
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        server.run("streamable-http", host=host, port=port)
    else:
        raise ValueError(f"transport must be stdio or http, not {transport!r}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m nanbeige.servers.search", description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (http only)")
    parser.add_argument("--port", type=int, default=8001, help="port to listen on (http only)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")  # stderr
    serve(args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
