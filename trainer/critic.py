"""The turn critic: an LLM scores each turn of a trajectory, and a rule turns the scores into the
turn's reward and mask.

The critic is any OpenAI-compatible chat endpoint. For one turn it reads the question, a one-line
view of each earlier turn, this turn's reasoning, its tool calls and what they returned, and it
scores three dimensions from 1 to 5:

- `logical_soundness`: does the reasoning follow from what the agent knew at that point?
- `tool_call_accuracy`: is the call the right next step, with well-formed, specific arguments?
- `information_gain`: did the result bring something new and useful toward the answer?

A turn without a tool call (the answer or summary turn) is scored on logical soundness alone; the
other two are recorded as null and count as passing. A reply that is not such a JSON object (or
has a score outside 1-5) is asked again; a turn the critic never scores is recorded as unjudged
(`critic = {"error": ..., "model": ...}`, reward None, mask unchanged), never given a made-up score.
`TurnRule` and `turn_outcome` say what a passing or failing turn gets.

`--critic-template FILE` replaces the prompt verbatim; only the placeholders `{question}`,
`{earlier_turns}`, `{reasoning}`, `{tool_calls}` and `{tool_results}` are filled (in one pass, so
other braces in the file stay as they are).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import json_repair

from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.evals.endpoint import CallFailed, chat_text
from nanbeige.tools.endpoint import OPENAI_BASE_URL, ChatEndpoint
from nanbeige.tools.errors import ServiceUnavailable

DIMENSIONS = ("logical_soundness", "tool_call_accuracy", "information_gain")
TOOL_DIMENSIONS = ("tool_call_accuracy", "information_gain")
# Sizes of what the critic reads: enough to judge a step, small enough that a long run's turns fit.
REASONING_CHARS = 6000
RESULT_CHARS = 3000
REPLY_CHARS = 2000
EARLIER_TURNS = 40
EXCERPT_CHARS = 120

CRITIC_TEMPLATE = """\
You are reviewing a single step taken by an AI research agent. The agent answers a question by \
thinking, calling tools (web search, reading pages, running code) and reading what they return.

Rate the step below on three dimensions, each with an integer from 1 (very poor) to 5 (excellent):

- logical_soundness: the reasoning follows from what the agent knew at this point; no contradictions, \
unsupported leaps or invented facts. For a step that gives the answer: the answer is backed by what was found.
- tool_call_accuracy: the call is a sensible next step, to a fitting tool, with well-formed and specific \
arguments that can get what is needed.
- information_gain: what the call returned adds new, relevant information toward the answer, rather than \
repeating earlier findings, failing or coming back empty.

When the step makes no tool call, rate logical_soundness only and give null for the other two.

# Question
{question}

# Earlier steps (one line each)
{earlier_turns}

# This step's reasoning
{reasoning}

# This step's tool calls
{tool_calls}

# What the tools returned
{tool_results}

Answer with one JSON object and nothing else, shaped like this (each score an integer from 1 to 5):
{"logical_soundness": {"score": <score>, "reason": "<one short sentence>"}, \
"tool_call_accuracy": {"score": <score or null>, "reason": "<one short sentence>"}, \
"information_gain": {"score": <score or null>, "reason": "<one short sentence>"}}
"""

_PLACEHOLDER = re.compile(r"\{(question|earlier_turns|reasoning|tool_calls|tool_results)\}")


CRITIC_ENDPOINT = ChatEndpoint(
    base_url=OPENAI_BASE_URL,
    model="gpt-4.1-2025-04-14",
    temperature=0.0,
    max_tokens=1024,
    timeout_s=120.0,
    retries=2,
    retry_wait_s=1.0,
)
"""The critic's defaults (`--critic-*`, NANBEIGE_CRITIC_*): GPT-4.1 on OpenAI's API, recorded in every turn it
scores; temperature 0 for repeatable scores; 1024 tokens a reply (a thinking critic needs more); a malformed
reply is asked again too."""


@dataclass
class TurnRule:
    """What a turn's critic scores mean for training."""

    min_logical_soundness: int = 3
    """A turn passes logical soundness with at least this score (1-5)."""
    min_tool_call_accuracy: int = 3
    """A turn with a tool call passes tool-call accuracy with at least this score."""
    min_information_gain: int = 3
    """A turn with a tool call passes information gain with at least this score."""
    failed: Literal["mask", "penalise"] = "mask"
    """What a failed (or rolled-back) turn gets: `mask` sets its mask to 0, so it is not trained on (its
    reward is None); `penalise` keeps mask 1 and gives it reward `-penalty`."""
    penalty: float = 1.0
    """The size of the negative reward a failed turn gets under `penalise`."""


