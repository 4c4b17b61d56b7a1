"""The checkout's files as the pieces read them: where each one is, read once and kept for the hash that
says which texts the model saw, and ReferenceError for a file that is missing or cannot be read."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

# The reference requires Python >= 3.12 and its lock file resolves for 3.12 and 3.13, so which one
# ran it is not known. They differ in the tool descriptions the model read: 3.13's compiler strips
# the indentation of docstrings, and MCP SDK 1.x sends `__doc__` as it is (NANBEIGE_REFERENCE_PYTHON).
PYTHONS = ("3.12", "3.13")
MAX_FILE_BYTES = 5_000_000  # the largest source file read (the reference's are under 100 kB)
FILES = {
    "prompts": "apps/miroflow-agent/src/utils/prompt_utils.py",
    "input": "apps/miroflow-agent/src/io/input_handler.py",
    "orchestrator": "apps/miroflow-agent/src/core/orchestrator.py",
    "tool-python": "libs/miroflow-tools/src/miroflow_tools/mcp_servers/python_mcp_server.py",
    "search_and_scrape_webpage": "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/search_and_scrape_webpage.py",
    "jina_scrape_llm_summary": "libs/miroflow-tools/src/miroflow_tools/dev_mcp_servers/jina_scrape_llm_summary.py",
    "llm": "apps/miroflow-agent/conf/llm/default.yaml",
    "llm_model": "apps/miroflow-agent/conf/llm/qwen-3.yaml",
    "evaluator": "apps/miroflow-agent/benchmarks/evaluators/eval_utils.py",
}


class ReferenceError(Exception):
    """The checkout cannot be read, or lacks a text the model needs (the message names it)."""


class Reader:
    """Reads files of the checkout, each once, keeping what was read for the hash."""

    def __init__(self, root: Path, python: str = "3.12"):
        self.root = root
        self.python = python
        self.read_files: dict[str, bytes] = {}
        self.prompt_namespace: dict[str, Any] | None = None  # prompt_utils.py, run once

    def text(self, relative: str) -> str:
        if relative not in self.read_files:
            path = self.root / relative
            try:
                if not path.is_file():  # a folder, a pipe or a device is no source file
                    raise ReferenceError(f"{relative} is missing or not a regular file")
                if path.stat().st_size > MAX_FILE_BYTES:
                    raise ReferenceError(f"{relative} is larger than {MAX_FILE_BYTES // 1_000_000} MB")
                self.read_files[relative] = path.read_bytes()
            except OSError as exc:
                raise ReferenceError(f"cannot read {relative}: {exc.strerror or exc}") from None
        try:
            return self.read_files[relative].decode("utf-8")
        except UnicodeDecodeError:
            raise ReferenceError(f"{relative} is not UTF-8 text") from None

    def tree(self, relative: str) -> ast.Module:
        try:
            return ast.parse(self.text(relative), filename=relative)
        except SyntaxError as exc:
            raise ReferenceError(f"{relative} is not Python this interpreter can parse: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte, nesting too deep
            raise ReferenceError(f"{relative} cannot be parsed: {type(exc).__name__}") from None

    def exists(self, relative: str) -> bool:
        try:
            return (self.root / relative).is_file()
        except OSError:
            return False

    def digest(self) -> str:
        sha = hashlib.sha256()
        for relative in sorted(self.read_files):
            data = self.read_files[relative]
            sha.update(f"{relative}\0{len(data)}\0".encode() + data)
        return sha.hexdigest()
