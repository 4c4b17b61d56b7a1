"""The one data type: a Trajectory of Turns, with the ToolCalls and ToolResults in them.

Every part of the runtime passes these dataclasses around: the loop fills them, the dialects and the
context manager read and write turns, the trainer and the judges read whole trajectories.
`trajectory_file.py` holds their JSONL file format: the records, the writer and the reader.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

FORMAT_VERSION = 1

StopReason = Literal[
    "answered",
    "max_turns",
    "context_limit",
    "format_errors",
    "model_error",
    "interrupted",
    "timeout",
    "crashed",
    "budget",
    "replay_miss",
    "write_error",
]

NOT_ENDED_ON_ITS_OWN = ("interrupted", "crashed", "model_error", "replay_miss", "write_error")
"""Stop reasons of runs cut short from outside (a signal, a bug, the model server, a replay that found
no recorded tool result, a full disk): such a run says nothing about the question, and `collect` runs it
again."""


@dataclass
class ToolCall:
    """One tool call the model asked for."""

    server: str
    """MCP server name, as offered to the model."""
    name: str
    """Tool name on that server."""
    arguments: dict[str, Any]
    """Arguments after JSON repair."""
    id: str | None = None
    """Call id, when the dialect has one (OpenAI function calling)."""


@dataclass
class ToolResult:
    """What one tool call returned, as the model read it."""

    text: str
    """Result text (after truncation)."""
    is_error: bool = False
    """True when the tool failed; the model is told so."""
    latency_s: float = 0.0
    """Wall time of the call."""
    truncated: bool = False
    """True when the text was cut to the result size limit."""
    usage: dict[str, float] | None = None
    """What the call cost in paid units (`serper_queries`, `jina_tokens`, ...), as the server reported."""
    cached: bool = False
    """True when the result was served from the tool-result cache (`--cache`, `--replay`) instead of the tool."""


@dataclass
class Turn:
    """One model call and the tool calls it led to."""

    index: int
    """0-based position in the trajectory."""
    assistant: dict[str, Any]
    """The assistant message exactly as produced: `content` (with any `<think>` text), and
    `tool_calls` / `reasoning` when the server returned them."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Parsed tool calls, in the order they were made."""
    tool_results: list[ToolResult] = field(default_factory=list)
    """One result per tool call, same order."""
    format_error: str | None = None
    """Message sent back to the model when its reply could not be used (malformed call, cut-off
    reply, repetition); None when the reply was fine."""
    instruction: str | None = None
    """A user message the runtime added before this model call (the final-answer request)."""
    rolled_back: bool = False
    """True when the reply was unusable (a malformed call, a refusal, cut off, looping or empty) and
    was dropped: the next prompt did not contain it and the model sampled again. `format_error` says
    why. Kept for the trainer to mask or penalise."""
    consumed: bool = False
    """A rolled-back reply that still used up its turn: the last of the reference client's tries at
    a reply cut off or looping (it gives up and the loop moves on to the next turn)."""
    omitted_latest_results: bool = False
    """On the final-answer turn: True when the newest tool results were left out of its prompt to
    leave room for the answer (the model did not read them)."""
    finish_reason: str | None = None
    """The server's finish reason (`stop`, `length`, ...)."""
    usage: dict[str, int] = field(default_factory=dict)
    """Token counts from the server: `prompt_tokens`, `completion_tokens`."""
    latency_s: float = 0.0
    """Wall time of the model call."""
    endpoint: str | None = None
    """The endpoint of a pool of model servers that sampled this reply (`pool.py`); None without a pool."""
    segment: int | None = None
    """Token segment id: a new segment starts whenever the prompt stops extending the previous one."""
    prompt_keep: int | None = None
    """How many leading tokens of the previous turn's prompt + completion this prompt reuses (all
    of them within a segment; fewer after context management rewrote the history)."""
    prompt_delta_ids: list[int] | None = None
    """The prompt's token ids after those `prompt_keep` tokens."""
    prefix_hash: str | None = None
    """SHA-256 of the `prompt_keep` reused token ids (see `tokens.py`)."""
    completion_ids: list[int] | None = None
    """Sampled token ids, verbatim."""
    logprobs: list[float] | None = None
    """Sampling logprob of each completion token."""
    reward: float | None = None
    """Turn reward, set by a judge."""
    mask: int = 1
    """1 = trained on, 0 = excluded from training."""
    critic: dict[str, Any] | None = None
    """Critic scores for this turn, set by a judge."""


@dataclass
class Trajectory:
    """One run of the agent on one question."""

    question: str
    """The question as the user asked it."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Unique id of this trajectory."""
    group_id: str | None = None
    """Id shared by rollouts of the same question (the question's id)."""
    rollout_index: int | None = None
    """Which of the question's G rollouts this is (0..G-1), for `collect`."""
    policy_version: str | None = None
    """The version of the weights that sampled it (`--policy-version`, or what the server reports)."""
    reference_answer: str | None = None
    """The question's gold answer, when known: what the outcome reward is graded against."""
    grader: str | None = None
    """The grader the question's benchmark uses (`gaia-exact`, a judge profile), when known."""
    system_prompt: str = ""
    """The system prompt the model saw."""
    user_message: str = ""
    """The first user message (the question plus the dialect's answer-format sentence)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tool schemas offered: `server`, `name`, `description`, `input_schema`."""
    model: str = ""
    """Model name as given (`--model`), sent to the backend (in this process `smollm2` is resolved where loaded)."""
    dialect: str = "mcp-xml"
    """Tool dialect: `mcp-xml` or `tool-call`."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling settings: temperature, top_p, max_tokens, stop."""
    limits: dict[str, Any] = field(default_factory=dict)
    """Loop limits (max_turns, keep_tool_results, max_context, ...) and the toolbox settings that
    shaped what the model read (max_result_chars, tool_timeout_s)."""
    reference: dict[str, Any] | None = None
    """The reference harness checkout the prompts were read from (`--reference`): `commit` and the
    `sha256` of every file read; None: our own texts."""
    tokenizer: dict[str, str] | None = None
    """Tokenizer identity, `name` and `sha256`, when the backend tokenizes (token mode, in-process)."""
    chat_template: dict[str, str] | None = None
    """Chat template identity, `name` and `sha256`, when the backend renders prompts itself."""
    turns: list[Turn] = field(default_factory=list)
    """The turns, in order."""
    answer: str | None = None
    """The final answer, or None."""
    stop_reason: StopReason | None = None
    """Why the run ended; None while it runs."""
    error: str | None = None
    """What went wrong, for `model_error` and `crashed`."""
    reward: float | None = None
    """Outcome reward, set by a judge."""
    judge: dict[str, Any] | None = None
    """Judge breakdown."""
    timings: dict[str, float] = field(default_factory=dict)
    """`wall_s`, `model_s`, `tool_s`."""
    usage: dict[str, float] = field(default_factory=dict)
    """What the run used: `model_calls`, `prompt_tokens`, `completion_tokens`, `tokens`, `tool_calls`, and
    the paid units its tools reported (`serper_queries`, `jina_tokens`, ...); see `agent/run/usage.py`."""
    started_at: float = field(default_factory=time.time)
    """Unix time the run began."""
    format_version: int = FORMAT_VERSION
    """Version of the file format."""

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None


def counted_turns(turns: list[Turn]) -> int:
    """The turns a run made, as every count shows them and as `max_turns` counts them: a rolled-back
    reply (dropped and sampled again) is no turn of its own."""
    return sum(not turn.rolled_back or turn.consumed for turn in turns)


def rolled_back_replies(turns: list[Turn]) -> int:
    return sum(turn.rolled_back for turn in turns)
