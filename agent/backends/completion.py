"""A model's reply (`Completion`), read from an OpenAI-compatible chat or completions body, with the checks
that turn a malformed body into a `ModelError` the loop can report instead of a crash."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nanbeige.agent.backends.model_server import ModelError


@dataclass
class Completion:
    """One reply of the model."""

    message: dict[str, Any]
    """The assistant message as produced: `role`, `content`, and `tool_calls` / `reasoning` if any."""
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    prompt_ids: list[int] | None = None
    """Token ids of the whole prompt, when the backend reports them."""
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    latency_s: float = 0.0
    endpoint: str | None = None
    """The endpoint of a pool that served it (`pool.py`); None without a pool."""


def parse_completion(body: dict[str, Any], latency_s: float, completions_api: bool = False) -> Completion:
    """Turn a `/chat/completions` (or, with `completions_api`, a `/completions`) response body into a
    Completion, keeping vLLM's token fields."""
    choice = body["choices"][0]
    if completions_api:
        message: dict[str, Any] = {"role": "assistant", "content": choice.get("text") or ""}
    else:
        message = {"role": "assistant", "content": _content_text(choice["message"].get("content"))}
        for key in ("tool_calls", "reasoning", "reasoning_content"):
            if choice["message"].get(key):
                message[key] = choice["message"][key]
        _check_tool_calls(message.get("tool_calls") or [])
    logprobs = None
    if (choice.get("logprobs") or {}).get("content"):
        logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    elif (choice.get("logprobs") or {}).get("token_logprobs"):
        logprobs = list(choice["logprobs"]["token_logprobs"])
    usage = {k: v for k, v in (body.get("usage") or {}).items() if isinstance(v, int)}
    return Completion(
        message=message,
        finish_reason=choice.get("finish_reason"),
        usage=usage,
        prompt_ids=body.get("prompt_token_ids") or choice.get("prompt_token_ids"),
        completion_ids=choice.get("token_ids"),
        logprobs=logprobs,
        latency_s=latency_s,
    )


def _kind(value: Any) -> str:
    """A JSON value's kind, for messages about replies of the wrong shape."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    kinds = {str: "a string", list: "a list", dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _bad_reply(problem: str) -> ModelError:
    return ModelError(f"model server sent an unusable reply: {problem}")


def _content_text(content: Any) -> str:
    """The reply's text. Some servers send a list of parts (`{"type": "text", "text": ...}`, as in
    requests); only the text parts are text."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    raise _bad_reply(f"content is {_kind(content)}, not text")


def _check_tool_calls(tool_calls: Any) -> None:
    """Raise ModelError unless `tool_calls` has the shape the tool-call dialect reads: a list of
    objects, each with a `function` object whose `name` is a string and whose `arguments` are a JSON
    string or an object (absent or null reads as no arguments)."""
    if not isinstance(tool_calls, list):
        raise _bad_reply(f"tool_calls is {_kind(tool_calls)}, not a list")
    for i, call in enumerate(tool_calls):
        if not isinstance(call, dict):
            raise _bad_reply(f"tool_calls[{i}] is {_kind(call)}, not an object")
        function = call.get("function")
        if function is None:
            raise _bad_reply(f"tool_calls[{i}] has no function")
        if not isinstance(function, dict):
            raise _bad_reply(f"tool_calls[{i}].function is {_kind(function)}, not an object")
        if not isinstance(function.get("name"), str):
            raise _bad_reply(f"tool_calls[{i}].function.name is {_kind(function.get('name'))}, not a string")
        if not isinstance(function.get("arguments"), (str, dict, type(None))):
            raise _bad_reply(
                f"tool_calls[{i}].function.arguments is {_kind(function['arguments'])}, not a string or an object"
            )
