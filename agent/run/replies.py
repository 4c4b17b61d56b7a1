"""What a model reply is, read by the loop: usable or to be rolled back, an answer, or a problem to tell
the model about; and the answer a run ends with. Pure functions of turns, in the dialects' terms."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nanbeige.agent.run import dialects
from nanbeige.agent.run.context import degenerate, repeats_query
from nanbeige.agent.trajectory.trajectory import Turn

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference
    from nanbeige.agent.run.run_config import AgentConfig

# The reference (from 2025-12-28) lets a repeated query run once this many replies in a row were dropped.
DUPLICATE_ROLLBACKS = 4
# The reference's client tries a reply cut off at the token limit or looping this many times; then
# the turn is used up without a reply.
RESAMPLES = 10
# Rolled-back replies have no cap in a row (as in the reference v1.0), so a run also stops once it
# has sampled this many replies beyond max_turns (the reference's later bound on attempts).
EXTRA_ATTEMPTS = 200


def reply_answer(turn: Turn, config: AgentConfig) -> str | None:
    """The answer in a reply that ends the loop: with a summary turn to come, only a boxed answer
    counts until then."""
    content = turn.assistant["content"]
    return (
        (dialects.last_boxed(content) or None)
        if config.summary_turn
        else dialects.extract_answer(config.dialect, content)
    )


def final_answer(turn: Turn, dialect: str, summary: bool) -> str | None:
    """The answer in a reply to the final-answer request: a non-empty `\\boxed{}` (mcp-xml; anywhere
    in the reply for the summary turn, as the reference reads it, else after the reasoning), or the
    visible text of a finished reply without tool calls (tool-call)."""
    content = turn.assistant.get("content") or ""
    if dialect == "mcp-xml":
        return dialects.last_boxed(content if summary else dialects.visible_text(content)) or None
    if turn.finish_reason == "length" or turn.assistant.get("tool_calls") or "<tool_call>" in content:
        return None
    if echoes_note(dialects.visible_text(content)):
        return None
    return dialects.extract_answer(dialect, content) or None


def latest_boxed(turns: list[Turn]) -> str | None:
    """The newest non-empty `\\boxed{}` answer any reply of the run gave: the fallback when the
    summary turn gives none."""
    for turn in reversed(turns):
        answer = dialects.last_boxed(turn.assistant.get("content") or "")
        if answer:
            return answer
    return None


def unusable(
    turn: Turn, parsed: dialects.ParsedReply, reference: Reference | None = None, earlier: list[Turn] | None = None
) -> str | None:
    """Why a reply is rolled back, or None: the reference harness drops a reply with a malformed call
    or a refusal, and samples again (in its client) one cut off at the token limit or looping. With
    a reference that has no duplicate-query note (from 2025-12-28), a reply repeating an earlier
    query is dropped too, unless the last 4 replies were all dropped."""
    content = turn.assistant.get("content") or ""
    refusals = reference.refusals if reference is not None else dialects.REFUSALS
    if turn.finish_reason == "length":
        return "rolled back: the reply was cut off at the token limit"
    if degenerate(content):
        return "rolled back: the reply kept repeating the same text"
    if not turn.tool_calls and parsed.format_error:
        return f"rolled back: {parsed.format_error}"
    if not turn.tool_calls and any(phrase in content for phrase in refusals):
        return "rolled back: the reply refused the task"
    if (
        reference is not None
        and reference.duplicate_query is None
        and earlier is not None
        and rolled_back_in_a_row(earlier) < DUPLICATE_ROLLBACKS
        and repeats_query(earlier, turn.tool_calls)
    ):
        return "rolled back: the reply repeats a query already made"
    return None


def empty(turn: Turn) -> bool:
    """An empty reply (no text, no call): the reference v1.0 keeps it in the history and goes on to
    the next turn, its client having found no text to read."""
    return (
        not (turn.assistant.get("content") or "").strip()
        and not turn.tool_calls
        and not turn.assistant.get("reasoning")
    )


def rolled_back_in_a_row(turns: list[Turn]) -> int:
    """Replies rolled back in a row as the reference's orchestrator counts them: its client's own
    retries of a reply cut off or looping are not among them."""
    count = 0
    for turn in reversed(turns):
        if not turn.rolled_back:
            break
        count += not client_retry(turn)
    return count


def client_retry(turn: Turn) -> bool:
    """A reply the reference's client samples again by itself: cut off at the token limit, or looping."""
    return turn.finish_reason == "length" or degenerate(turn.assistant.get("content") or "")


