"""A streamed reply (`"stream": true`: server-sent events, one `data:` line per chunk, `data: [DONE]`
last) read back into the body the server would have sent whole, so that the streamed turn is parsed
by the same code, and recorded the same, as one that was not streamed. Each piece of text is handed
to `on_text` as it comes; reasoning that a server splits off (`reasoning_content` / `reasoning`) is
handed over between `<think>` and `</think>`, as the model wrote it.

What a chunk carries is what the whole body carries, a piece at a time: `choices[0].delta` (chat:
content, reasoning, tool calls as pieces by `index`) or `choices[0].text` (completions), the
`finish_reason` on the last piece, logprobs per piece, and, from vLLM asked for them, the token ids
per piece and the prompt's ids once; `usage` comes in a last chunk of its own
(`stream_options.include_usage`).

Not every server streams when asked: many OpenAI-compatible servers and proxies ignore `"stream"` and
answer with the whole completion as JSON. The body is read by its Content-Type (`text/event-stream`
as events, JSON whole; another type or none by how the body begins), and a whole body's text is handed
to `on_text` at once.

A body is read up to `MAX_REPLY_BYTES`, an event line up to `MAX_LINE_BYTES`, and in one content coding
at most, gzip or deflate (`tools/wire.py`: nested codings inflate gigabytes before any cap counts them):
past these the server is not sending a reply (StreamError), and memory stays bounded by the caps, not by
what the server sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import orjson

from nanbeige.agent.backends.model_server import UnusableReply
from nanbeige.tools.wire import check_coding, with_body

STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}
MAX_REPLY_BYTES = 64 * 2**20
"""The most bytes one reply's body may have (after decompression), streamed or whole. A reply with vLLM's
token fields for a full 262,144-token context is a few MB; a body past this is no reply."""
MAX_LINE_BYTES = 16 * 2**20
"""The longest line of a stream of events: one chunk, which may carry the prompt's ids echoed once."""
REASONING = ("reasoning_content", "reasoning")


Reader = Callable[[httpx.Response], Awaitable[dict[str, Any]]]
"""What a streamed request's answer is read with (`streamed`)."""


class StreamError(Exception):
    """The server sent an error, or something that is no chunk, in the middle of a stream."""


@dataclass
class Pieces:
    """What the chunks of one reply carried so far."""

    completions_api: bool
    on_text: Callable[[str], None]
    text: list[str] = field(default_factory=list)
    reasoning: dict[str, list[str]] = field(default_factory=dict)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] = field(default_factory=list)
    token_logprobs: list[Any] = field(default_factory=list)
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    thinking: bool = False

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("error"):
            error = chunk["error"]
            raise StreamError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.prompt_token_ids is None and chunk.get("prompt_token_ids"):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                self._add_choice(choice)

    def _add_choice(self, choice: dict[str, Any]) -> None:
        if choice.get("prompt_token_ids") and self.prompt_token_ids is None:
            self.prompt_token_ids = choice["prompt_token_ids"]
        if choice.get("token_ids"):
            self.token_ids = (self.token_ids or []) + list(choice["token_ids"])
        logprobs = choice.get("logprobs") or {}
        self.logprobs += logprobs.get("content") or []
        self.token_logprobs += logprobs.get("token_logprobs") or []
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if self.completions_api:
            self.say(choice.get("text"))
            return
        delta = choice.get("delta") or {}
        for key in REASONING:
            if delta.get(key):
                self.reasoning.setdefault(key, []).append(delta[key])
                self.say(delta[key], thinking=True)
        self.say(delta.get("content"))
        for call in delta.get("tool_calls") or []:
            self._add_call(call)

    def say(self, piece: Any, thinking: bool = False) -> None:
        if not isinstance(piece, str) or not piece:
            return
        if not thinking:
            self.text.append(piece)
        if thinking != self.thinking:  # the boundary between split-off reasoning and the reply
            self.on_text("<think>\n" if thinking else "\n</think>\n\n")
            self.thinking = thinking
        self.on_text(piece)

    def _add_call(self, piece: dict[str, Any]) -> None:
        call = self.tool_calls.setdefault(piece.get("index", 0), {"function": {"name": "", "arguments": ""}})
        for key in ("id", "type"):
            if piece.get(key):
                call[key] = piece[key]
        function = piece.get("function") or {}
        if isinstance(function.get("name"), str):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]
        elif function.get("arguments") is not None:  # an object sent whole
            call["function"]["arguments"] = function["arguments"]

    def body(self) -> dict[str, Any]:
        """The whole response body these pieces make."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason}
        if self.completions_api:
            choice["text"] = "".join(self.text)
        else:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
            message |= {key: "".join(parts) for key, parts in self.reasoning.items()}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice["message"] = message
        if self.logprobs:
            choice["logprobs"] = {"content": self.logprobs}
        elif self.token_logprobs:
            choice["logprobs"] = {"token_logprobs": self.token_logprobs}
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        body: dict[str, Any] = {"choices": [choice], "usage": self.usage or {}}
        if self.prompt_token_ids is not None:
            body["prompt_token_ids"] = self.prompt_token_ids
        return body


def _take(line: bytes | bytearray, pieces: Pieces) -> bool:
    """Add one line's chunk to `pieces`; False at `data: [DONE]`."""
    if not line.startswith(b"data:"):
        return True  # blank separators, `event:` and `:` comment lines
    data = line[5:].strip()
    if data == b"[DONE]":
        return False
    pieces.add(_json_object(data, "a chunk"))
    return True


