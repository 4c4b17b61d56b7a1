"""Prompt token ids from messages, with the model's own chat template and tokenizer, cheaply
enough to run every turn of a 600-turn run (used by token mode and the in-process backend).

Three things keep a turn's cost from growing with the history:
- The template is rendered with transformers' compiled jinja template directly, with each message
  converted for it once (transformers converts every message again on every call).
- The text is tokenized a chunk at a time, each chunk starting at a special token, and each
  distinct chunk is tokenized once. A tokenizer cuts its input at special tokens before anything
  else, so the chunks' ids joined are the whole text's ids.
- Within a segment the prompt is the previous prompt + the sampled completion ids, verbatim, +
  the ids of what the template added after them (the turn's end, the tool results, the next
  assistant header), so what the model sampled is never re-tokenized. When context management
  rewrites the history the rendered text stops extending what the model saw, and the prompt is
  tokenized from the template again: a new segment.

Both shortcuts are checked against plain transformers on the first prompts and turned off for a
tokenizer or template where they disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Prompts (with at least this many chunks) compared with the plain path before it is trusted.
_CHECKS = 2
_CHECK_MIN_CHUNKS = 3


class Conversation:
    """What one conversation's prompts build on: the last prompt and what was sampled after it, plus
    caches of its messages and chunks. One per run, so runs that share a Prompter (and a model
    client) never extend each other's prompts or evict each other's caches."""

    def __init__(self) -> None:
        self.seen: tuple[str, list[int]] | None = None  # the text and ids of the last prompt + completion
        self.sent: tuple[str, list[int]] | None = None  # the text and ids of the last prompt alone
        self.last: tuple[list[dict[str, Any]], int, dict[str, Any] | None, Any, str, list[int]] | None = None
        self.chunks: dict[str, list[int]] = {}  # ids of the last prompt's chunks (and those added since)
        self.prepared: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (message, its template form)


class Prompter:
    """Renders and tokenizes prompts for one model. Shared by every run of that model; what belongs
    to one conversation lives in its `Conversation`, passed to each call.

    Messages must be replaced, never mutated in place (the agent's History does so): a message's
    template form is cached by identity."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        self.compiled = _compiled(self.chat_template)  # None: render through apply_chat_template
        self.split_token: str | None = None  # chosen on the first prompt
        self.render_checks = _CHECKS
        self.encode_checks = _CHECKS
        self._anchor_ids: dict[str, list[int]] = {}

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        generation_prompt: bool = True,
        conversation: Conversation | None = None,
    ) -> str:
        """The prompt text, as `tokenizer.apply_chat_template` renders it."""
        conversation = conversation or Conversation()
        if self.compiled is not None and self.render_checks <= 0:
            return self._render_compiled(messages, tools, generation_prompt, conversation)
        plain = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
        if self.compiled is not None:
            self.render_checks -= 1
            if self._render_compiled(messages, tools, generation_prompt, conversation) != plain:
                self.compiled = None
        return plain

    def _render_compiled(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        generation_prompt: bool,
        conversation: Conversation,
    ) -> str:
        assert self.compiled is not None
        return self.compiled.render(
            messages=self._template_messages(messages, conversation),
            tools=tools,
            documents=None,
            add_generation_prompt=generation_prompt,
            **self.tokenizer.special_tokens_map,
        )

    def _template_messages(self, messages: list[dict[str, Any]], conversation: Conversation) -> list[dict[str, Any]]:
        """The messages as transformers hands them to a template, each converted once (the cache
        holds the conversation's messages by position, checked by identity)."""
        from transformers.utils import chat_template_utils as ct

        cached = conversation.prepared
        prepared = []
        for position, message in enumerate(messages):
            if position < len(cached) and cached[position][0] is message:
                prepared.append(cached[position])
                continue
            plain = ct._plain_template_data({k: v for k, v in message.items() if v is not None})
            prepared.append((message, ct._alias_reasoning_fields([plain])[0]))
        conversation.prepared = prepared
        return [template_form for _, template_form in prepared]

    def encode(self, text: str, at_start: bool = True, conversation: Conversation | None = None) -> list[int]:
        """The text's token ids, as the tokenizer gives them for a whole prompt (`at_start`) or for
        text that follows a special token, tokenizing only chunks not seen before. The conversation's
        cache keeps the chunks of its last whole prompt (and of the text added to it since)."""
        conversation = conversation or Conversation()
        if self.split_token is None:
            self.split_token = _split_token(self.tokenizer, text) or ""
        if not self.split_token:
            return self._encode_whole(text) if at_start else self._encode_after_special(text)
        first, *rest = text.split(self.split_token)
        ids = [] if not first else self._encode_whole(first) if at_start else self._encode_after_special(first)
        cache = conversation.chunks
        fresh: dict[str, list[int]] = {} if at_start else cache
        for part in rest:
            chunk = cache.get(part)
            if chunk is None:
                chunk = self._encode_whole(self.split_token + part)
            fresh[part] = chunk
            ids += chunk
        conversation.chunks = fresh
        if at_start and self.encode_checks > 0 and len(rest) + 1 >= _CHECK_MIN_CHUNKS:
            self.encode_checks -= 1
            whole = self._encode_whole(text)
            if whole != ids:
                self.split_token, conversation.chunks = "", {}
                return whole
        return ids

    def _encode_whole(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_after_special(self, text: str) -> list[int]:
        """Ids of text that follows a special token in the prompt. Tokenized alone it would count
        as the start of the input, which some tokenizers mark (sentencepiece's "▁" prefix), so a
        special token goes in front and its ids are taken off again."""
        anchor = self.split_token or self.tokenizer.eos_token or self.tokenizer.bos_token
        if not text or not anchor:
            return self._encode_whole(text) if text else []
        anchor_ids = self._anchor_ids.get(anchor)
        if anchor_ids is None:
            anchor_ids = self._anchor_ids[anchor] = self._encode_whole(anchor)
        ids = self._encode_whole(anchor + text)
        return ids[len(anchor_ids) :] if ids[: len(anchor_ids)] == anchor_ids else self._encode_whole(text)

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        conversation: Conversation | None = None,
    ) -> list[int]:
        """The next prompt's ids in a conversation (a new one when None); computed once for the same
        messages (the loop counts a prompt, then sends it)."""
        conversation = conversation or Conversation()
        last = conversation.last
        newest = messages[-1] if messages else None
        if (
            last is not None
            and last[0] is messages
            and last[1] == len(messages)
            and last[2] is newest
            and last[3] is tools
        ):
            return last[5]
        text = self.render(messages, tools, conversation=conversation)
        seen, sent = conversation.seen, conversation.sent
        if sent is not None and text == sent[0]:  # the reply was rolled back: the same prompt, sampled again
            ids = sent[1]
        elif seen is not None and len(text) > len(seen[0]) and text.startswith(seen[0]):
            ids = seen[1] + self.encode(text[len(seen[0]) :], at_start=False, conversation=conversation)
        else:
            ids = self.encode(text, conversation=conversation)
        conversation.last = (messages, len(messages), newest, tools, text, ids)
        return ids

    def count(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        conversation: Conversation | None = None,
    ) -> int:
        """The next prompt's length in tokens (the loop's context check)."""
        return len(self.prompt_ids(messages, tools, conversation))

    def sampled(self, conversation: Conversation, prompt_ids: list[int], completion_ids: list[int]) -> None:
        """Remember what the model saw and sampled, for the conversation's next prompt to extend verbatim."""
        last = conversation.last
        text = (
            last[4]
            if last is not None and last[5] is prompt_ids
            else self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        )
        conversation.seen = (
            text + self.tokenizer.decode(completion_ids, skip_special_tokens=False),
            prompt_ids + completion_ids,
        )
        conversation.sent = (text, prompt_ids)
        conversation.last = None  # the same messages may now extend a different prompt

    def restore(
        self,
        conversation: Conversation,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        completion_ids: list[int],
    ) -> None:
        """Put a fresh conversation where a recorded one was after a turn (a resumed run): asked with
        `messages`, whose prompt was `prompt_ids`, it sampled `completion_ids`. The prompt is rendered
        again for its text, which the next prompt extends; its ids are the recorded ones."""
        if self.split_token is None:  # chosen from the first prompt, as the recorded run chose it
            self.split_token = _split_token(self.tokenizer, self.render(messages[:2], tools)) or ""
        text = self.render(messages, tools, conversation=conversation)
        conversation.last = (messages, len(messages), messages[-1], tools, text, prompt_ids)
        self.sampled(conversation, prompt_ids, completion_ids)


