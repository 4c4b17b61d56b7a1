"""The model, loop and tool flags that every command running the agent shares (`ask`, `eval`), as
typed Typer options, and the one function that maps their values onto `RunSettings`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli.console import fail
from nanbeige.agent.cli.ranges import bounds
from nanbeige.agent.run.run_config import AgentConfig, BackendConfig, RunSettings, ToolsConfig

ADVANCED = "Advanced"

BaseUrl = Annotated[
    list[str] | None,
    typer.Option(
        envvar="NANBEIGE_BASE_URL",
        show_default=False,
        help=(
            f"OpenAI-compatible endpoint \\[default: {LLMConfig.base_url}, or the in-process model when nothing "
            "answers there]; repeat it (in NANBEIGE_BASE_URL: space-separated) for a pool of servers of one model."
        ),
    ),
]
Route = Annotated[
    str,
    typer.Option(
        rich_help_panel=ADVANCED,
        help=(
            "With several --base-url: `run` keeps each run on the endpoint of its first turn (its prefix cache), "
            "`group` keeps a question's rollouts together too."
        ),
    ),
]
Backend = Annotated[str, typer.Option(help="auto, openai (a server) or transformers (in this process).")]
Model = Annotated[str, typer.Option(envvar="NANBEIGE_MODEL", help="Model name.")]
ApiKey = Annotated[
    str | None, typer.Option(envvar="NANBEIGE_API_KEY", help="API key for the endpoint.", show_default=False)
]
Dialect = Annotated[str, typer.Option(help="Tool dialect: mcp-xml or tool-call.")]
MaxTurns = Annotated[
    int | None,
    typer.Option(
        **bounds("max_turns"),
        show_default=False,
        help=("Most model turns before the answer is asked for \\[default: 600 for mcp-xml, 200 for tool-call]."),
    ),
]
KeepToolResults = Annotated[
    int, typer.Option(**bounds("keep_tool_results"), help="Show only the last K tool results (-1: all).")
]
MaxContext = Annotated[
    int | None,
    typer.Option(
        **bounds("max_context"),
        show_default=False,
        help=("Model context length in tokens \\[default: the server's max_model_len, else 262144]."),
    ),
]
Temperature = Annotated[
    float | None,
    typer.Option(
        **bounds("temperature"),
        show_default=False,
        help=("Sampling temperature \\[default: 1.0 for mcp-xml, 0.6 for tool-call]."),
    ),
]
TopP = Annotated[
    float | None,
    typer.Option(**bounds("top_p"), show_default=False, help=("Nucleus sampling threshold \\[default: 0.95].")),
]
RepetitionPenalty = Annotated[
    float | None,
    typer.Option(
        **bounds("repetition_penalty"),
        show_default=False,
        help=("Penalty on repeated tokens, vLLM servers only \\[default: 1.05 for mcp-xml, 1.0 (off) for tool-call]."),
    ),
]
MaxTokens = Annotated[int, typer.Option(**bounds("max_tokens"), help="Most tokens per model reply.")]
Mcp = Annotated[
    list[str] | None, typer.Option(help="Extra MCP server, NAME=COMMAND or NAME=URL (repeatable).", show_default=False)
]
NoDefaultServers = Annotated[bool, typer.Option("--no-default-servers", help="Use only the --mcp servers.")]
ToolTimeout = Annotated[
    float, typer.Option(**bounds("tool_timeout"), help="Seconds one tool call may take.", rich_help_panel=ADVANCED)
]
MaxResultChars = Annotated[
    int, typer.Option(**bounds("max_result_chars"), help="Longer tool results are cut.", rich_help_panel=ADVANCED)
]
RequestTimeout = Annotated[
    float | None,
    typer.Option(
        **bounds("request_timeout"),
        show_default=False,
        rich_help_panel=ADVANCED,
        help="Seconds one model call may take in all, from the request to the reply's last byte: a server that "
        "trickles its reply, or sends only keep-alive pings, fails the call then, and it is asked again (at another "
        "endpoint of a pool) \\[default: 600 for the agent's model, 300 for the judge, 120 for the critic and the "
        "question writer].",
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        **bounds("timeout"),
        help="Wall-clock limit for one run, in seconds.",
        rich_help_panel=ADVANCED,
        show_default=False,
    ),
]
GgufFile = Annotated[
    str | None,
    typer.Option(
        help="GGUF file inside --model, for the in-process backend.", rich_help_panel=ADVANCED, show_default=False
    ),
]
TokenMode = Annotated[
    bool,
    typer.Option(
        help="Render prompts here with the model's tokenizer and send token ids to "
        "vLLM's /v1/completions (token-exact trajectories).",
        rich_help_panel=ADVANCED,
    ),
]
ChatTemplate = Annotated[
    Path | None,
    typer.Option(
        help="Chat template file for --token-mode and the in-process model (default: the deep-search template "
        "beside the weights in the mcp-xml dialect, else the tokenizer's).",
        rich_help_panel=ADVANCED,
        show_default=False,
    ),
]
Tokenizer = Annotated[
    str | None,
    typer.Option(
        help="Tokenizer for --token-mode: a folder or Hugging Face id "
        "\\[default: the folder the server lists as the model's root, else "
        "--model].",
        rich_help_panel=ADVANCED,
        show_default=False,
    ),
]
SummaryTurn = Annotated[
    bool | None,
    typer.Option(
        "--summary-turn/--no-summary-turn",
        show_default=False,
        help=(
            "End every run with a turn that asks for the boxed answer \\[default: on for mcp-xml, as the reference "
            "harness does; off for tool-call]."
        ),
        rich_help_panel=ADVANCED,
    ),
]
Rollback = Annotated[
    bool | None,
    typer.Option(
        "--rollback/--no-rollback",
        show_default=False,
        help=(
            "Drop unusable replies (malformed call, refusal, cut off, looping) and sample again, instead of answering "
            "them with a message \\[default: on for mcp-xml, off for tool-call]."
        ),
        rich_help_panel=ADVANCED,
    ),
]
Question = Annotated[
    str | None, typer.Argument(help="The question to research; `-` reads it from stdin.", show_default=False)
]
QuestionFile = Annotated[
    Path | None, typer.Option(help="Read the question from this file (any length).", show_default=False)
]
Budget = Annotated[
    list[str] | None,
    typer.Option(
        show_default=False,
        help=(
            "Most a run may use, UNIT=N (repeatable): tokens, tool_calls, serper_queries, jina_tokens, summary_tokens, "
            "e2b_seconds. Reaching one stops the run (stop reason budget) and asks for its answer."
        ),
        rich_help_panel=ADVANCED,
    ),
]
SystemPromptFile = Annotated[
    Path | None,
    typer.Option(
        help="The mcp-xml system prompt as a template: {tools} is the tool catalogue, {date} today's date.",
        rich_help_panel=ADVANCED,
        show_default=False,
    ),
]
ReferenceCheckout = Annotated[
    Path | None,
    typer.Option(
        "--reference",
        envvar="NANBEIGE_REFERENCE",
        show_default=False,
        rich_help_panel=ADVANCED,
        help=(
            "A checkout of MiroThinker, the harness the model was trained in: in mcp-xml the model reads that "
            "harness's own prompts, tool descriptions and rules, read from it (see `nanbeige reference check`). "
            "Its prompt functions run with your rights: name only a checkout you trust."
        ),
    ),
]
Cache = Annotated[
    Path | None,
    typer.Option(
        show_default=False,
        help=(
            "SQLite file of tool results (made if missing): recorded calls are answered from it, new answers recorded. "
            "Safe for many runs and processes at once. The Python sandbox is never cached."
        ),
    ),
]
Replay = Annotated[
    bool,
    typer.Option(
        "--replay",
        help=(
            "Answer tool calls only from --cache, offline (the sandbox still runs); a call not recorded stops the run "
            "and the command fails."
        ),
    ),
]

Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help=("Show third-party libraries' own progress bars and logs (loading a model in this process)."),
        rich_help_panel=ADVANCED,
    ),
]


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


def endpoints(base_url: list[str] | str | None, default: str) -> dict[str, Any]:
    """The `base_url` and `more_base_urls` of a ChatEndpoint whose flag may be given several times."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url or [])
    return {"base_url": urls[0] if urls else default, "more_base_urls": tuple(urls[1:])}


