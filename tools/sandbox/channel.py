"""The server's side of the pipe pair to a local sandbox's Python worker (`worker.serve`):
one JSON line per request and per reply, each request with an id its reply echoes, and the
watch over the worker's CPU time while a cell runs.

Sandboxed code runs inside the worker, so nothing it sends is trusted: a reply that is not what
the protocol says ends the worker (`ChannelError`), and a reply to an earlier request (one the
server stopped waiting for) is dropped. The CPU watch reads /proc, outside the code's reach,
because code may raise its own soft RLIMIT_CPU (and, running as root, the hard one too).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nanbeige.tools.sandbox.sandbox_config import MB

log = logging.getLogger(__name__)

REPLY_LIMIT = 64 * MB
CPU_CHECK_S = 0.1  # how often a running cell's CPU time is read
CPU_GRACE_S = 1.5  # the worker's own limit (up to a second over the budget) stops a cell first, keeping its state
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ChannelError(Exception):
    """The worker cannot go on: `kind` is timeout, cpu, eof (it died) or protocol; the message says more."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Channel:
    requests: int
    """Write end of the request pipe."""
    replies: int
    """Read end of the reply pipe."""
    pid: int = 0
    """The worker as the server sees it, for its CPU time."""
    sent: list[str] = field(default_factory=list)
    """The ids of the latest requests: random, so that code in the worker cannot write the reply to
    a request before it is made."""
    buffer: bytearray = field(default_factory=bytearray)


def read_line(channel: Channel, deadline: float, check: Callable[[], None] | None = None) -> bytes:
    """One line from the reply pipe; check() runs whenever the pipe stays quiet CPU_CHECK_S."""
    while (end := channel.buffer.find(b"\n")) < 0:
        if len(channel.buffer) > REPLY_LIMIT:
            raise ChannelError("protocol", f"a reply longer than {REPLY_LIMIT // MB} MB")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelError("timeout")
        ready, _, _ = select.select([channel.replies], [], [], min(left, CPU_CHECK_S) if check else left)
        if not ready:
            if check:
                check()
            continue
        chunk = os.read(channel.replies, 1 << 16)
        if not chunk:
            raise ChannelError("eof")
        channel.buffer += chunk
    line = bytes(channel.buffer[: end + 1])
    del channel.buffer[: end + 1]
    return line


def exchange(channel: Channel, request: dict, deadline: float, cpu_seconds: float | None = None) -> dict:
    """Sends request with a new id and returns the reply that carries it. With cpu_seconds,
    the worker is stopped (ChannelError cpu) once it has used that much CPU time plus a grace."""
    number = secrets.token_hex(8)
    channel.sent = [*channel.sent[-15:], number]
    budget = cpu_time(channel.pid) + cpu_seconds + CPU_GRACE_S if cpu_seconds is not None else 0.0

    def over_budget() -> None:
        if cpu_time(channel.pid) > budget:
            raise ChannelError("cpu")

    try:
        os.write(channel.requests, json.dumps({"id": number, **request}).encode() + b"\n")
    except OSError:
        raise ChannelError("eof") from None
    while True:
        line = read_line(channel, deadline, over_budget if cpu_seconds is not None else None)
        try:
            reply = json.loads(line)
        except ValueError:
            raise ChannelError("protocol", "a reply that is not JSON") from None
        got = reply.get("id") if isinstance(reply, dict) else None
        if got == number:
            return reply
        if got in channel.sent[:-1]:
            log.warning("local sandbox: dropped a late reply to request %s (waiting for %s)", got, number)
            continue
        raise ChannelError("protocol", f"a reply with id {got!r} to request {number}")


def check_cell_reply(reply: dict) -> dict:
    """The reply to a cell, if it has the fields and types `format_execution` needs."""
    error = reply.get("error")
    if not (
        isinstance(reply.get("results"), list)
        and all(isinstance(r, str) for r in reply["results"])
        and isinstance(reply.get("stdout"), str)
        and isinstance(reply.get("stderr"), str)
        and (
            error is None
            or isinstance(error, dict)
            and all(isinstance(error.get(k), str) for k in ("name", "value", "traceback"))
        )
    ):
        raise ChannelError("protocol", "a reply to a cell without results, stdout, stderr and error")
    return reply


def cpu_time(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
