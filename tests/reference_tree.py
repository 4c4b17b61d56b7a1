"""A tree shaped like a MiroThinker checkout (the same files, names and code shapes), holding our own
placeholder texts: what `--reference` reads, without the reference's words in this repository.

Each text carries marks a test can look for, and the layouts the real one has that are easy to get
wrong: trailing spaces, blank lines around sections, a user message stripped at its end,
an indented docstring."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROMPTS = '''\
import os

mcp_tags = [
    "<use_mcp_tool>",
    "</use_mcp_tool>",
    "<server_name>",
    "</server_name>",
    "<arguments>",
    "</arguments>",
]

refusal_keywords = [
    "PLACEHOLDER-REFUSAL",
]


def generate_mcp_system_prompt(date, mcp_servers):
    formatted_date = date.strftime("%Y-%m-%d")
    template = f"""PLACEHOLDER-PREAMBLE with a trailing space. 

Date line: {formatted_date}

# PLACEHOLDER-FORMAT 
"""
    if os.getenv("USE_CN_PROMPT", "0") == "1":
        template = "PLACEHOLDER-CN"
    for server in mcp_servers:
        template += f"\\n## Server name: {server['name']}\\n"
        for tool in server["tools"]:
            template += f"### Tool name: {tool['name']}\\n"
            template += f"Description: {tool['description']}\\n"
            template += f"Input JSON schema: {tool['schema']}\\n"
    template += """
# PLACEHOLDER-GENERAL

PLACEHOLDER-GENERAL-TEXT

"""
    return template


def generate_agent_specific_system_prompt(agent_type=""):
    if agent_type == "main":
        system_prompt = """\\n
# PLACEHOLDER-MAIN-OBJECTIVE

PLACEHOLDER-MAIN-TEXT

"""
    else:
        raise ValueError(f"Unknown agent type: {agent_type}")
    return system_prompt.strip()


def generate_agent_summarize_prompt(task_description, task_failed=False, agent_type=""):
    if agent_type != "main":
        raise ValueError(agent_type)
    return (
        "PLACEHOLDER-SUMMARY-HEAD\\n\\n"
        f'"{task_description}"\\n\\n'
        "PLACEHOLDER-SUMMARY-RULES \\\\boxed{}."
    ).strip()
'''

INPUT = """\
import os
from typing import Tuple

import markdownify  # not installed: the module is never imported, process_input runs alone


def process_input(task_description: str, task_file_name: str) -> Tuple[str, str]:
    updated_task_description = task_description
    if task_file_name:
        updated_task_description += markdownify.markdownify(open(task_file_name).read())
    if os.getenv("USE_CN_PROMPT", "0") == "1":
        updated_task_description += "\\n中文-PLACEHOLDER \\\\boxed{}"
    else:
        updated_task_description += "\\nPLACEHOLDER-SUFFIX in \\\\boxed{}.  "
    return updated_task_description.strip(), updated_task_description
"""

ORCHESTRATOR_V1 = """\
class Orchestrator:
    def run(self, tool_name, query_str, count):
        log = f"query {query_str} seen {count} times"
        return {"result": f"PLACEHOLDER-DUPLICATE '{query_str}' via {tool_name}."}, log

    def _get_query_str_from_tool_call(self, tool_name, arguments):
        if tool_name == "google_search":
            return arguments.get("q")
        elif tool_name == "scrape_website":
            return arguments.get("url")
        return None
"""

ORCHESTRATOR_HEAD = """\
TRIES = 3


class Orchestrator:
    def __init__(self, cfg):
        self.max_final_answer_retries = TRIES if cfg.agent.keep_tool_result == -1 else 1

    def run(self, tool_name, query_str, count):
        return f"rolled back {tool_name} {query_str} after {count}"
