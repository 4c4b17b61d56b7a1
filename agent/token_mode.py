"""Token-exact mode: the client renders prompts with the model's own tokenizer and chat template and
sends token ids to `/v1/completions` (vLLM), so what the trajectory records is exactly what was
sampled from, never a re-tokenization.

Within a segment each prompt is the previous prompt + the sampled completion ids, verbatim, + the
ids of what the template adds after it (the turn's end, the tool results, the next assistant
header). Only when context management rewrites the history (keep-K hides an old tool result) does
the rendered text stop extending the previous one; then a new segment starts from the template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from nanbeige.agent.llm import Completion, LLMConfig, ModelError, OpenAIChat, parse_completion
from nanbeige.agent.local import stop_ids


class TokenModeChat(OpenAIChat):
    """An OpenAI-compatible client that sends token ids to `/v1/completions`."""

    def __init__(self, config: LLMConfig, tokenizer: Any, chat_template: str | None = None, **options: Any):
        super().__init__(config, **options)
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise ModelError("token mode needs a chat template: the tokenizer has none; pass --chat-template")
        self.stop_ids = stop_ids(tokenizer)
        # the last request: its messages, its rendered text, its prompt ids, the completion ids sampled
        self.previous: tuple[list[dict[str, Any]], str, list[int], list[int]] | None = None
        self.count_prompt = lambda messages, tools=None: len(self.prompt_ids(messages, tools))
        self._last: tuple[tuple[int, ...], list[int], str] | None = None  # the loop counts a prompt, then sends it

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.chat_template,
                                                  add_generation_prompt=generation_prompt, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The next prompt (computed once for the same messages: they are replaced, never mutated)."""
        key = (len(messages), id(messages[-1]), id(tools), id(self.previous))
        if self._last is None or self._last[0] != key:
            text = self.render(messages, tools)
            self._last = (key, self._prompt_ids(messages, tools, text), text)
        return self._last[1]

    def _prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str) -> list[int]:
        """The previous ids extended verbatim when the history only grew, else the whole conversation
        rendered and tokenized afresh."""
        if self.previous is None:
            return self.encode(text)
        sent_messages, sent_text, prompt, completion = self.previous
        n = len(sent_messages)
        if messages[:n] != sent_messages or len(messages) <= n:
            return self.encode(text)
        # What the previous prompt + completion ids stand for, and how the template renders that turn.
        sampled = sent_text + self.tokenizer.decode(completion, skip_special_tokens=False)
        after_turn = self.render(messages[:n + 1], tools, generation_prompt=False)
        if not (after_turn.startswith(sampled) and text.startswith(after_turn)):
            return self.encode(text)  # the history was rewritten (or the template is not prefix-preserving)
        # Extend verbatim: the template's glue after the completion (e.g. "\n"), then the new messages.
        return prompt + completion + self.encode(after_turn[len(sampled):] + text[len(after_turn):])

    def completions_body(self, prompt: list[int], max_tokens: int | None) -> dict[str, Any]:
        c = self.config
        body: dict[str, Any] = {"model": c.model, "prompt": prompt, "max_tokens": max_tokens or c.max_tokens,
                                "temperature": c.temperature, "top_p": c.top_p, "logprobs": 0,
                                "return_token_ids": True, "stop_token_ids": self.stop_ids,
                                "skip_special_tokens": False}
        if c.stop:
            body["stop"] = c.stop
        return body

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                       max_tokens: int | None = None) -> Completion:
        prompt = self.prompt_ids(messages, tools)
        response, latency_s = await self._post_with_retries(self.completions_body(prompt, max_tokens),
                                                            "/completions")
        if response.status_code != 200:
            self.raise_for_answer(response)
        try:
            completion = parse_completion(orjson.loads(response.content), latency_s, completions_api=True)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError(f"model server sent a reply that is not a completion: {exc!r}") from None
        if completion.completion_ids is None:
            raise ModelError("the server did not return token ids: token mode needs vLLM (return_token_ids)")
        completion.prompt_ids = prompt  # what was sent, exactly
        assert self._last is not None
        self.previous = (list(messages), self._last[2], prompt, completion.completion_ids)
        return completion


def load_tokenizer(name_or_path: str, chat_template_file: Path | None = None) -> tuple[Any, str | None]:
    """The model's tokenizer (transformers) and, optionally, a chat template read from a file."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelError("token mode needs transformers: pip install 'nanbeige[local]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer of {name_or_path!r}: {exc}".splitlines()[0]) from None
    template = chat_template_file.read_text() if chat_template_file else None
    return tokenizer, template
