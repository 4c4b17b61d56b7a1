"""One chat completion from an OpenAI-compatible endpoint (a `ChatEndpoint`): what the LLM judges, the turn
critic and the question writer each ask of their model. Retrying and what a failure means stay with each caller."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import orjson

from nanbeige.agent.backends.model_server import UnusableReply
from nanbeige.agent.backends.stream import read_whole
from nanbeige.tools.endpoint import ChatEndpoint

RETRY_STATUSES = {408, 429, 500, 502, 503, 504}
"""HTTP statuses worth asking again after: time-outs, rate limits and server errors."""


class CallFailed(Exception):
    """One call that gave no reply text. `retry`: asking again may help. `unavailable`: the endpoint
    itself failed (unreachable, an error status), as opposed to answering with something unusable.
    `timed_out`: no answer in time."""

    def __init__(self, message: str, retry: bool = True, unavailable: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.retry, self.unavailable, self.timed_out = retry, unavailable, timed_out
        self.status: int | None = None


async def chat_text(
    client: httpx.AsyncClient, endpoint: ChatEndpoint, messages: list[dict[str, str]], temperature: float | None = None
) -> str:
    """`chat` with the endpoint's model, the messages, a temperature (None: the endpoint's) and its
    max_tokens (the critic's and the question writer's requests)."""
    temperature = endpoint.temperature if temperature is None else temperature
    body = {
        "model": endpoint.model,
        "messages": messages,
        "temperature": temperature,
        "max_tokens": endpoint.max_tokens,
    }
    return await chat(client, endpoint, body)


async def chat(client: httpx.AsyncClient, endpoint: ChatEndpoint, body: dict[str, Any]) -> str:
    """The reply's text to the request `body`, sent as it is, after any `</think>` (a thinking model may
    leave its deliberation in the content; only what follows it is the reply). With several endpoints, the
    request's hash picks where it goes first (so calls spread evenly, and the same request goes to the same
    endpoint), and an endpoint that fails (unreachable, an error status, no answer in time) passes it to the
    next. Raises `CallFailed`; the key never appears in it."""
    urls = [endpoint.base_url, *endpoint.more_base_urls]
    first = int.from_bytes(hashlib.sha256(orjson.dumps(body)).digest()[:4], "big") % len(urls)
    for tried, base_url in enumerate(urls[first:] + urls[:first], 1):
        try:
            return await _chat_at(client, base_url, endpoint, body)
        except CallFailed as exc:
            if not exc.unavailable or tried == len(urls):
                raise
    raise AssertionError("unreachable")


async def _chat_at(client: httpx.AsyncClient, base_url: str, endpoint: ChatEndpoint, body: dict[str, Any]) -> str:
    timeout_s = endpoint.timeout_s
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = base_url.rstrip("/") + "/chat/completions"
    try:
        async with asyncio.timeout(timeout_s):  # in all: a server trickling its answer a byte at a time misses it
            async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as streamed:
                response = await read_whole(streamed)  # within the size cap of a model's reply
    except UnusableReply as exc:
        raise CallFailed(str(exc), unavailable=True) from None
    except (httpx.TimeoutException, TimeoutError):
        raise CallFailed(f"did not answer within {timeout_s:g} s", unavailable=True, timed_out=True) from None
    except httpx.TransportError as exc:
        raise CallFailed(f"unreachable at {base_url}: {type(exc).__name__}: {exc}", unavailable=True) from None
    if response.status_code != 200:
        failed = CallFailed(
            f"HTTP {response.status_code}: {response.text[:200]}",
            retry=response.status_code in RETRY_STATUSES,
            unavailable=True,
        )
        failed.status = response.status_code
        raise failed
    try:
        content: Any = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CallFailed("the answer is not a chat completion") from None
    if not isinstance(content, str):
        raise CallFailed("the reply has no text content")
    return content.rsplit("</think>", 1)[-1]
