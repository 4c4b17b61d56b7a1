"""Loopback servers that speak raw bytes, for what `http.server` cannot send: status lines and headers
trickled a byte at a time (a slowloris on the headers), and bodies in nested content codings (a
decompression bomb: a few KB that inflate to 2 GiB)."""

from __future__ import annotations

import contextlib
import functools
import gzip
import socket
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

Answer = Callable[[socket.socket, "RawEndpoint"], None]
"""How a server answers a request; `server.path` is the path asked for."""


class RawEndpoint:
    """Run with `with RawEndpoint(answer) as server:`; every request (any path, any method) is answered by
    `answer(connection, server)` after its head and body are read. `closed` is set on exit."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.closed = threading.Event()
        self.path = ""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"

    def __enter__(self) -> RawEndpoint:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closed.set()
        self.listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self.closed.is_set():
                connection, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while path := read_request(connection):
                self.path = path
                self.answer(connection, self)


def read_request(connection: socket.socket) -> str:
    """Read one request's head and body; its path, or "" when the client hung up."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = connection.recv(65536)
        if not more:
            return ""
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0
    )
    while len(body) < length:
        body += connection.recv(65536)
    return head.split(b" ")[1].decode()


def slow_headers(every_s: float) -> Answer:
    """`HTTP/1.1 200 OK` and header lines a byte every `every_s`, never the blank line that ends them."""

    def answer(connection: socket.socket, server: RawEndpoint) -> None:
        head = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 100_000
        for byte in head:
            if server.closed.wait(every_s):
                return
            connection.sendall(bytes([byte]))

    return answer


def coded(body: bytes, codings: str, content_type: str = "application/json") -> Answer:
    """`body` (already coded) sent whole with `Content-Encoding: codings`."""

    def answer(connection: socket.socket, server: RawEndpoint) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Encoding: {codings}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        connection.sendall(head.encode() + body)

    return answer


def redirect_with_endless_body(connection: socket.socket, server: RawEndpoint) -> None:
    """`/start` redirects to `/end` with a body that never ends (a terabyte, said and never sent); `/end` is ok."""
    if server.path == "/end":
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return
    connection.sendall(b"HTTP/1.1 302 Found\r\nLocation: /end\r\nContent-Length: 1000000000000\r\n\r\n")
    while not server.closed.wait(0.1):
        connection.sendall(b"x" * 65536)


@functools.cache
def nested_gzip_bomb(blocks: int = 128) -> bytes:
    """gzip of a gzip stream of `blocks` × 16 MiB of zeros (128: 2 GiB, in 3.4 KB). The inner stream is one
    deflate block of 16 MiB repeated (a full flush resets the window, so each is the same bytes)."""
    zeros = bytes(1 << 24)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush()
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    inner = header + block * blocks + end + struct.pack("<II", crc, (blocks << 24) & 0xFFFFFFFF)
    return gzip.compress(inner, 9)
