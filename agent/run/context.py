"""Context management: what the model sees, how many tokens that is, and when to stop asking.

- Keep-K: only the last K tool results are shown; older ones are replaced by a short placeholder
  in the request (the trajectory keeps everything). The message list is updated in place, so a
  turn costs the same at turn 600 as at turn 1.
- Token budget: the next prompt's size is the server's last usage figures plus an estimate for
  what was added since; when the next call could overflow, the loop asks for the answer instead.
- Repetition guard: a reply that loops on the same text, or the same tool call made again and
  again, is answered with a message instead of being run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nanbeige.agent.run.dialects import OMITTED
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Turn

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference

MESSAGE_OVERHEAD_TOKENS = 8  # role markers and separators the chat template adds per message


def estimate_tokens(text: str) -> int:
    """A deliberately high token estimate for text not yet counted by the server: one token per
    3 bytes of UTF-8 (English runs ~4 characters a token, CJK ~1 character = 3 bytes)."""
    return len(text.encode("utf-8", "replace")) // 3 + MESSAGE_OVERHEAD_TOKENS


def _message_tokens(message: dict[str, Any]) -> int:
    extra = json.dumps(message["tool_calls"]) if message.get("tool_calls") else ""
    return estimate_tokens((message.get("content") or "") + (message.get("reasoning_content") or "") + extra)


class History:
    """The messages sent to the model, kept current turn by turn with O(1) work per turn."""

    def __init__(self, system_prompt: str, user_message: str, keep_tool_results: int = 5):
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": user_message},
        ]
        self.keep = keep_tool_results
        self.observations: list[list[int]] = []  # per turn with results: positions of its messages
        self.estimated_tokens = sum(_message_tokens(m) for m in self.messages)
        self.added_since_call = self.estimated_tokens  # estimate of what the server has not counted yet

    def add_turn(
        self, assistant: dict[str, Any], observations: list[dict[str, Any]], tool_results: bool = True
    ) -> None:
        """Append a turn. Only tool results count towards keep-K; messages about unusable replies
        (`tool_results=False`) are short and always shown."""
        self.messages.append(assistant)
        positions = []
        for message in observations:
            positions.append(len(self.messages))
            self.messages.append(message)
        added = sum(_message_tokens(m) for m in observations)
        self.estimated_tokens += _message_tokens(assistant) + added
        self.added_since_call = added
        if positions and tool_results:
            self.observations.append(positions)
        if self.keep >= 0 and len(self.observations) > self.keep:
            for position in self.observations[-self.keep - 1]:
                self._omit(position)

    def _omit(self, position: int) -> None:
        message = self.messages[position]
        if message["content"] != OMITTED:  # replace, never mutate: earlier requests may still hold it
            self.estimated_tokens -= _message_tokens(message) - estimate_tokens(OMITTED)
            self.messages[position] = {**message, "content": OMITTED}

    def omit_latest(self) -> list[dict[str, Any]]:
        """The messages with the newest tool results omitted too (for a last answer that must fit)."""
        return _omitted(self.messages, self.observations[-1:])

    def summary_view(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages for the summary turn: the reference counts its summary prompt as one of the K
        results it shows, so only the K-1 newest tool results among `messages` stay."""
        shown = [group for group in self.observations if group[-1] < len(messages)]
        hidden = shown[: max(0, len(shown) - max(self.keep - 1, 0))] if self.keep >= 0 else []
        return _omitted(messages, hidden) if hidden else messages

    def latest_tool_result_tokens(self) -> int:
        return sum(_message_tokens(self.messages[i]) for i in self.observations[-1]) if self.observations else 0

    def next_prompt_tokens(self, last: Turn | None) -> int:
        """Estimated prompt size of the next call: the server's count for the last call plus its
        completion, plus an estimate of the messages added since (after a rolled-back reply, the server's
        count for the call it answered); a full estimate without usage."""
        if last is None or "prompt_tokens" not in last.usage:
            return self.estimated_tokens
        if last.rolled_back:  # the reply was dropped and nothing added: the same prompt goes again
            return last.usage["prompt_tokens"]
        completion = last.usage.get("completion_tokens", _message_tokens(last.assistant))
        return last.usage["prompt_tokens"] + completion + self.added_since_call


def _omitted(messages: list[dict[str, Any]], groups: list[list[int]]) -> list[dict[str, Any]]:
    """A copy of the messages with those at the groups' positions replaced by the placeholder."""
    messages = list(messages)
    for position in (p for group in groups for p in group):
        messages[position] = {**messages[position], "content": OMITTED}
    return messages


