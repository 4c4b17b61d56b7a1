"""Token-exact mode: the client renders prompts with the model's own tokenizer and chat template and
sends token ids to `/v1/completions` (vLLM), so what the trajectory records is exactly what was
sampled from, never a re-tokenization. How prompts are built (and extended verbatim within a
segment) is in `prompts.py`.

The ids a server returns are what training learns from, so they are checked against the reply's text
before they are recorded: they must decode to it (`check_spelling`). A server whose ids spell something
else has failed, as one that sends no completion has (`UnusableReply`: a pool moves the run elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import orjson

from nanbeige.agent.backends.completion import Completion, parse_completion
from nanbeige.agent.backends.in_process import stop_ids
from nanbeige.agent.backends.llm import LLMConfig, ModelError, OpenAIChat
from nanbeige.agent.backends.model_server import UnusableReply
from nanbeige.agent.backends.prompts import Conversation, Prompter, identity, read_chat_template
from nanbeige.agent.backends.stream import streamed


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
            raise UnusableReply(f"model server sent a reply that is not a completion: {exc!r}") from None
        if completion.completion_ids is None:
            raise UnusableReply("the server did not return token ids: token mode needs vLLM (return_token_ids)")
        check_spelling(self.prompter.tokenizer, completion, self.stop_ids, self.config.stop)
        completion.prompt_ids = prompt  # what was sent, exactly
        self.prompter.sampled(conversation, prompt, completion.completion_ids)
        return completion


def check_spelling(tokenizer: Any, completion: Completion, stop_ids: list[int], stop_strings: list[str]) -> None:
    """UnusableReply unless the completion's token ids decode to its text as vLLM detokenizes them. Beyond
    the text the ids may hold only what vLLM leaves out of it: the stop token that ended the reply, a stop
    string with the rest of the token that completed it, or the bytes of a character a length cut split."""
    ids, text = list(completion.completion_ids or []), completion.message["content"]
    size = len(tokenizer)  # an id past the vocabulary decodes to nothing, so spelling alone would let it through
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in ids):
        raise UnusableReply(f"model server sent token ids that are not all in the vocabulary (0 to {size - 1})")
    if completion.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        ids.pop()
    spelled = _decode(tokenizer, ids)
    if spelled == text or _left_out(tokenizer, ids, spelled, text, completion.finish_reason, stop_strings):
        return
    raise UnusableReply(
        f"model server sent token ids that do not spell its reply: they read {spelled[:120]!r}, "
        f"the reply is {text[:120]!r}"
    )


def _decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except (OverflowError, TypeError, ValueError, IndexError) as exc:  # ids outside the vocabulary
        raise UnusableReply(f"model server sent token ids the tokenizer cannot read: {exc}") from None


def _left_out(tokenizer: Any, ids: list[int], spelled: str, text: str, finish: str | None, stops: list[str]) -> bool:
    """Whether what the ids spell beyond the text is what vLLM leaves out of a reply's text."""
    rest = spelled[len(text) :] if spelled.startswith(text) else None
    if rest is None:
        return False
    if finish == "length":  # the last token ends inside a character, which vLLM holds back
        return len(rest) <= 3 and set(rest) == {"\ufffd"}
    # a stop string: the text ends before it, the ids at the token that completed it
    return finish == "stop" and any(
        rest.startswith(stop) and not _decode(tokenizer, ids[:-1]).startswith(text + stop) for stop in stops if stop
    )


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