class CriticUnavailable(ServiceUnavailable):
    """The critic endpoint cannot be used at all (unreachable, or it refuses the key or the path):
    something the user must fix, not a verdict on a turn."""


class MalformedCritique(ValueError):
    """The critic's reply holds no usable scores."""


def excerpt(value: Any, limit: int) -> str:
    """A value on one line, cut to `limit` characters: what the critic reads of an earlier turn."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def turn_outcome(scores: dict[str, int | None], rule: TurnRule) -> tuple[float | None, int, bool]:
    """A judged turn's (reward, mask, passed) from its scores (dimension -> 1..5, or None when not
    scored, as the tool dimensions of a turn without a tool call: those count as passing).

    A turn passes when every scored dimension reaches its threshold; its reward is then the mean of
    its scored dimensions mapped to [0, 1] by (score - 1) / 4, with mask 1. A failed turn gets
    (None, 0) under the `mask` rule and (-penalty, 1) under `penalise`."""
    thresholds = {
        "logical_soundness": rule.min_logical_soundness,
        "tool_call_accuracy": rule.min_tool_call_accuracy,
        "information_gain": rule.min_information_gain,
    }
    scored = {name: score for name, score in scores.items() if score is not None}
    passed = all(score >= thresholds[name] for name, score in scored.items())
    if passed:
        return sum((score - 1) / 4 for score in scored.values()) / len(scored), 1, True
    return (*failed_outcome(rule), False)


def failed_outcome(rule: TurnRule) -> tuple[float | None, int]:
    """(reward, mask) of a turn that fails the rule, or was rolled back."""
    return (None, 0) if rule.failed == "mask" else (-rule.penalty, 1)


# ---------------------------------------------------------------- the prompt


def trim(text: str, limit: int) -> str:
    """The text cut to about `limit` characters, keeping its start and its end (where a conclusion is)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]} … [{len(text) - limit} characters cut] … {text[len(text) - (limit - head) :]}"


def reasoning_of(turn: Turn) -> str:
    """The turn's reasoning: what a server split off, else the `<think>` part of the content."""
    split = turn.assistant.get("reasoning") or turn.assistant.get("reasoning_content")
    if split:
        return split.strip()
    content = turn.assistant.get("content") or ""
    if "</think>" in content:
        thought = content.rsplit("</think>", 1)[0]
    else:
        thought = content if "<think>" in content else ""  # never closed: all of it is reasoning
    return thought.replace("<think>", "").strip()


def reply_of(turn: Turn) -> str:
    """The turn's reply after its reasoning."""
    content = turn.assistant.get("content") or ""
    if "</think>" in content:
        return content.rsplit("</think>", 1)[1].strip()
    return "" if "<think>" in content else content.strip()


def earlier_line(turn: Turn) -> str:
    """One line for an earlier turn: each call and an excerpt of its result, or how the turn ended."""
    if not turn.tool_calls:
        return f"step {turn.index + 1}: " + ("unusable reply" if turn.format_error else "answered")
    parts = []
    for call, result in zip(turn.tool_calls, turn.tool_results):
        mark = " (error)" if result.is_error else ""
        parts.append(
            f"{call.server}/{call.name} {excerpt(call.arguments, EXCERPT_CHARS)} -> "
            f"{excerpt(result.text, EXCERPT_CHARS)}{mark}"
        )
    return f"step {turn.index + 1}: " + "; ".join(parts)


def earlier_turns(trajectory: Trajectory, turn: Turn) -> str:
    # Rolled-back replies never reached the model's context, so the critic does not see them either.
    lines = [earlier_line(t) for t in trajectory.turns[: turn.index] if not t.rolled_back]
    if len(lines) > EARLIER_TURNS:
        lines = [f"({len(lines) - EARLIER_TURNS} earlier steps not shown)"] + lines[-EARLIER_TURNS:]
    return "\n".join(lines) or "(none: this is the first step)"


def calls_text(turn: Turn) -> str:
    if not turn.tool_calls:
        asked = " (the runtime had asked for the final answer)" if turn.instruction else ""
        problem = f"\nThe runtime could not use this reply: {turn.format_error}" if turn.format_error else ""
        return f"No tool call{asked}. The reply reads:\n{trim(reply_of(turn), REPLY_CHARS)}{problem}"
    return "\n".join(
        f"{n}. server {call.server}, tool {call.name}, arguments {json.dumps(call.arguments, ensure_ascii=False)}"
        for n, call in enumerate(turn.tool_calls, start=1)
    )


def results_text(turn: Turn) -> str:
    if not turn.tool_calls:
        return "(no tool was called)"
    lines = []
    for n, result in enumerate(turn.tool_results, start=1):
        mark = " (the tool reported an error)" if result.is_error else ""
        lines.append(f"{n}.{mark}\n{trim(result.text, RESULT_CHARS)}")
    return "\n\n".join(lines) or "(no result was recorded)"


