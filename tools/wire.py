"""What every HTTP client of the program reads of an answer, whoever sends it (a model server, a judge, an
inference engine, a page the egress guard fetches).

- At most one content coding, and only gzip or deflate (`check_coding`, called on the answer before its
  body is read). httpx decodes nested codings (`Content-Encoding: gzip, gzip`) a network chunk at a time,
  each layer whole, so 3.5 KB can inflate to gigabytes in one call, before any size cap counts a byte and
  without giving the event loop back for a deadline to fire; brotli and zstd reach far higher ratios than
  gzip's ~1000:1. One gzip or deflate layer inflates a 64 KB chunk to at most ~64 MB, which the callers'
  size caps bound. The clients ask for these two only (`ACCEPT_ENCODING`), so an honest server sends no other.
- A body read up to a cap (`read_capped`), and a whole answer within a deadline over the whole request,
  headers included (`answer_within`): an answer trickled a byte at a time never trips a per-read timeout.
- A blocking caller gets that deadline too by running the request on a loop of its own (`run_blocking`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

ACCEPT_ENCODING = {"Accept-Encoding": "gzip, deflate"}
"""The header every client sends: the codings `check_coding` lets through."""
READABLE_CODINGS = ("gzip", "deflate")
WIRE_HEADERS = ("content-encoding", "content-length", "transfer-encoding")
"""The headers that describe a body's wire form, which no longer apply to it once read (and decoded)."""

T = TypeVar("T")


class UnsafeEncoding(httpx.DecodingError):
    """An answer whose body is coded in a way that is not read: more than one coding, or one that is neither
    gzip nor deflate. An httpx error, so that each client reports it as it reports a broken answer."""


def check_coding(response: httpx.Response) -> None:
    """Refuse (UnsafeEncoding) an answer with more than one content coding, or one other than gzip or deflate."""
    said = [value.strip().lower() for value in response.headers.get_list("content-encoding", split_commas=True)]
    codings = [coding for coding in said if coding and coding != "identity"]
    if len(codings) > 1 or any(coding not in READABLE_CODINGS for coding in codings):
        raise UnsafeEncoding(
            f"an answer coded {', '.join(codings)!r}: only one coding, gzip or deflate, is read",
            request=response.request,
        )


async def read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """The body, at most `max_bytes` of it after decoding, and whether there was more; stops reading at the
    cap. Refuses codings as `check_coding` does, before reading a byte."""
    check_coding(response)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return b"".join(chunks)[:max_bytes], True
    return b"".join(chunks), False


async def answer_within(
    http: httpx.AsyncClient, request: httpx.Request, deadline_s: float, max_bytes: int
) -> httpx.Response:
    """The answer to `request`, read whole within `deadline_s` seconds in all (from sending it to the body's
    last byte) and `max_bytes`: httpx's ReadTimeout past the deadline, its ReadError past the size, and
    UnsafeEncoding for codings not read."""
    try:
        async with asyncio.timeout(deadline_s):
            response = await http.send(request, stream=True)
            try:
                content, longer = await read_capped(response, max_bytes)
            finally:
                await response.aclose()
    except TimeoutError:
        raise httpx.ReadTimeout(f"no whole answer within {deadline_s:g} s", request=request) from None
    if longer:
        raise httpx.ReadError(f"an answer longer than {max_bytes} bytes", request=request)
    return with_body(response, content)


def with_body(response: httpx.Response, content: bytes) -> httpx.Response:
    """A streamed answer as one already read: its status and headers with `content` (decoded) as its body,
    without the headers of the body's wire form, which no longer apply."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in WIRE_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=content, request=response.request)


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end on an event loop of its own, in a thread of its own (so that a caller
    inside a running loop, or in a worker thread, may call it): how a blocking function gets a deadline
    over a whole request (`asyncio.timeout`), which httpx's blocking client cannot give."""
    # A daemon thread, joined without a pool: a signal that ends the command (SIGTERM, Ctrl-C) interrupts the
    # join, and neither the pool's shutdown nor the interpreter's exit then waits for the request to give up.
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="nanbeige-request", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
