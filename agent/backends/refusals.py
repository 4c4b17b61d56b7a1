"""What a model server's refusal says, and what the client does about it: a refusal that means "not
now" (408/425/429/5xx) is asked again after a wait (the one the server names in `Retry-After`, else a
doubling backoff); a refusal that names a request field the client can do without (vLLM's own fields,
`stream_options`, `stream` itself) is asked again without it, and the field is left out for the rest
of the client's life, since a server that refuses a field once refuses it every time."""

from __future__ import annotations

import datetime
import email.utils
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
from tenacity import RetryCallState, wait_exponential_jitter

from nanbeige.agent.backends.stream import STREAM_FIELDS

RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}
VLLM_EXTRAS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}
# What a refusal must name for each optional part of a request to be left out. `stream` must be the
# word itself (or "streaming"): `stream_options` names only the options, and "upstream" nothing.
NAMES = {
    "extras": re.compile("|".join([*VLLM_EXTRAS, "repetition_penalty"])),
    "stream_options": re.compile("stream_options"),
    "stream": re.compile(r"\bstream(ing)?\b", re.IGNORECASE),
}


class RetryableStatus(Exception):
    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a `Retry-After` header asks for: a number of seconds or an HTTP date; None
    when there is none or it cannot be read."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def backoff(first_s: float, longest_s: float, longest_asked_s: float) -> Callable[[RetryCallState], float]:
    """The wait before the next attempt: what the server asked for (at most `longest_asked_s`), else a
    backoff from `first_s` doubling up to `longest_s`, with jitter."""
    doubling = wait_exponential_jitter(multiplier=first_s, max=longest_s, jitter=first_s)

    def wait(state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome else None
        asked = retry_after(failure.response) if isinstance(failure, RetryableStatus) else None
        return min(asked, longest_asked_s) if asked is not None else doubling(state)

    return wait


def error_text(response: httpx.Response) -> str:
    """The server's own words: OpenAI's `error.message`, or FastAPI's `detail`, which is a string or
    pydantic's list of errors, each with where in the request it is (`loc`)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    message = body.get("error", body.get("detail", body)) if isinstance(body, dict) else body
    if isinstance(message, dict):
        message = message.get("message", message)
    if isinstance(message, list):
        message = "; ".join(_located(error) for error in message)
    return str(message)[:500]


def _located(error: Any) -> str:
    """One pydantic validation error as `body.field: message`: the field may be named only in `loc`."""
    if not isinstance(error, dict):
        return str(error)
    where = ".".join(str(part) for part in error.get("loc") or [])
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg", error))


@dataclass
class RequestShape:
    """The optional parts of a request this client still sends. Shared by all the calls of one client:
    what one call learns, the others keep."""

    extras: bool = False
    """vLLM's own fields (token ids, logprobs, repetition penalty): sent only to vLLM."""
    stream_options: bool = True
    """`stream_options.include_usage` with a streamed request (without it a stream may carry no usage)."""
    stream: bool = True
    """`"stream": true` when the caller wants the reply as it comes."""

    def streaming(self) -> dict[str, Any]:
        """The fields that ask for a streamed reply, less those refused."""
        if not self.stream:
            return {}
        return STREAM_FIELDS if self.stream_options else {"stream": True}

    def drop_refused(self, response: httpx.Response, parts: tuple[str, ...]) -> bool:
        """Leave out, from now on, each of `parts` still sent that a client error (4xx) names; True when
        any was (the request is worth asking again). Without `stream`, `stream_options` means nothing."""
        if not 400 <= response.status_code < 500:
            return False
        text = error_text(response)
        named = [part for part in parts if getattr(self, part) and NAMES[part].search(text)]
        for part in named:
            setattr(self, part, False)
        if "stream" in named:
            self.stream_options = False
        return bool(named)