async def read_stream(
    response: httpx.Response, on_text: Callable[[str], None], completions_api: bool = False
) -> dict[str, Any]:
    """The response body a streamed reply makes, its text handed to `on_text` as it comes; a whole
    JSON body as it is, its text handed over at once. A connection cut or a read that times out raises
    httpx's error (the caller asks again); an error (a chunk, or a whole body), a chunk that is no JSON
    object, a stream that ends without a finish reason or a body in codings not read raises StreamError."""
    try:
        check_coding(response)
        chunks = response.aiter_bytes()
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        start = b""
        if kind != "text/event-stream" and not _is_json(kind):  # a type that says neither: the body does
            start = await _beginning(chunks)
            kind = _kind_of(start, kind)
        if _is_json(kind):
            return _whole(await read_body(chunks, start), on_text, completions_api)
        return await _events(_after(start, chunks), Pieces(completions_api, on_text))
    except httpx.DecodingError as exc:  # a body that is not what its coding says, or in codings not read
        raise StreamError(f"a body that cannot be decoded: {exc}") from None
    finally:
        await response.aclose()


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def _kind_of(start: bytes, said: str) -> str:
    """What a body whose Content-Type (`said`) names neither events nor JSON is, by how it begins: a
    JSON object, or server-sent events (a field line or a comment). Else (a proxy's HTML page) StreamError."""
    begins = start.lstrip()
    if begins.startswith(b"{"):
        return "application/json"
    if not begins or begins.startswith((b"data:", b":", b"event:", b"id:", b"retry:")):
        return "text/event-stream"
    raise StreamError(f"an answer that is neither events nor JSON ({said or 'no Content-Type'}): {begins[:200]!r}")


async def _beginning(chunks: AsyncIterator[bytes]) -> bytes:
    """The body's first bytes, up to the first that is not white space (or all of it)."""
    start = bytearray()  # grown in place: a server sending white space a byte at a time costs no copies
    async for data in chunks:
        start += data
        if data.strip():
            break
        if len(start) > MAX_LINE_BYTES:
            raise StreamError(f"an answer that begins with more than {_mb(MAX_LINE_BYTES)} of white space")
    return bytes(start)


async def read_body(chunks: AsyncIterator[bytes], start: bytes = b"") -> bytes:
    """The whole body: `start`, then the rest of `chunks`; StreamError past `MAX_REPLY_BYTES`."""
    parts, size = [start], len(start)
    async for data in chunks:
        size += len(data)
        if size > MAX_REPLY_BYTES:
            raise StreamError(f"a reply longer than {_mb(MAX_REPLY_BYTES)}")
        parts.append(data)
    return b"".join(parts)


def _mb(size: int) -> str:
    return f"{size // 2**20} MB"