# The run-settings flags every command that runs the agent takes (ask, research, eval, collect), defined once:
# name -> (the flag, its default). A command gets them through `with_run_options`.
RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "base_url": (BaseUrl, None),
    "backend": (Backend, BackendConfig.backend),
    "model": (Model, LLMConfig.model),
    "api_key": (ApiKey, None),
    "dialect": (Dialect, AgentConfig.dialect),
    "max_turns": (MaxTurns, None),
    "keep_tool_results": (KeepToolResults, AgentConfig.keep_tool_results),
    "max_context": (MaxContext, None),
    "temperature": (Temperature, None),
    "top_p": (TopP, None),
    "repetition_penalty": (RepetitionPenalty, None),
    "max_tokens": (MaxTokens, LLMConfig.max_tokens),
    "mcp": (Mcp, None),
    "no_default_servers": (NoDefaultServers, False),
    "tool_timeout": (ToolTimeout, ToolsConfig.tool_timeout_s),
    "max_result_chars": (MaxResultChars, ToolsConfig.max_result_chars),
    "timeout": (Timeout, None),
    "request_timeout": (RequestTimeout, None),
    "gguf_file": (GgufFile, None),
    "token_mode": (TokenMode, False),
    "chat_template": (ChatTemplate, None),
    "tokenizer": (Tokenizer, None),
    "summary_turn": (SummaryTurn, None),
    "rollback": (Rollback, None),
    "system_prompt_file": (SystemPromptFile, None),
    "reference": (ReferenceCheckout, None),
    "budget": (Budget, None),
    "cache": (Cache, None),
    "replay": (Replay, False),
    "verbose": (Verbose, False),
    "route": (Route, "run"),
}


