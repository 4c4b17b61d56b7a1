"""`nanbeige ask` with its three built-in servers: the model (scripted over loopback HTTP) searches a
local index of real Wikipedia summaries, reads a loopback page through scrape + extract, and runs
Python in the local sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, created_sandbox, mcp_answer, mcp_call
from fake_site import Site
from test_index import ovos_summaries

from nanbeige.tools.index import build_index

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def model(site: Site) -> Callable[[dict], Reply]:
    def reply(request: dict) -> Reply:
        messages = request["messages"]
        if messages[0]["content"].startswith("Your task is to read the web page"):  # the extraction call
            page = messages[0]["content"].split("## Page content\n", 1)[1]
            return Reply(content=" ".join(line for line in page.splitlines() if "687" in line))
        step = sum(m["role"] == "assistant" for m in messages)
        script = [
            lambda: mcp_call("search_and_scrape_webpage", "google_search", {"q": "Beethoven composer"}),
            lambda: mcp_call(
                "jina_scrape_llm_summary",
                "scrape_and_extract_info",
                {"url": site.url("/article"), "info_to_extract": "length of a Martian year"},
            ),
            lambda: mcp_call("tool-python", "create_sandbox", {}),
            lambda: mcp_call(
                "tool-python",
                "run_python_code",
                {"code_block": "years = 2\nyears * 687", "sandbox_id": created_sandbox(messages)},
            ),
            lambda: mcp_answer("1374"),
        ]
        return Reply(content=script[min(step, len(script) - 1)]())  # the summary turn: the answer again

    return reply


@pytest.mark.slow
def test_ask_searches_scrapes_and_computes_with_the_built_in_servers(tmp_path: Path) -> None:
    build_index([ovos_summaries()], tmp_path / "index")
    path = tmp_path / "run.jsonl"
    with Site() as site, FakeOpenAI(model(site)) as server:
        env = {
            **os.environ,
            "NANBEIGE_INDEX": str(tmp_path / "index"),
            "NANBEIGE_ALLOW_PRIVATE_URLS": "1",
            "NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"),
            "NANBEIGE_RUNS_DIR": str(tmp_path),
        }
        for name in ("SERPER_API_KEY", "SEARXNG_URL", "JINA_API_KEY", "E2B_API_KEY", "NANBEIGE_SEARCH_BACKEND"):
            env.pop(name, None)
        result = subprocess.run(
            [
                NANBEIGE,
                "ask",
                "How many days are two Martian years?",
                "--base-url",
                server.base_url,
                "--trajectory",
                str(path),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1374\n"
    turns = [json.loads(line) for line in path.read_text().splitlines() if '"type":"turn"' in line]
    search, scrape, created, python = (turn["tool_results"][0] for turn in turns[:4])
    assert not any(r["is_error"] for r in (search, scrape, created, python))
    hits = json.loads(search["text"])["organic"]
    assert hits[0]["title"] == "Ludwig van Beethoven"
    assert "687 Earth days" in json.loads(scrape["text"])["extracted_info"]
    assert "1374" in python["text"]
    start = json.loads(path.read_text().splitlines()[0])
    assert [s for s in dict.fromkeys(t["server"] for t in start["tools"])] == [
        "tool-python",
        "search_and_scrape_webpage",
        "jina_scrape_llm_summary",
    ]