async def _after(start: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body again: the bytes already read, then the rest."""
    yield start
    async for data in chunks:
        yield data


async def _events(chunks: AsyncIterator[bytes], pieces: Pieces) -> dict[str, Any]:
    """The body server-sent events make."""
    line = bytearray()  # the line being read; grown in place, so a line that never ends costs no copies
    size = 0
    # bytes split at newlines here, not httpx's line decoder: a stream brings a chunk per token
    async for data in chunks:
        size += len(data)
        if size > MAX_REPLY_BYTES:
            raise StreamError(f"a reply longer than {_mb(MAX_REPLY_BYTES)}")
        end = data.rfind(b"\n")
        if end < 0:
            line += data
            _check_line(line)
            continue
        line += data[:end]
        lines, line = line.split(b"\n"), bytearray(data[end + 1 :])
        for each in lines:
            _check_line(each)
        if not all(_take(each, pieces) for each in lines):
            break
    else:
        _take(line, pieces)  # a last event without its line end
    if pieces.finish_reason is None:
        raise StreamError("the stream ended before the reply did (no finish reason)")
    if pieces.thinking:
        pieces.on_text("\n</think>\n\n")
    return pieces.body()


def _check_line(line: bytearray) -> None:
    if len(line) > MAX_LINE_BYTES:
        raise StreamError(f"an event line longer than {_mb(MAX_LINE_BYTES)}: {bytes(line[:200])!r}")


def _json_object(data: bytes | bytearray, what: str) -> dict[str, Any]:
    """The JSON object the bytes hold, or a StreamError naming `what` they were."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StreamError(f"{what} that is not JSON: {bytes(data[:200])!r}") from None
    if not isinstance(value, dict):
        raise StreamError(f"{what} that is not an object: {bytes(data[:200])!r}")
    return value


def _whole(data: bytes, on_text: Callable[[str], None], completions_api: bool) -> dict[str, Any]:
    """A whole JSON body, as it is (the caller reads it as an unstreamed reply), its text handed to
    `on_text` at once as a stream would have handed it: split-off reasoning first, between `<think>`
    and `</think>`."""
    body = _json_object(data, "a body")
    if body.get("error"):
        error = body["error"]
        raise StreamError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    pieces = Pieces(completions_api, on_text)
    if completions_api:
        pieces.say(choice.get("text"))
    elif isinstance(message := choice.get("message"), dict):
        for key in REASONING:
            pieces.say(message.get(key), thinking=True)
        pieces.say(message.get("content"))
    if pieces.thinking:
        on_text("\n</think>\n\n")
    return body


def streamed(on_text: Callable[[str], None], completions_api: bool = False, timeout_s: float | None = None) -> Reader:
    """How the answer to a streamed request is read: into the body it would have been whole, its text
    handed to `on_text`. A stream that breaks off, goes silent for `timeout_s` (httpx's read timeout) or
    is not whole by the call's deadline is asked again; the view is told why, since the text it showed
    starts over. A stream that is no reply (an error, not JSON, past the size caps) is an UnusableReply."""
    broke_off: list[str] = []  # why the last stream read ended early, told when the next one starts

    async def read(response: httpx.Response) -> dict[str, Any]:
        if broke_off:
            on_text(f"\n[{broke_off.pop()}: asking again]\n")
        try:
            return await read_stream(response, on_text, completions_api)
        except httpx.TimeoutException:
            broke_off.append("no word from the server" + (f" for {timeout_s:g} s" if timeout_s else ""))
            raise
        except asyncio.CancelledError:  # the deadline (or the run's end, when nothing reads this again)
            broke_off.append("no whole reply from the server" + (f" within {timeout_s:g} s" if timeout_s else ""))
            raise
        except httpx.TransportError:
            broke_off.append("the connection was cut")
            raise
        except StreamError as exc:
            raise UnusableReply(f"model server sent an unusable reply: {exc}") from None

    return read


async def read_whole(response: httpx.Response) -> httpx.Response:
    """The response with its body read, up to `MAX_REPLY_BYTES` and in one coding at most (else UnusableReply)."""
    try:
        check_coding(response)
        content = await read_body(response.aiter_bytes())
    except StreamError as exc:
        raise UnusableReply(f"model server sent an unusable reply: {exc}") from None
    except httpx.DecodingError as exc:
        raise UnusableReply(f"model server sent an unusable reply: a body that cannot be decoded: {exc}") from None
    finally:
        await response.aclose()
    return with_body(response, content)