def _compiled(chat_template: str | None) -> Any:
    """transformers' compiled form of the template, or None where this transformers has none."""
    try:
        from transformers.utils import chat_template_utils as ct

        if not all(hasattr(ct, name) for name in ("_plain_template_data", "_alias_reasoning_fields")):
            return None
        return ct._compile_jinja_template(chat_template) if chat_template else None
    except (ImportError, AttributeError):
        return None


def _split_token(tokenizer: Any, text: str) -> str | None:
    """The special token to cut prompts at: the one the prompt holds most often, among those whose
    matching cannot take whitespace from the text before them (an `lstrip` token would)."""
    candidates = [
        token.content
        for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(token, "special", False) and not getattr(token, "lstrip", False)
    ]
    counts = {token: text.count(token) for token in candidates if token}
    best = max(counts, key=lambda token: counts[token], default=None)
    return best if best is not None and counts[best] > 0 else None


def identity(
    tokenizer: Any, chat_template: str | None, template_name: str | None = None
) -> tuple[dict[str, str], dict[str, str] | None]:
    """Name and SHA-256 of the tokenizer (its whole serialized form: vocabulary, merges, added tokens)
    and of the chat template, for trajectories to say exactly what rendered and tokenized them."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    serialized = (
        backend.to_str()
        if backend is not None
        else repr(sorted(tokenizer.get_vocab().items())) + repr(sorted(map(str, tokenizer.all_special_tokens)))
    )
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    tokenizer_id = {"name": name, "sha256": hashlib.sha256(serialized.encode()).hexdigest()}
    if not chat_template:
        return tokenizer_id, None
    return tokenizer_id, {"name": template_name or name, "sha256": hashlib.sha256(chat_template.encode()).hexdigest()}


SEARCH_TEMPLATE = "tokenizer_config_search.json"  # the model card's deep-search template, beside the weights


def search_template(model: str) -> Path | None:
    """The model's deep-search template config, when its folder (or the local hub cache) has one."""
    local = Path(model) / SEARCH_TEMPLATE
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, SEARCH_TEMPLATE)
    except (ImportError, ValueError):  # no hub library, or not a model id
        return None
    return Path(cached) if isinstance(cached, str) else None


def read_chat_template(path: Path) -> str:
    """A chat template from a file: a template itself, or a tokenizer config (`.json`) whose
    `chat_template` text is taken. ValueError when it has none."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text
    try:
        template = json.loads(text).get("chat_template")
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{path} is not a tokenizer config (JSON object): {exc}") from None
    if not isinstance(template, str):
        raise ValueError(f"{path} has no `chat_template` text")
    return template
