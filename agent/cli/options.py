"""The run settings every command running the agent shares (`ask`, `research`, `eval`, `collect`, `loop`),
each declared once as a `RunSetting`: its flag (name, type, default, help, environment variable, panel), the
field of `RunSettings` it fills and how. From that one table come the Typer options (`RUN_OPTIONS`), the
`RunSettings` a command's values make (`run_settings`) and the Python API's keyword arguments (`api.OVERRIDES`).
Numbers' bounds are `ranges.RANGES`, shared with the API the same way."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli.console import fail
from nanbeige.agent.cli.run_setting import RunSetting
from nanbeige.agent.run.run_config import AgentConfig, BackendConfig, RunSettings, ToolsConfig

ADVANCED = "Advanced"


def _or_empty(value: list[str] | None) -> list[str]:
    return value or []


def _request_deadline(value: float | None) -> float:
    return LLMConfig.timeout_s if value is None else value


RUN: dict[str, RunSetting] = {
    setting.name: setting
    for setting in (
        RunSetting(
            "base_url",
            "llm.base_url",
            list[str] | None,
            None,
            f"OpenAI-compatible endpoint \\[default: {LLMConfig.base_url}, or the in-process model when nothing "
            "answers there]; repeat it (in NANBEIGE_BASE_URL: space-separated) for a pool of servers of one model.",
            envvar="NANBEIGE_BASE_URL",
            show_default=False,
            api_kind=str,
        ),
        RunSetting(
            "backend",
            "backend.backend",
            str,
            BackendConfig.backend,
            "auto, openai (a server) or transformers (in this process).",
        ),
        RunSetting("model", "llm.model", str, LLMConfig.model, "Model name.", envvar="NANBEIGE_MODEL"),
        RunSetting(
            "api_key",
            "llm.api_key",
            str | None,
            None,
            "API key for the endpoint.",
            envvar="NANBEIGE_API_KEY",
            show_default=False,
        ),
        RunSetting("dialect", "agent.dialect", str, AgentConfig.dialect, "Tool dialect: mcp-xml or tool-call."),
        RunSetting(
            "max_turns",
            "agent.max_turns",
            int | None,
            None,
            "Most model turns before the answer is asked for \\[default: 600 for mcp-xml, 200 for tool-call].",
            show_default=False,
        ),
        RunSetting(
            "keep_tool_results",
            "agent.keep_tool_results",
            int,
            AgentConfig.keep_tool_results,
            "Show only the last K tool results (-1: all).",
        ),
        RunSetting(
            "max_context",
            "agent.max_context",
            int | None,
            None,
            "Model context length in tokens \\[default: the server's max_model_len, else 262144].",
            show_default=False,
        ),
        RunSetting(
            "temperature",
            "llm.temperature",
            float | None,
            None,
            "Sampling temperature \\[default: 1.0 for mcp-xml, 0.6 for tool-call].",
            show_default=False,
        ),
        RunSetting(
            "top_p",
            "llm.top_p",
            float | None,
            None,
            "Nucleus sampling threshold \\[default: 0.95].",
            show_default=False,
        ),
        RunSetting(
            "repetition_penalty",
            "llm.repetition_penalty",
            float | None,
            None,
            "Penalty on repeated tokens, vLLM servers only \\[default: 1.05 for mcp-xml, 1.0 (off) for tool-call].",
            show_default=False,
        ),
        RunSetting("max_tokens", "llm.max_tokens", int, LLMConfig.max_tokens, "Most tokens per model reply."),
        RunSetting(
            "mcp",
            "tools.mcp",
            list[str] | None,
            None,
            "Extra MCP server, NAME=COMMAND or NAME=URL (repeatable).",
            show_default=False,
            to_field=_or_empty,
        ),
        RunSetting(
            "no_default_servers",
            "tools.default_servers",
            bool,
            False,
            "Use only the --mcp servers.",
            flags=("--no-default-servers",),
            to_field=operator.not_,
        ),
        RunSetting(
            "tool_timeout",
            "tools.tool_timeout_s",
            float,
            ToolsConfig.tool_timeout_s,
            "Seconds one tool call may take.",
            panel=ADVANCED,
        ),
        RunSetting(
            "max_result_chars",
            "tools.max_result_chars",
            int,
            ToolsConfig.max_result_chars,
            "Longer tool results are cut.",
            panel=ADVANCED,
        ),
        RunSetting(
            "timeout",
            "agent.timeout_s",
            float | None,
            None,
            "Wall-clock limit for one run, in seconds.",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "request_timeout",
            "llm.timeout_s",
            float | None,
            None,
            "Seconds one model call may take in all, from the request to the reply's last byte: a server that "
            "trickles its reply, or sends only keep-alive pings, fails the call then, and it is asked again (at "
            "another endpoint of a pool) \\[default: 600 for the agent's model, 300 for the judge, 120 for the "
            "critic and the question writer].",
            panel=ADVANCED,
            show_default=False,
            to_field=_request_deadline,
        ),
        RunSetting(
            "gguf_file",
            "backend.gguf_file",
            str | None,
            None,
            "GGUF file inside --model, for the in-process backend.",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "token_mode",
            "backend.token_mode",
            bool,
            False,
            "Render prompts here with the model's tokenizer and send token ids to "
            "vLLM's /v1/completions (token-exact trajectories).",
            panel=ADVANCED,
        ),
        RunSetting(
            "chat_template",
            "backend.chat_template",
            Path | None,
            None,
            "Chat template file for --token-mode and the in-process model (default: the deep-search template "
            "beside the weights in the mcp-xml dialect, else the tokenizer's).",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "tokenizer",
            "backend.tokenizer",
            str | None,
            None,
            "Tokenizer for --token-mode: a folder or Hugging Face id "
            "\\[default: the folder the server lists as the model's root, else --model].",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "summary_turn",
            "agent.summary_turn",
            bool | None,
            None,
            "End every run with a turn that asks for the boxed answer \\[default: on for mcp-xml, as the reference "
            "harness does; off for tool-call].",
            flags=("--summary-turn/--no-summary-turn",),
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "rollback",
            "agent.rollback",
            bool | None,
            None,
            "Drop unusable replies (malformed call, refusal, cut off, looping) and sample again, instead of "
            "answering them with a message \\[default: on for mcp-xml, off for tool-call].",
            flags=("--rollback/--no-rollback",),
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "system_prompt_file",
            "system_prompt_file",
            Path | None,
            None,
            "The mcp-xml system prompt as a template: {tools} is the tool catalogue, {date} today's date.",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "reference",
            "reference",
            Path | None,
            None,
            "A checkout of MiroThinker, the harness the model was trained in: in mcp-xml the model reads that "
            "harness's own prompts, tool descriptions and rules, read from it (see `nanbeige reference check`). "
            "Its prompt functions run with your rights: name only a checkout you trust.",
            flags=("--reference",),
            envvar="NANBEIGE_REFERENCE",
            panel=ADVANCED,
            show_default=False,
        ),
        RunSetting(
            "budget",
            "agent.budgets",
            list[str] | None,
            None,
            "Most a run may use, UNIT=N (repeatable): tokens, tool_calls, serper_queries, jina_tokens, "
            "summary_tokens, e2b_seconds. Reaching one stops the run (stop reason budget) and asks for its answer.",
            panel=ADVANCED,
            show_default=False,
            api_kind=dict,
        ),
        RunSetting(
            "cache",
            "tools.cache",
            Path | None,
            None,
            "SQLite file of tool results (made if missing): recorded calls are answered from it, new answers "
            "recorded. Safe for many runs and processes at once. The Python sandbox is never cached.",
            show_default=False,
        ),
        RunSetting(
            "replay",
            "tools.replay",
            bool,
            False,
            "Answer tool calls only from --cache, offline (the sandbox still runs); a call not recorded stops the "
            "run and the command fails.",
            flags=("--replay",),
        ),
        RunSetting(
            "verbose",
            "backend.verbose",
            bool,
            False,
            "Show third-party libraries' own progress bars and logs (loading a model in this process).",
            flags=("--verbose",),
            panel=ADVANCED,
        ),
        RunSetting(
            "route",
            "backend.route",
            str,
            "run",
            "With several --base-url: `run` keeps each run on the endpoint of its first turn (its prefix cache), "
            "`group` keeps a question's rollouts together too.",
            panel=ADVANCED,
        ),
    )
}
"""Every run setting a command running the agent takes, in the order its help lists them; a command gets their
flags through `option_tables.with_run_options`."""

RUN_OPTIONS: dict[str, tuple[Any, Any]] = {name: setting.option() for name, setting in RUN.items()}
"""The run settings' flags as option table rows: name -> (the Typer option, its default)."""