def reference_margin(messages: list[dict[str, Any]], summary_tokens: int, after_a_turn: bool) -> int:
    """What the reference's context check adds to the next prompt and the reply: the newest tool
    result once more and the summary prompt (`summary_tokens` long) twice (it counts both with
    tiktoken, doubled; our estimate is already high), plus 1000."""
    newest = messages[-1]
    extra = estimate_tokens(newest["content"] or "") if newest["role"] == "user" and after_a_turn else 0
    return extra + 2 * summary_tokens + 1000


def step_back(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without their last turn: its tool result, then the reply that made the call."""
    for role in ("user", "assistant"):
        if len(messages) > 2 and messages[-1]["role"] == role:
            messages = messages[:-1]
    return messages


def release_unseen_results(turns: list[Turn], keep: int, placeholder: str) -> None:
    """Drop the text of the tool results that just left the model's view: they are on disk, and the
    model never reads them again. Earlier ones went the same way on earlier turns."""
    shown = 0
    for turn in reversed(turns) if keep >= 0 else ():
        if turn.tool_calls and not turn.rolled_back:  # as History counts the results it shows
            shown += 1
            if shown > keep:
                for result in turn.tool_results:
                    result.text = placeholder
                return


def degenerate(text: str, tail: int = 50, times: int = 5) -> bool:
    """True when a reply ends in a loop: its last `tail` characters occur more than `times` times."""
    if len(text) < tail * (times + 1):
        return False
    return text.count(text[-tail:]) > times


def used_query(turns: list[Turn], turn: Turn, position: int, tools: tuple[str, ...] = ("google_search",)) -> str | None:
    """The query of the turn's call at `position` when one of the `tools` already ran it in the run
    without failing, else None. The reference v1.0 answers such a call with a note naming the query
    instead of running it, and counts only queries that ran; it checks `google_search` (its `q`),
    and from 2025-12-02 `scrape_and_extract_info` (url and what to extract, joined by `_`)."""
    call = turn.tool_calls[position]
    key = query_key(call) if call.name in tools else None
    if key is None:
        return None
    query = "_".join(key[1:])
    if not query:  # an empty search is never a repeat there
        return None
    made = queries_made(turns) | queries_made([turn], upto=position)
    return query if key in made else None


def queries_made(turns: list[Turn], upto: int | None = None) -> set[tuple[str, ...] | None]:
    """The query keys of the turns' calls that ran (of each turn's first `upto` calls)."""
    return {query_key(c) for t in turns for c, r in zip(t.tool_calls[:upto], t.tool_results[:upto]) if ran(r)}


def ran(result: ToolResult) -> bool:
    """Whether a call counts as made for the repeated-query rules: the reference leaves out only
    calls its tool manager failed (our `Tool call to T on S failed. Error: ...`); a tool's own error
    answer counts."""
    return not (result.is_error and result.text.startswith("Tool call to "))


def duplicate_note(reference: Reference | None) -> str | None:
    """What a repeated query is answered with (`{query}`, `{tool}`); None where the reference's rule
    is to roll the reply back instead (`replies.unusable`)."""
    if reference is not None:
        return reference.duplicate_query
    return (
        "The query '{query}' was already searched in an earlier {tool} call. Search with a different query or keywords."
    )


def query_tools(reference: Reference | None) -> tuple[str, ...]:
    return reference.query_tools if reference is not None else ("google_search",)


def query_key(call: ToolCall) -> tuple[str, ...] | None:
    """What makes two calls the same query under the reference's later rule: a search's `q`, a page
    extraction's url and what to extract."""
    if call.name == "google_search" and isinstance(call.arguments.get("q"), str):
        return (call.name, call.arguments["q"])
    if call.name == "scrape_and_extract_info":
        return (call.name, str(call.arguments.get("url", "")), str(call.arguments.get("info_to_extract", "")))
    return None


def repeats_query(turns: list[Turn], calls: list[ToolCall]) -> bool:
    """True when one of these calls repeats a query that an earlier call made (and did not fail), or
    that an earlier call of the same reply makes: the rule of the reference from 2025-12-28, which
    checks each call as it runs it and rolls the reply back at a repeat."""
    seen = queries_made(turns)
    for call in calls:
        key = query_key(call)
        if key is not None and key in seen:
            return True
        seen.add(key)
    return False


def repeated_call(turns: list[Turn], call: ToolCall, limit: int) -> bool:
    """True when the same call (server, tool, arguments) was made in each of the last `limit - 1`
    turns, so making it again would be the `limit`-th time in a row."""
    if limit <= 1 or len(turns) < limit - 1:
        return False
    key = (call.server, call.name, json.dumps(call.arguments, sort_keys=True))
    for turn in turns[-(limit - 1) :]:
        if key not in {(c.server, c.name, json.dumps(c.arguments, sort_keys=True)) for c in turn.tool_calls}:
            return False
    return True
