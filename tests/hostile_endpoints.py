"""Loopback model servers that answer like a hostile or broken endpoint: they list the fake model as
`FakeOpenAI` does (so a pool takes them in), then answer every completion request badly: a reply
trickled a byte at a time, a stream of keep-alive comments that never ends, a 200 that is no completion,
an event line that never ends, a body far past any reply's size."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from fake_openai import _Server

# the model list of `FakeOpenAI`'s default server, so that a pool takes both as serving one model
MODELS = {
    "object": "list",
    "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "organization-owner"}],
}
Answer = Callable[["HostileHandler", dict[str, Any]], None]


class HostileEndpoint:
    """Run with `with HostileEndpoint(answer) as server:`; every completion request is answered by
    `answer(handler, request)`. `sent` counts the body bytes written; `requests` holds what was asked.
    With `list_every_s` the model list too is trickled, a byte every `list_every_s`."""

    def __init__(self, answer: Answer, list_every_s: float | None = None):
        self.answer = answer
        self.list_every_s = list_every_s
        self.requests: list[dict[str, Any]] = []
        self.sent = 0
        self.closed = threading.Event()  # set on exit: answers that would go on forever stop
        handler = type("Handler", (HostileHandler,), {"endpoint": self})
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def __enter__(self) -> HostileEndpoint:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closed.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class HostileHandler(BaseHTTPRequestHandler):
    endpoint: HostileEndpoint
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each trickled byte goes out on its own

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps(MODELS).encode() if self.path.endswith("/models") else b"{}"
        self.send_response(200 if self.path.endswith("/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        every_s = self.endpoint.list_every_s
        with contextlib.suppress(OSError):
            for byte in [body] if every_s is None else [bytes([b]) for b in body]:
                if every_s is not None and not self.going_on(every_s):
                    return
                self.write(byte)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.endpoint.requests.append(request)
        with contextlib.suppress(OSError):  # the client hung up: it gave up on this answer
            self.endpoint.answer(self, request)

    def head(self, content_type: str, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length" if length is not None else "Transfer-Encoding", str(length or "chunked"))
        self.end_headers()

    def write(self, data: bytes, chunked: bool = False) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data)
        self.wfile.flush()
        self.endpoint.sent += len(data)

    def going_on(self, every_s: float) -> bool:
        """Wait `every_s`; False once the server is closing."""
        return not self.endpoint.closed.wait(every_s)


def trickle(every_s: float) -> Answer:
    """A slowloris: the headers at once, then the body a byte every `every_s`, never the end of it. A
    streamed request gets an event stream of `: ping` keep-alive comments instead, one every `every_s`."""
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "x" * 10_000}}]}).encode()

    def answer(handler: HostileHandler, request: dict[str, Any]) -> None:
        if request.get("stream"):
            handler.head("text/event-stream")
            while handler.going_on(every_s):
                handler.write(b": ping\n\n", chunked=True)
            return
        handler.head("application/json", len(body))
        for byte in body:
            if not handler.going_on(every_s):
                return
            handler.write(bytes([byte]))

    return answer


def garbage(handler: HostileHandler, request: dict[str, Any]) -> None:
    """A 200 whose body is JSON but no completion, streamed or not."""
    data = json.dumps({"object": "chat.completion", "choices": [], "note": "all is well"}).encode()
    handler.head("application/json", len(data))
    handler.write(data)


def endless_line(handler: HostileHandler, request: dict[str, Any]) -> None:
    """An event stream whose first `data:` line never ends: 64 KB pieces of one reply's text without a
    line end, up to 100 MB."""
    handler.head("text/event-stream")
    handler.write(b'data: {"choices": [{"index": 0, "delta": {"content": "', chunked=True)
    piece = b"a" * 65536
    while handler.endpoint.sent < 100 * 2**20 and not handler.endpoint.closed.is_set():
        handler.write(piece, chunked=True)


def oversized(size: int) -> Answer:
    """A 200 that is a well-formed completion of `size` bytes, its Content-Length said, written 1 MB at a time."""
    head = b'{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "'
    tail = b'"}}]}'

    def answer(handler: HostileHandler, request: dict[str, Any]) -> None:
        handler.head("application/json", size)
        handler.write(head)
        left = size - len(head) - len(tail)
        while left > 0 and not handler.endpoint.closed.is_set():
            handler.write(b"a" * min(left, 2**20))
            left -= min(left, 2**20)
        handler.write(tail)

    return answer