def used_up(earlier: list[Turn], turn: Turn, tries: int) -> bool:
    """True when this dropped reply uses up its turn: the `tries`-th reply in a row cut off or looping
    (the reference's client gives up after that many, and the loop moves on to the next turn)."""
    if not client_retry(turn):
        return False
    count = 1
    for before in reversed(earlier):
        if not before.rolled_back or before.consumed or not client_retry(before):
            break
        count += 1
    return count >= tries


CUT_OFF_NOTE = (
    "Your reply was cut off at the token limit before it was finished. Think more briefly, then make your tool "
    "call or give your final answer."
)
LOOPING_NOTE = "Your reply kept repeating the same text. Stop repeating, and continue with a new step."
EMPTY_NOTE = "Your reply had no answer and no tool call. Continue: make a tool call or give your final answer."
ECHO_NOTE = "Your reply repeated the note it was sent instead of answering. Make a tool call or give your final answer."
NOTES = (CUT_OFF_NOTE, LOOPING_NOTE, EMPTY_NOTE, ECHO_NOTE)
"""What the loop tells the model of a reply that is no answer (with rollback off)."""


def echoes_note(text: str) -> bool:
    """The reply repeats one of the loop's own notes (a small model may send it back as its answer): it holds
    a note's first sentence, however spaced or cased. A note is never an answer."""
    said = " ".join(text.split()).casefold()
    return any(note.split(". ")[0].casefold() in said for note in NOTES)


def reply_problem(turn: Turn, parsed: dialects.ParsedReply, dialect: str) -> str | None:
    """Why a reply without tool calls is not an answer either: cut off, looping, empty, the loop's own note
    sent back, or (mcp-xml) without a `\\boxed{}` answer."""
    if parsed.tool_calls:
        return None
    content = turn.assistant.get("content") or ""
    if turn.finish_reason == "length":
        return CUT_OFF_NOTE
    if degenerate(content):
        return LOOPING_NOTE
    if not dialects.visible_text(content).strip():
        return EMPTY_NOTE
    if echoes_note(dialects.visible_text(content)):
        return ECHO_NOTE
    return dialects.mcp_xml_answer_problem(content) if dialect == "mcp-xml" else None


def format_errors_in_a_row(turns: list[Turn]) -> int:
    count = 0
    for turn in reversed(turns):
        if turn.format_error is None:
            break
        count += 1
    return count


def tools_unseen(turn: Turn, request_tools: list[dict[str, Any]] | None, model: str, served: bool) -> str | None:
    """What to tell the user when the chat template left out the tools sent with the request (a template
    without a tools slot renders the messages alone, and a server says nothing): the prompt is shorter
    than the tools' schemas alone could be. A JSON schema takes a token per 3-5 characters; one per 8 is a
    margin no template that shows them gets under. The small model run here is expected to see none: it
    is there to show that everything runs, and it is far too small to use tools in either dialect."""
    from nanbeige.agent.backends.local_model import SMALL_MODEL

    prompt_tokens = turn.usage.get("prompt_tokens")
    if not request_tools or not isinstance(prompt_tokens, int) or prompt_tokens * 8 >= len(json.dumps(request_tools)):
        return None
    if model == SMALL_MODEL and not served:
        return (
            f"note: {SMALL_MODEL} (SmolLM2-135M-Instruct) is too small to use tools: its chat template leaves out "
            f"the {len(request_tools)} tools, so it answers from what it knows. That is expected: it shows that "
            "everything runs; deep search needs Nanbeige4.1-3B"
        )
    whose = "the server's chat template" if served else f"the chat template of {model}"
    fix = (
        "serve the model with a chat template that takes tools"
        if served
        else "pass --chat-template with a template that shows them"
    )
    return (
        f"warning: {whose} left out the {len(request_tools)} tools sent with the request (the prompt was "
        f"{prompt_tokens} tokens), so the model cannot see them; use --dialect mcp-xml, which describes them in "
        f"the system prompt, or {fix}"
    )