def option(kind: Any, default: Any, *names: str, **settings: Any) -> tuple[Any, Any]:
    """One row of an option table: the flag typed as `kind`, made by `typer.Option(*names, **settings)`, and
    its default."""
    return Annotated[kind, typer.Option(*names, **settings)], default


# The run settings that no command need give: what they are when a caller leaves them out (`eval` has no
# --tokenizer, `collect` no --verbose; only `ask` and `research` have --trajectory, only the API has upload_dirs).
UNSET: dict[str, Any] = {
    "reference": None,
    "trajectory": None,
    "upload_dirs": None,
    "budget": None,
    "cache": None,
    "replay": False,
    "verbose": False,
    "tokenizer": None,
    "route": "run",
    "request_timeout": None,
}


def run_settings(flags: Mapping[str, Any]) -> RunSettings:
    """The settings the shared flags describe (unset ones stay None: the dialect fills them in). `flags` may hold
    a command's other values too: only the run settings' names are read."""
    from nanbeige.agent.run.usage import parse_budgets

    f = {**UNSET, **flags}
    try:
        budgets = parse_budgets(f["budget"] or [])
    except ValueError as exc:
        fail(str(exc), 2)  # a bad value, as setup's own checks report one
    if f["replay"] and f["cache"] is None:  # before a command makes anything (an eval's out folder)
        fail("--replay needs --cache PATH: the cache file to answer tool calls from", 2)
    urls = [f["base_url"]] if isinstance(f["base_url"], str) else list(f["base_url"] or [])
    return RunSettings(
        llm=LLMConfig(
            **endpoints(urls, LLMConfig.base_url),
            model=f["model"],
            api_key=f["api_key"],
            temperature=f["temperature"],
            top_p=f["top_p"],
            repetition_penalty=f["repetition_penalty"],
            max_tokens=f["max_tokens"],
            timeout_s=LLMConfig.timeout_s if f["request_timeout"] is None else f["request_timeout"],
        ),
        agent=AgentConfig(
            dialect=f["dialect"],
            max_turns=f["max_turns"],
            keep_tool_results=f["keep_tool_results"],
            max_context=f["max_context"],
            timeout_s=f["timeout"],
            summary_turn=f["summary_turn"],
            rollback=f["rollback"],
            budgets=budgets,
        ),
        backend=BackendConfig(
            backend=f["backend"],
            base_url_given=bool(urls),
            gguf_file=f["gguf_file"],
            token_mode=f["token_mode"],
            chat_template=f["chat_template"],
            tokenizer=f["tokenizer"],
            verbose=f["verbose"],
            route=f["route"],
        ),
        tools=ToolsConfig(
            mcp=f["mcp"] or [],
            default_servers=not f["no_default_servers"],
            tool_timeout_s=f["tool_timeout"],
            max_result_chars=f["max_result_chars"],
            upload_dirs=f["upload_dirs"] or [],
            cache=f["cache"],
            replay=f["replay"],
        ),
        trajectory=f["trajectory"],
        system_prompt_file=f["system_prompt_file"],
        reference=f["reference"],
    )
