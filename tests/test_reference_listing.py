"""The built-in servers' tools, as the mcp-xml system prompt shows them, in the reference's layout.

The schema lines below are the reference harness's own (v1.0, rendered by its pinned SDKs); the
descriptions are ours, so only their layout is compared.
"""

from __future__ import annotations

from pathlib import Path

import mcp
import pytest
from conftest import JAIL

from nanbeige.agent.reference.mcp_prompt import tool_catalogue
from nanbeige.servers import python, scrape, search
from nanbeige.tools.sandbox import SandboxConfig, Sandboxes
from nanbeige.tools.scrape import ScrapeConfig
from nanbeige.tools.search_config import SearchConfig

pytestmark = pytest.mark.anyio

REFERENCE_SCHEMAS = {
    "create_sandbox": "{'properties': {'timeout': {'default': 600, 'title': 'Timeout'}}, 'type': 'object'}",
    "run_command": "{'properties': {'command': {'title': 'Command', 'type': 'string'}, 'sandbox_id': {'title': "
    "'Sandbox Id', 'type': 'string'}}, 'required': ['command', 'sandbox_id'], 'type': 'object'}",
    "run_python_code": "{'properties': {'code_block': {'title': 'Code Block', 'type': 'string'}, 'sandbox_id': "
    "{'title': 'Sandbox Id', 'type': 'string'}}, 'required': ['code_block', 'sandbox_id'], "
    "'type': 'object'}",
    "upload_file_from_local_to_sandbox": "{'properties': {'sandbox_id': {'title': 'Sandbox Id', 'type': 'string'}, "
    "'local_file_path': {'title': 'Local File Path', 'type': 'string'}, "
    "'sandbox_file_path': {'default': '/home/user', 'title': 'Sandbox File "
    "Path', 'type': 'string'}}, 'required': ['sandbox_id', 'local_file_path'], "
    "'type': 'object'}",
    "download_file_from_internet_to_sandbox": "{'properties': {'sandbox_id': {'title': 'Sandbox Id', 'type': "
    "'string'}, 'url': {'title': 'Url', 'type': 'string'}, "
    "'sandbox_file_path': {'default': '/home/user', 'title': 'Sandbox "
    "File Path', 'type': 'string'}}, 'required': ['sandbox_id', 'url'], "
    "'type': 'object'}",
    "download_file_from_sandbox_to_local": "{'properties': {'sandbox_id': {'title': 'Sandbox Id', 'type': "
    "'string'}, 'sandbox_file_path': {'title': 'Sandbox File Path', 'type': "
    "'string'}, 'local_filename': {'default': None, 'title': 'Local "
    "Filename', 'type': 'string'}}, 'required': ['sandbox_id', "
    "'sandbox_file_path'], 'type': 'object'}",
    "google_search": "{'properties': {'q': {'title': 'Q', 'type': 'string'}, 'gl': {'default': 'us', 'title': "
    "'Gl', 'type': 'string'}, 'hl': {'default': 'en', 'title': 'Hl', 'type': 'string'}, "
    "'location': {'default': None, 'title': 'Location', 'type': 'string'}, 'num': {'default': "
    "None, 'title': 'Num', 'type': 'integer'}, 'tbs': {'default': None, 'title': 'Tbs', 'type': "
    "'string'}, 'page': {'default': None, 'title': 'Page', 'type': 'integer'}, 'autocorrect': "
    "{'default': None, 'title': 'Autocorrect', 'type': 'boolean'}}, 'required': ['q'], 'title': "
    "'google_searchArguments', 'type': 'object'}",
    "scrape_and_extract_info": "{'properties': {'url': {'title': 'Url', 'type': 'string'}, 'info_to_extract': "
    "{'title': 'Info To Extract', 'type': 'string'}, 'custom_headers': "
    "{'additionalProperties': {'type': 'string'}, 'default': None, 'title': 'Custom "
    "Headers', 'type': 'object'}}, 'required': ['url', 'info_to_extract'], 'title': "
    "'scrape_and_extract_infoArguments', 'type': 'object'}",
}


async def listed_tools(tmp_path: Path) -> list[dict]:
    servers = {
        "tool-python": python.build_server(Sandboxes(SandboxConfig(root=tmp_path / "boxes", jail=JAIL))),
        "search_and_scrape_webpage": search.build_server(SearchConfig(index_dir=tmp_path / "index")),
        "jina_scrape_llm_summary": scrape.build_server(ScrapeConfig()),
    }
    tools = []
    for name in ["jina_scrape_llm_summary", "tool-python", "search_and_scrape_webpage"]:  # any order: sorted later
        async with mcp.Client(servers[name]) as client:
            tools += [
                {"server": name, "name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in (await client.list_tools()).tools
            ]
    return tools


def tool_blocks(catalogue: str) -> dict[str, tuple[list[str], str]]:
    """Per tool: its description's lines and its schema line."""
    blocks = {}
    for block in catalogue.split("### Tool name: ")[1:]:
        name, rest = block.split("\n", 1)
        description, schema = rest.split("\nInput JSON schema: ")
        assert description.startswith("Description: ")
        blocks[name] = (description.removeprefix("Description: ").split("\n"), schema.split("\n")[0])
    return blocks


async def test_the_servers_tools_are_listed_in_the_reference_layout(tmp_path: Path) -> None:
    catalogue = tool_catalogue(await listed_tools(tmp_path))
    assert [line for line in catalogue.split("\n") if line.startswith("## ")] == [
        "## Server name: tool-python",
        "## Server name: search_and_scrape_webpage",
        "## Server name: jina_scrape_llm_summary",
    ]
    blocks = tool_blocks(catalogue)
    assert list(blocks) == list(REFERENCE_SCHEMAS)  # registration order within each server
    for name, (description, schema) in blocks.items():
        assert schema == REFERENCE_SCHEMAS[name], name
        if name in ("google_search", "scrape_and_extract_info"):
            # the SDK's raw docstring under Python 3.12: `Description: ` then indented lines, then 4 spaces
            assert description[0] == "" and description[-1] == "    ", name
            assert all(line == "" or line.startswith("    ") for line in description[1:]), name
            assert "    Args:" in description, name
        else:  # fastmcp's cleaned docstring: the summary on the `Description:` line, flush left
            assert description[0].strip() == description[0] != "", name
            assert "Args:" in description and description[-1].strip(), name
