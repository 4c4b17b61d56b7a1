"""The agent runtime. Its Python API (`nanbeige.agent.api`) is importable from here,
`from nanbeige.agent import ask`, and is loaded on first use: the command line never pays for it."""

from __future__ import annotations

import importlib
from typing import Any

_API = (
    "ask",
    "ask_async",
    "ask_many",
    "ask_many_async",
    "RunSettings",
    "LLMConfig",
    "AgentConfig",
    "BackendConfig",
    "ToolsConfig",
    "Trajectory",
    "SetupError",
)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module("nanbeige.agent.api"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