def flag(name: str) -> Any:
    """Run setting `name`'s Typer option, for a command that declares the flag in its own signature."""
    return RUN_OPTIONS[name][0]


def ray_address(value: str | None) -> str | None:
    """`--ray`'s value, checked before anything starts: auto, or the head node's HOST:PORT."""
    host, colon, port = (value or "").rpartition(":")
    if value not in (None, "auto") and (not colon or not host or not port.isdigit()):
        fail(f"--ray takes auto or HOST:PORT (the head node's address), not {value!r}", 2)
    return value


RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="auto|HOST:PORT",
        show_default=False,
        rich_help_panel="Cluster",
        callback=ray_address,
        help="Run in shards on a Ray cluster, one per node, each with its own tool servers, sandbox and model "
        "clients and --concurrency at once: auto (the cluster `ray start` made this machine part of) or the "
        "head's address. This process alone writes the output files, as without it.",
    ),
]


Question = Annotated[
    str | None, typer.Argument(help="The question to research; `-` reads it from stdin.", show_default=False)
]
QuestionFile = Annotated[
    Path | None, typer.Option(help="Read the question from this file (any length).", show_default=False)
]


def endpoints(base_url: list[str] | str | None, default: str) -> dict[str, Any]:
    """The `base_url` and `more_base_urls` of a ChatEndpoint whose flag may be given several times."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url or [])
    return {"base_url": urls[0] if urls else default, "more_base_urls": tuple(urls[1:])}


def option(kind: Any, default: Any, *names: str, **settings: Any) -> tuple[Any, Any]:
    """One row of an option table: the flag typed as `kind`, made by `typer.Option(*names, **settings)`, and
    its default."""
    return Annotated[kind, typer.Option(*names, **settings)], default


# What a caller may leave out besides the run settings' own flags, whose defaults stand in: only `ask` and
# `research` have --trajectory, only the Python API has upload_dirs.
NOT_FLAGS: dict[str, Any] = {"trajectory": None, "upload_dirs": None}


def run_settings(flags: Mapping[str, Any]) -> RunSettings:
    """The settings the run flags describe; a flag a command does not take has its declared default (unset ones
    stay None: the dialect fills them in). `flags` may hold a command's other values too: only the run
    settings' names are read."""
    from nanbeige.agent.run.usage import parse_budgets

    f = {name: setting.default for name, setting in RUN.items()} | NOT_FLAGS | dict(flags)
    if f["replay"] and f["cache"] is None:  # before a command makes anything (an eval's out folder)
        fail("--replay needs --cache PATH: the cache file to answer tool calls from", 2)
    parts: dict[str | None, dict[str, Any]] = {"llm": {}, "agent": {}, "backend": {}, "tools": {}, None: {}}
    for name, setting in RUN.items():
        part, field = setting.part_and_field()
        parts[part][field] = setting.to_field(f[name]) if setting.to_field else f[name]
    # two fields are more than their flag's value, set over the loop's: the budgets parsed (a bad one is a usage
    # error here, a ValueError in the API), and the pool's URLs split into the first and the rest
    try:
        parts["agent"]["budgets"] = parse_budgets(f["budget"] or [])
    except ValueError as exc:
        fail(str(exc), 2)  # a bad value, as setup's own checks report one
    urls = [f["base_url"]] if isinstance(f["base_url"], str) else list(f["base_url"] or [])
    parts["llm"] |= endpoints(urls, LLMConfig.base_url)
    parts["backend"]["base_url_given"] = bool(urls)
    parts["tools"]["upload_dirs"] = f["upload_dirs"] or []
    return RunSettings(
        llm=LLMConfig(**parts["llm"]),
        agent=AgentConfig(**parts["agent"]),
        backend=BackendConfig(**parts["backend"]),
        tools=ToolsConfig(**parts["tools"]),
        trajectory=f["trajectory"],
        **parts[None],
    )
