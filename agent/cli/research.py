"""Research runs: `ask` pushed to its limits, with restart-with-summary attempts.

A research run makes up to `attempts` attempts at one question, each an ordinary run of the loop
and its own trajectory in the same file, all sharing one `group_id` (the first attempt's id). An
attempt that ends with an answer (stop reason `answered`) ends the research. One that ends
without (the turn limit, the context limit, unusable replies in a row, a model error) is summarised
by the model in one call without tools: it reads a transcript of the attempt and writes notes for
the next one (what was established, the sources, what remains). The next attempt's question is the
original question followed by the notes of every failed attempt so far, as the reference harness
restarts a run that ran out of room.

The summary call gets a fresh prompt (the question and a transcript of the attempt, newest steps
first to go in, cut to fit the context) rather than the attempt's own history: an attempt that hit
the context limit leaves no room in its own history for anything more. The call is written to the
trajectory file as an `attempt_summary` record that links the attempts: `trajectory_id` names the
failed attempt, `next_trajectory_id` the one that starts from its notes (loaders of trajectories skip
the record).

`timeout_s` bounds the whole research, not each attempt: each attempt gets the time left, and when
it runs out (stop reason `timeout`) no further attempt starts. Budgets (`--budget`) likewise span all
attempts: each gets what earlier ones left, and an attempt that used one up (`budget`) is the last.
A guess the final-answer turn made at a limit does not end the research while attempts remain; the
last attempt's answer, guess or not, is the research's answer (else the newest answer an earlier
attempt gave).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nanbeige.agent.backends.llm import LLM, ModelError
from nanbeige.agent.run import dialects
from nanbeige.agent.run.context import estimate_tokens
from nanbeige.agent.run.loop import DEFAULT_MAX_CONTEXT, AgentConfig, Event, run
from nanbeige.agent.run.usage import total
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter

if TYPE_CHECKING:
    from nanbeige.agent.toolbox.toolbox import Toolbox

MAX_TURNS = 600  # the research default in both dialects: the reference harness's long-horizon setting
ATTEMPTS = 3
SUMMARY_REPLY_TOKENS = 8192  # room for the summary reply (a thinking model reasons first)
STEP_CHARS = {"thought": 600, "reply": 1000, "result": 1500}  # how much of each part of a step the transcript shows
STOP_WORDS = {
    "max_turns": "it reached the turn limit",
    "context_limit": "its context was full",
    "format_errors": "too many replies in a row could not be used",
    "model_error": "the model failed",
    "answered": "it ended without a usable answer",
}


@dataclass
class Research:
    """What a research run did: its attempts in order, the notes that linked them, and its answer."""

    question: str
    """The question as the user asked it (the attempts' questions also carry the notes)."""
    attempts: list[Trajectory] = field(default_factory=list)
    """Each attempt's trajectory, in order."""
    summaries: list[str] = field(default_factory=list)
    """The notes written after each failed attempt that was followed by another."""

    @property
    def answer(self) -> str | None:
        """The last attempt's answer, else the newest one an earlier attempt gave."""
        return next((t.answer for t in reversed(self.attempts) if t.answer is not None), None)


def answered(trajectory: Trajectory) -> bool:
    """True when the attempt ended with an answer of its own, not a guess forced at a limit."""
    return trajectory.stop_reason == "answered" and trajectory.answer is not None


async def research(
    question: str,
    llm: LLM,
    toolbox: Toolbox | None,
    config: AgentConfig,
    writer: TrajectoryWriter,
    attempts: int = ATTEMPTS,
    on_event: Callable[[int], Event] | None = None,
    notice: Callable[[str], None] = lambda text: None,
) -> Research:
    """Attempt the question up to `attempts` times (see the module's docstring). `on_event(n)` gives the
    event handler of attempt n (1-based); `notice` is told when an attempt is summarised."""
    result = Research(question)
    group_id = next_id = uuid.uuid4().hex[:12]  # the first attempt's id is the research's
    deadline = None if config.timeout_s is None else time.monotonic() + config.timeout_s
    while True:
        number = len(result.attempts) + 1
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0 and result.attempts:
            return result
        used = total(t.usage for t in result.attempts)
        budgets = {unit: limit - used.get(unit, 0) for unit, limit in config.budgets.items()}
        attempt_config = dataclasses.replace(config, timeout_s=left, budgets=budgets)
        trajectory = await run(
            attempt_question(question, result.summaries),
            llm,
            toolbox,
            attempt_config,
            writer,
            on_event(number) if on_event else _no_event,
            group_id=group_id,
            header={"id": next_id},
        )
        result.attempts.append(trajectory)
        if answered(trajectory) or number >= attempts or trajectory.stop_reason in ("timeout", "budget"):
            return result
        notice(f"attempt {number} of {attempts}: no answer ({trajectory.stop_reason}); summarising it for the next")
        next_id = uuid.uuid4().hex[:12]
        try:
            async with asyncio.timeout(None if deadline is None else deadline - time.monotonic()):
                summary = await summarise(llm, question, trajectory, config, writer, next_id)
        except TimeoutError:
            return result  # the research's time is up: no attempt could start
        except ModelError as exc:
            summary = None
            notice(f"summary failed: {exc}; the next attempt starts without it")
        if summary:
            result.summaries.append(summary)


def _no_event(kind: str, data: Any) -> None:
    pass


def attempt_question(question: str, summaries: list[str]) -> str:
    """The question an attempt gets: the original, then the notes of every earlier attempt."""
    if not summaries:
        return question
    notes = "\n\n".join(f"[Attempt {n}]\n{summary}" for n, summary in enumerate(summaries, start=1))
    return (
        f"{question}\n\n"
        "=== Notes from earlier attempts at this question, which ended without an answer ===\n"
        f"{notes}\n"
        "=== End of notes ===\n"
        "Build on these notes: reuse what they established, do not repeat searches that led nowhere, and "
        "take a different route where the earlier attempts got stuck."
    )


def summary_prompt(question: str, reason: str, transcript: str) -> str:
    """The request for notes on a failed attempt (our wording; the reference harness asks for a
    failure type, what happened and useful findings)."""
    return (
        f"You worked on the question below, but the attempt ended before you gave a final answer: {reason}. "
        "A new attempt will start from scratch and will know only what you write now. Write notes for it.\n\n"
        f'The question: "{question}"\n\n'
        f"What the attempt did, step by step:\n{transcript}\n\n"
        "Write three short sections and nothing else. Do not call any tool and do not give a final answer.\n"
        "Established: the facts the attempt confirmed, each with the URL of the page that supports it.\n"
        "Sources: the pages worth reading again, and the searches or pages that were dead ends.\n"
        "Remaining: what is still unknown or unverified, and what to try next (searches, pages, another approach)."
    )


async def summarise(
    llm: LLM,
    question: str,
    trajectory: Trajectory,
    config: AgentConfig,
    writer: TrajectoryWriter | None,
    next_id: str | None = None,
) -> str | None:
    """The model's notes on a failed attempt (the visible text of its reply), or None when it wrote
    none. One call without tools, written to the trajectory file as an `attempt_summary` record (with
    the model's error, then raised again, when the call failed)."""
    max_context = config.max_context or DEFAULT_MAX_CONTEXT
    reply_tokens = min(llm.config.max_tokens, SUMMARY_REPLY_TOKENS, max_context // 2)
    budget = max_context - reply_tokens - config.context_reserve - estimate_tokens(summary_prompt(question, "", ""))
    reason = STOP_WORDS.get(trajectory.stop_reason or "", str(trajectory.stop_reason))
    prompt = summary_prompt(question, reason, transcript(trajectory.turns, budget))
    record = {
        "type": "attempt_summary",
        "trajectory_id": trajectory.id,
        "next_trajectory_id": next_id,
        "instruction": prompt,
    }
    try:
        completion = await llm.complete(
            [{"role": "user", "content": prompt}], None, max_tokens=reply_tokens, conversation=llm.new_conversation()
        )
    except ModelError as exc:
        if writer:
            writer.write(record | {"summary": None, "error": str(exc)})
        raise
    summary = dialects.visible_text(completion.message.get("content") or "").strip() or None
    if writer:
        writer.write(
            record
            | {
                "summary": summary,
                "assistant": completion.message,
                "error": None,
                "finish_reason": completion.finish_reason,
                "usage": completion.usage,
                "latency_s": completion.latency_s,
            }
        )
    return summary


def transcript(turns: list[Turn], budget_tokens: int) -> str:
    """The attempt's steps as plain text, the newest that fit in `budget_tokens`; rolled-back
    replies are left out (the model never built on them)."""
    steps = [_step(n, turn) for n, turn in enumerate((t for t in turns if not t.rolled_back), start=1)]
    kept: list[str] = []
    used = 0
    for step in reversed(steps):
        used += estimate_tokens(step)
        if used > budget_tokens:
            break
        kept.append(step)
    dropped = len(steps) - len(kept)
    head = [f"({dropped} earlier step{'s' * (dropped != 1)} left out for room)"] if dropped else []
    return "\n\n".join(head + kept[::-1]) or "(no steps)"


def _step(number: int, turn: Turn) -> str:
    content = turn.assistant.get("content") or ""
    thought = turn.assistant.get("reasoning") or content.rpartition("</think>")[0].replace("<think>", "")
    lines = [f"Step {number}:"]
    if thought.strip():
        lines.append(f"Thinking (its end): {_tail(thought.strip(), STEP_CHARS['thought'])}")
    for call, result in zip(turn.tool_calls, turn.tool_results):
        lines.append(f"Tool call: {call.server} / {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
        lines.append(f"{'Error' if result.is_error else 'Result'}: {_head(result.text, STEP_CHARS['result'])}")
    visible = dialects.visible_text(content).strip()
    if not turn.tool_calls and visible:
        lines.append(f"Reply: {_head(visible, STEP_CHARS['reply'])}")
    if turn.format_error:
        lines.append(f"The reply could not be used: {turn.format_error}")
    return "\n".join(lines)


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "… " + text[-limit:]
