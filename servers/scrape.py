"""MCP server `jina_scrape_llm_summary`: scrape a page and extract information from it.

    python -m nanbeige.servers.scrape [--transport stdio|http] [--host 127.0.0.1] [--port 8001]

Configured by environment variables: NANBEIGE_SCRAPE_BACKEND, JINA_API_KEY, JINA_BASE_URL,
NANBEIGE_SUMMARY_BASE_URL / _MODEL / _API_KEY, NANBEIGE_ALLOW_PRIVATE_URLS, NANBEIGE_ALLOWED_HOSTS.
"""

from __future__ import annotations

import argparse
import json

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult

from nanbeige.servers.listing import sdk_description, server_version
from nanbeige.servers.metered import metered_result
from nanbeige.tools import paid_units, scrape
from nanbeige.tools.fetch import FetchError
from nanbeige.tools.scrape import ScrapeConfig, ScrapeError, scrape_config_from_env

NAME = "jina_scrape_llm_summary"


def build_server(config: ScrapeConfig | None = None) -> MCPServer:
    config = config or scrape_config_from_env()
    server = MCPServer(name=NAME, version=server_version())

    async def scrape_and_extract_info(
        url: str, info_to_extract: str, custom_headers: dict[str, str] | None = None
    ) -> CallToolResult:
        """Fetch a web page, PDF, or other online file and extract the requested information from it
        with a language model. Use it to read a page found by search, and for PDFs and documents.

        Args:
            url: The address of the page or file (http or https).
            info_to_extract: What to look for on the page, as a clear request or question.
            custom_headers: Optional extra HTTP headers to send with the request.

        Returns:
            A JSON object: success, url, extracted_info, error, scrape_stats (line_count, char_count,
            last_char_line, all_content_displayed), model_used, tokens_used.
        """
        with paid_units.metered() as cost:
            try:
                result = await scrape.scrape_and_extract_info(url, info_to_extract, custom_headers, config)
            except (FetchError, ScrapeError) as exc:
                # as the reference's scrape server answers: the same JSON object, saying what failed
                result = {
                    "success": False,
                    "url": url,
                    "extracted_info": "",
                    "error": f"Scraping failed: {exc}",
                    "scrape_stats": {},
                    "tokens_used": 0,
                }
        # printed as the reference's server did
        return metered_result(json.dumps(result, ensure_ascii=False, indent=2), cost)

    server.add_tool(
        scrape_and_extract_info, description=sdk_description(scrape_and_extract_info), structured_output=False
    )
    return server


def serve(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8001) -> None:
    server = build_server()
    if transport == "http":
        server.run("streamable-http", host=host, port=port)
    else:
        server.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    serve(args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
