"""A model backend that replays fixed replies, for tests and demos."""

from __future__ import annotations

from typing import Any, Callable

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import LLMConfig, ModelError

Reply = str | dict[str, Any] | Completion | Exception | Callable[[list[dict[str, Any]]], "Reply"]


class ScriptedLLM:
    """Replays fixed replies, for tests and demos. A reply may be the assistant text, a message
    dict, a whole Completion, an exception to raise, or a function of the messages returning one
    of those. After the script runs out, `default` (if set) is replied forever."""

    def __init__(
        self, replies: list[Reply], default: Reply | None = None, config: LLMConfig | None = None, record: bool = True
    ):
        self.config = (config or LLMConfig(model="scripted")).for_dialect("mcp-xml")
        self.tokenizer_identity: dict[str, str] | None = None
        self.template_identity: dict[str, str] | None = None
        self.replies = list(replies)
        self.default = default
        self.record = record
        self.calls: list[list[dict[str, Any]]] = []  # the messages of every call, for assertions
        self.max_tokens: list[int | None] = []  # the max_tokens of every call

    def new_conversation(self, group: str | None = None) -> Any:
        return None

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: Any
    ) -> int | None:
        return None

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: Any = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        if self.record:
            self.calls.append(list(messages))  # a copy: the loop keeps appending to its list
            self.max_tokens.append(max_tokens)
        if self.replies:
            reply = self.replies.pop(0)
        elif self.default is not None:
            reply = self.default
        else:
            raise ModelError("scripted model has no more replies")
        while callable(reply) and not isinstance(reply, type):
            reply = reply(messages)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Completion):
            return reply
        if isinstance(reply, str):
            reply = {"role": "assistant", "content": reply}
        if on_text is not None and reply.get("content"):
            on_text(reply["content"])  # the whole reply as one piece: a script has nothing to generate
        tokens = len(reply.get("content") or "") // 4 + 1
        return Completion(message=reply, finish_reason="stop", usage={"completion_tokens": tokens})

    async def aclose(self) -> None:
        pass
