"""Token-exact mode: the client renders prompts with the model's own tokenizer and chat template and
sends token ids to `/v1/completions` (vLLM), so what the trajectory records is exactly what was
sampled from, never a re-tokenization. How prompts are built (and extended verbatim within a
segment) is in `prompts.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import orjson

from nanbeige.agent.backends.completion import Completion, parse_completion
from nanbeige.agent.backends.in_process import stop_ids
from nanbeige.agent.backends.llm import LLMConfig, ModelError, OpenAIChat, streamed
from nanbeige.agent.backends.prompts import Conversation, Prompter, identity, read_chat_template


class TokenModeChat(OpenAIChat):
    """An OpenAI-compatible client that sends token ids to `/v1/completions`."""

    def __init__(
        self,
        config: LLMConfig,
        tokenizer: Any,
        chat_template: str | None = None,
        template_name: str | None = None,
        **options: Any,
    ):
        super().__init__(config, **options)
        self.prompter = Prompter(tokenizer, chat_template)
        if not self.prompter.chat_template:
            raise ModelError("token mode needs a chat template: the tokenizer has none; pass --chat-template")
        self.stop_ids = stop_ids(tokenizer)
        self.tokenizer_identity, self.template_identity = identity(
            tokenizer, self.prompter.chat_template, template_name
        )

    def at(self, config: LLMConfig) -> TokenModeChat:
        """A client of another endpoint serving the same model, sharing this one's tokenizer and template."""
        other = TokenModeChat.__new__(TokenModeChat)
        OpenAIChat.__init__(other, config, server=self.server)
        other.prompter, other.stop_ids = self.prompter, self.stop_ids
        other.tokenizer_identity, other.template_identity = self.tokenizer_identity, self.template_identity
        return other

    def new_conversation(self, group: str | None = None) -> Conversation:
        return Conversation()

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: Conversation | None
    ) -> int:
        return self.prompter.count(messages, tools, conversation)

    def completions_body(self, prompt: list[int], max_tokens: int | None) -> dict[str, Any]:
        c = self.config
        body: dict[str, Any] = {
            "model": c.model,
            "prompt": prompt,
            "max_tokens": max_tokens or c.max_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "repetition_penalty": c.repetition_penalty,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": self.stop_ids,
            "skip_special_tokens": False,
        }
        if c.stop:
            body["stop"] = c.stop
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: Conversation | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        conversation = conversation or Conversation()
        prompt = self.prompter.prompt_ids(messages, tools, conversation)
        read = streamed(on_text, completions_api=True, timeout_s=self.config.timeout_s) if on_text else None
        answer, latency_s = await self._ask_shaped(
            lambda: self.completions_body(prompt, max_tokens) | (self.shape.streaming() if read else {}),
            "/completions",
            read,
            ("stream_options", "stream") if read else (),
        )
        try:
            completion = parse_completion(
                answer if read else orjson.loads(_drop_prompt_echo(answer.content)), latency_s, completions_api=True
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError(f"model server sent a reply that is not a completion: {exc!r}") from None
        if completion.completion_ids is None:
            raise ModelError("the server did not return token ids: token mode needs vLLM (return_token_ids)")
        completion.prompt_ids = prompt  # what was sent, exactly
        self.prompter.sampled(conversation, prompt, completion.completion_ids)
        return completion


_ECHO = b'"prompt_token_ids":'


def _drop_prompt_echo(body: bytes) -> bytes:
    """The response without vLLM's echo of the prompt's ids, which this client sent and keeps:
    cutting that flat list of ints out before parsing saves parsing the whole history every turn.
    (The key cannot match inside the completion's text: quotes there are escaped.)"""
    start = body.find(_ECHO)
    opening = body.find(b"[", start)
    if start < 0 or opening < 0 or body[start + len(_ECHO) : opening].strip():
        return body  # absent, or not a list (null)
    closing = body.find(b"]", opening)
    return body[:start] + _ECHO + b"null" + body[closing + 1 :] if closing > 0 else body


def load_tokenizer(name_or_path: str, chat_template_file: Path | None = None) -> tuple[Any, str | None]:
    """The model's tokenizer (transformers) and, optionally, a chat template read from a file (a
    template, or a tokenizer config such as `tokenizer_config_search.json`)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelError("token mode needs transformers: pip install 'nanbeige[local]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer of {name_or_path!r}: {exc}") from None  # all of it: the
        # reasons come after the first line ("Couldn't instantiate the backend tokenizer from one of:")
    try:
        template = read_chat_template(chat_template_file) if chat_template_file else None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the chat template {chat_template_file}: {exc}") from None
    return tokenizer, template
