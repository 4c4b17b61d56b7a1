"""Run the reference harness's own main agent (`Orchestrator.run_main_agent` of a MiroThinker checkout)
on a scripted run, and record every request its own OpenAI client builds.

Nothing of the reference is rewritten: its orchestrator, input handler, prompt functions, parser,
output formatter, task log and `OpenAIClient` run as they are. Only what lies outside the checkout
or needs the network is replaced: the OpenAI SDK's client (a scripted one that records the request),
the MCP tool manager (scripted results), and the third-party modules it imports for other paths
(document converters, tiktoken, colorama, omegaconf, the SDKs) by stand-ins that do nothing. tenacity
is replaced by a retry with the same attempt count and no waiting. tiktoken's stand-in gives no
encoding, so the reference's own fallback (characters / 4) counts tokens for its context check.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any, Callable

STAND_INS = (
    "dotenv",
    "omegaconf",
    "mammoth",
    "markdownify",
    "openpyxl",
    "pdfminer",
    "pptx",
    "pydub",
    "speech_recognition",
    "bs4",
    "markitdown",
    "youtube_transcript_api",
    "tiktoken",
    "openai",
    "anthropic",
    "colorama",
    "miroflow_tools",
    "hydra",
    "PIL",
    "requests",
    "aiohttp",
    "httpx_sse",
)


class _Anything(type):
    """A class that is also any attribute of itself: what a stand-in module hands out."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _anything(name)


def _anything(name: str) -> Any:
    return _Anything(
        name,
        (),
        {
            "__init__": lambda self, *a, **k: None,
            "__call__": lambda self, *a, **k: None,
            "__getattr__": lambda self, n: _anything(n),
        },
    )


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = lambda name: _anything(name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: Any) -> None:
        pass


def _tenacity() -> types.ModuleType:
    """tenacity's `retry(wait=..., stop=stop_after_attempt(n))` for async functions, without the waits."""
    module = types.ModuleType("tenacity")

    def retry(wait: Any = None, stop: int = 1) -> Callable[[Any], Any]:
        def decorate(function: Any) -> Any:
            async def wrapped(*args: Any, **kwargs: Any) -> Any:
                for attempt in range(stop):
                    try:
                        return await function(*args, **kwargs)
                    except Exception:
                        if attempt == stop - 1:
                            raise

            return wrapped

        return decorate

    module.retry, module.stop_after_attempt, module.wait_fixed = retry, lambda n: n, lambda s: None
    return module


class Config(dict):
    """omegaconf's DictConfig as the reference reads it: attributes and `.get`."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return Config(value) if isinstance(value, dict) else value


class _Choice:
    def __init__(self, content: str, finish_reason: str):
        self.message = types.SimpleNamespace(content=content, tool_calls=None)
        self.finish_reason = finish_reason


class ScriptedClient:
    """The OpenAI SDK's async client as `OpenAIClient` uses it: records each request, answers from a
    script (text, or (text, finish_reason))."""

    def __init__(self, replies: list[Any]):
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self.create))

    async def create(self, **params: Any) -> Any:
        self.requests.append({**params, "messages": [dict(m) for m in params["messages"]]})
        reply = self.replies.pop(0) if self.replies else "\\boxed{}"
        text, finish = reply if isinstance(reply, tuple) else (reply, "stop")
        usage = types.SimpleNamespace(prompt_tokens=10, completion_tokens=10, prompt_tokens_details=None)
        return types.SimpleNamespace(choices=[_Choice(text, finish)], usage=usage)


class ScriptedTools:
    """The reference's ToolManager: the tool definitions, and a result per call."""

    def __init__(self, definitions: list[dict[str, Any]], result: Callable[[str, str, dict[str, Any]], dict[str, Any]]):
        self.definitions, self.result = definitions, result

    async def get_all_tool_definitions(self) -> list[dict[str, Any]]:
        return self.definitions

    async def execute_tool_call(self, server_name: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.result(server_name, tool_name, arguments)


def load(root: Path) -> types.ModuleType:
    """The checkout's `apps/miroflow-agent/src` as the package `miroflow_reference` (imported anew)."""
    for name in [n for n in sys.modules if n == "miroflow_reference" or n.startswith("miroflow_reference.")]:
        del sys.modules[name]
    if not any(isinstance(f, _StandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandIns())
    sys.modules["tenacity"] = _tenacity()
    spec = importlib.machinery.ModuleSpec("miroflow_reference", None, is_package=True)
    package = importlib.util.module_from_spec(spec)
    package.__path__ = [str(root / "apps/miroflow-agent/src")]  # type: ignore[attr-defined]
    sys.modules["miroflow_reference"] = package
    return package


def run(
    root: Path,
    question: str,
    replies: list[Any],
    definitions: list[dict[str, Any]],
    result: Callable[[str, str, dict[str, Any]], dict[str, Any]],
    max_turns: int,
    log_dir: Path,
    keep: int = 5,
    max_context: int = 262144,
    max_tokens: int = 16384,
) -> list[dict[str, Any]]:
    """The requests the reference's main agent sends for the scripted run."""
    load(root)
    orchestrator = importlib.import_module("miroflow_reference.core.orchestrator")
    client_module = importlib.import_module("miroflow_reference.llm.providers.openai_client")
    formatter = importlib.import_module("miroflow_reference.io.output_formatter")
    task_logger = importlib.import_module("miroflow_reference.logging.task_logger")
    cfg = Config(
        llm={
            "provider": "qwen",
            "model_name": "nanbeige",
            "temperature": 1.0,
            "top_p": 0.95,
            "min_p": 0.0,
            "top_k": -1,
            "max_context_length": max_context,
            "max_tokens": max_tokens,
            "async_client": True,
            "keep_tool_result": keep,
            "repetition_penalty": 1.05,
        },
        agent={
            "keep_tool_result": keep,
            "main_agent": {"max_turns": max_turns},
            "sub_agents": None,
            "context_compress_limit": 0,
            "retry_with_summary": False,
        },
    )
    log = task_logger.TaskLog(log_dir=str(log_dir), task_id="check")
    llm = client_module.OpenAIClient(task_id="check", cfg=cfg, task_log=log)
    scripted = ScriptedClient(replies)
    llm.client = scripted
    agent = _orchestrator(orchestrator, ScriptedTools(definitions, result), llm, formatter.OutputFormatter(), cfg, log)
    asyncio.run(agent.run_main_agent(question, None, "check"))
    return scripted.requests


def _orchestrator(module: Any, tools: ScriptedTools, llm: Any, formatter: Any, cfg: Config, log: Any) -> Any:
    """The Orchestrator, built with the arguments its version takes."""
    import inspect

    parameters = inspect.signature(module.Orchestrator).parameters
    arguments = {
        "main_agent_tool_manager": tools,
        "sub_agent_tool_managers": {},
        "llm_client": llm,
        "output_formatter": formatter,
        "cfg": cfg,
        "task_log": log,
    }
    return module.Orchestrator(**{k: v for k, v in arguments.items() if k in parameters})