"""

PYTHON_SERVER = '''\
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("tool-python")

INVALID_SANDBOX_IDS = {"default", "placeholder-box"}


@mcp.tool()
async def create_sandbox(timeout=600) -> str:
    """PLACEHOLDER-CREATE-SANDBOX

    Args:
        timeout: indented line.
    """


@mcp.tool()
async def run_python_code(code_block: str, sandbox_id: str) -> str:
    """PLACEHOLDER-RUN-PYTHON-CODE
    second line, indented.
    """
    if sandbox_id in INVALID_SANDBOX_IDS:
        return f"[ERROR]: PLACEHOLDER-INVALID {{'{sandbox_id}'}} id."


def helper():
    """Not a tool."""
'''

SEARCH_SERVER = '''\
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("search_and_scrape_webpage")


@mcp.tool()
async def google_search(q: str, gl: str = "us") -> str:
    """PLACEHOLDER-GOOGLE-SEARCH"""
'''

EXTRACT_SERVER = '''\
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("jina_scrape_llm_summary")


@mcp.tool()
async def scrape_and_extract_info(url: str, info_to_extract: str) -> dict:
    """PLACEHOLDER-SCRAPE-AND-EXTRACT"""


EXTRACT_INFO_PROMPT = """PLACEHOLDER-EXTRACT want: {} from: {}"""
'''

EVALUATOR = '''\
import re

HLE_JUDGE_PROMPT = """PLACEHOLDER-HLE-JUDGE q={question} r={response} a={correct_answer} {{kept}}"""

JUDGE_PROMPT_BC_en = """
PLACEHOLDER-BC-EN q={question} a={correct_answer} r={response}
""".strip()

JUDGE_PROMPT_BC_zh = """PLACEHOLDER-BC-ZH q={question} a={correct_answer} r={response} x={extra}"""

GAIA_VALIDATION_TEXT_103_SCORER_PROMPT = f"""PLACEHOLDER-EQUIVALENT {re}"""
'''

LLM_DEFAULT = "provider: anthropic\ntemperature: 0.3\ntop_p: 1.0\nmax_tokens: 4096\nkeep_tool_result: -1\n"
LLM_MODEL = "defaults:\n  - default\nmax_context_length: 262144\nmax_tokens: 16384\ntop_p: 0.95\n"
AGENT = "main_agent:\n  tools:\n    - tool-python\n  max_turns: 600\nkeep_tool_result: 5\n"


def make_reference(root: Path, head: bool = False, git: bool = False, scrape_repeats: bool = False) -> Path:
    """Write the tree at `root`: laid out as v1.0 (a duplicate-query note, `single_agent_keep5`), or
    as the later head (`head`: repeats rolled back, `mirothinker_v1.0_keep5`); with the note covering
    page extractions too as from 2025-12-02 (`scrape_repeats`); a git repository with one commit when
    `git`."""
    files = {
        "apps/miroflow-agent/src/utils/prompt_utils.py": PROMPTS,
        "apps/miroflow-agent/src/io/input_handler.py": INPUT,
        "apps/miroflow-agent/src/core/orchestrator.py": ORCHESTRATOR_HEAD
        if head
        else ORCHESTRATOR_V1.replace(
            '"scrape_website"', '"scrape_and_extract_info"' if scrape_repeats else '"scrape_website"'
        ),
        "libs/miroflow-tools/src/miroflow_tools/mcp_servers/python_mcp_server.py": PYTHON_SERVER,
        "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/search_and_scrape_webpage.py": SEARCH_SERVER,
        "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/jina_scrape_llm_summary.py": EXTRACT_SERVER,
        "apps/miroflow-agent/conf/llm/default.yaml": LLM_DEFAULT,
        "apps/miroflow-agent/conf/llm/qwen-3.yaml": LLM_MODEL,
        "apps/miroflow-agent/benchmarks/evaluators/eval_utils.py": EVALUATOR,
        (
            "apps/miroflow-agent/conf/agent/mirothinker_v1.0_keep5.yaml"
            if head
            else "apps/miroflow-agent/conf/agent/single_agent_keep5.yaml"
        ): AGENT,
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    if git:
        for command in (
            ["init", "-q"],
            ["add", "-A"],
            ["-c", "user.name=t", "-c", "user.email=t@127.0.0.1", "commit", "-qm", "tree"],
        ):
            subprocess.run(["git", *command], cwd=root, check=True)
    return root