def critic_prompt(trajectory: Trajectory, turn: Turn, template: str = CRITIC_TEMPLATE) -> str:
    """The critic's prompt for one turn: the template with its five placeholders filled in one pass."""
    values = {
        "question": trajectory.question,
        "earlier_turns": earlier_turns(trajectory, turn),
        "reasoning": trim(reasoning_of(turn), REASONING_CHARS) or "(no reasoning shown)",
        "tool_calls": calls_text(turn),
        "tool_results": results_text(turn),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def load_template(config: ChatEndpoint) -> str:
    """The prompt template: the user's file verbatim (UTF-8), or the built-in one."""
    return CRITIC_TEMPLATE if config.template is None else config.template.read_text(encoding="utf-8")


# ---------------------------------------------------------------- the reply


def _score(value: Any, name: str) -> dict[str, Any]:
    score, reason = (value.get("score"), value.get("reason")) if isinstance(value, dict) else (value, "")
    if isinstance(score, str) and score.strip().isdigit():
        score = int(score)
    if isinstance(score, float) and score.is_integer():
        score = int(score)
    if isinstance(score, bool) or not isinstance(score, int) or not 1 <= score <= 5:
        raise MalformedCritique(f"{name}: {score!r} is not an integer from 1 to 5")
    return {"score": score, "reason": str(reason or "")[:500]}


def parse_scores(text: str, tool_turn: bool) -> dict[str, dict[str, Any] | None]:
    """The scores in a critic reply: the JSON object in it (code fences, text around it and a leading
    `<think>` part are tolerated; broken JSON is repaired). Dimensions a turn without a tool call is
    not scored on are None. Raises `MalformedCritique` when a needed score is missing or outside 1-5."""
    text = text.rsplit("</think>", 1)[-1]
    start, end = text.find("{"), text.rfind("}")
    if start < 0:
        raise MalformedCritique(f"no JSON object in the reply: {text[:80]!r}")
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        data = json_repair.loads(text[start:])
    if not isinstance(data, dict):
        raise MalformedCritique(f"no JSON object in the reply: {text[:80]!r}")
    return {
        name: _score(data.get(name), name) if tool_turn or name not in TOOL_DIMENSIONS else None for name in DIMENSIONS
    }


# ---------------------------------------------------------------- asking


def _unreachable(exc: CallFailed) -> bool:
    """A failure that would fail every turn alike, which the user must fix: no connection, a refused
    key, a wrong path. Time-outs and server errors are retried, then leave the one turn unjudged."""
    return (exc.unavailable and not exc.timed_out and exc.status is None) or exc.status in (401, 403, 404)


async def critique(
    trajectory: Trajectory, turn: Turn, config: ChatEndpoint, template: str, client: httpx.AsyncClient
) -> dict[str, Any]:
    """The critic's record for one turn: `model` and each dimension's `{score, reason}` (None where not
    scored); or `{"error", "model"}` when no usable reply came after the retries. Raises
    `CriticUnavailable` when the endpoint cannot be used at all."""
    prompt = critic_prompt(trajectory, turn, template)
    error = ""
    for attempt in range(config.retries + 1):
        if attempt:
            await asyncio.sleep(config.retry_wait_s * 2 ** (attempt - 1))
        try:
            reply = await chat_text(client, config, [{"role": "user", "content": prompt}])
            scores = parse_scores(reply, tool_turn=bool(turn.tool_calls))
        except CallFailed as exc:
            error = f"critic answered {exc}" if exc.status else f"critic {exc}"
            if _unreachable(exc) and (not exc.retry or attempt == config.retries):
                raise CriticUnavailable(error) from None
            if not exc.retry:
                break
            continue
        except MalformedCritique as exc:
            error = f"malformed critique: {exc}"
            continue
        return {"model": config.model, **scores}
    return {"error": error, "model": config.model}


async def judge_turn(
    trajectory: Trajectory, turn: Turn, config: ChatEndpoint, rule: TurnRule, template: str, client: httpx.AsyncClient
) -> None:
    """Set the turn's `critic`, `reward` and `mask`. A rolled-back turn is not sent to the critic: it
    gets what a failed turn gets. An unjudged turn gets reward None and keeps its mask."""
    if turn.rolled_back:
        turn.critic = {"rolled_back": True}
        turn.reward, turn.mask = failed_outcome(rule)
        return
    record = await critique(trajectory, turn, config, template, client)
    if "error" in record:
        turn.critic, turn.reward = record, None
        return
    scores = {name: record[name]["score"] if record[name] else None for name in DIMENSIONS}
    turn.reward, turn.mask, passed = turn_outcome(scores, rule)
    turn.critic = {**record, "passed": passed}
