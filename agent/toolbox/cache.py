"""The tool-result cache: one SQLite file that records what tool calls returned and serves the same
results again (`--cache PATH`), or serves only from it (`--replay`).

A row is keyed by server, tool and the canonical JSON of the arguments (sorted keys, no spaces), and
holds the text the tool answered (before the cut to the result size limit, so a run with another
`--max-result-chars` reads what a live call would have given it), whether it was an error, whether it
succeeded, when it was recorded, and its origin: the name and version the server gave for itself and
a digest of the tool's description and schema. Secrets are taken out of every column (the arguments
too: a model may quote a key), so the file holds no key the runtime knows.

A cache file is untrusted input like any other. Its schema must be exactly the one table nanbeige
makes (a trigger, view, index or other table in it could run or rewrite something on each write, so
such a file is refused). A row whose columns have the wrong types is never served (a live run calls the
tool instead and records a good row; a replay stops, naming the row); nor is a row recorded from another
server, or another version of the server or of its tool (a replay says which origin the row came from).
The origin is public, so a row could be forged to match it: each row carries an HMAC made with this
user's own key (`cache.key` in their config folder, made 0600 on first use, never in the cache file),
and a row that does not verify is not served. A cache made on another machine is served once the user
accepts it (`nanbeige cache accept PATH`, which signs its rows with their key).

What is recorded: every answer a tool gave, its own error results included (a 404 page, bad
arguments). What is not: calls that got no answer (a timeout, a server that stopped: the runtime
wrote those results, and trying again may work), and the Python sandbox (`tool-python`: code runs
with side effects and state, so its results belong to one run). A recorded failure (an error result,
or the web tools' `"success": false`: often a rate limit or an outage) is replayed, but a live run
calls the tool again rather than reuse it, and records the newer answer.

Replay serves every recorded answer, failures too, and never reaches a tool, except the sandbox,
which runs for real (it is local and free). A call with no recorded answer raises `ReplayMiss`: the
run stops as `replay_miss` instead of going on with results the recorded run never saw.

Many runs in one process share one `ToolCache`; its one connection lives in a thread of its own, so
the asyncio loop never waits on the file. Several processes may use one file at once: WAL mode lets
readers go on while one writes, and a writer waits its turn (up to `BUSY_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import random
import re
import secrets
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nanbeige.agent.toolbox.cache_schema import check_schema
from nanbeige.agent.user_dirs import config_dir
from nanbeige.tools.errors import NanbeigeError

BUSY_TIMEOUT_S = 60.0
UNCACHED_SERVERS = ("tool-python",)
"""Servers whose calls are never recorded or served: their results depend on state and effects."""

KEY_FILE = "cache.key"
NOT_SIGNED = "it was not recorded by this user on this machine (its signature does not match the key in"


class CacheError(NanbeigeError):
    """The cache file cannot be used: something the user must fix."""


class ReplayMiss(Exception):
    """A replay met a tool call the cache holds no answer for."""


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """The arguments as canonical JSON: `{"b":1,"a":2}` and `{"a": 2, "b": 1}` give the same text."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def succeeded(text: str, is_error: bool) -> bool:
    """Whether an answer is worth reusing: not an error, and not a web tool's `"success": false`."""
    if is_error:
        return False
    if '"success"' not in text or not text.lstrip().startswith("{"):
        return True
    try:
        return json.loads(text).get("success") is not False
    except (ValueError, AttributeError):
        return True


def malformed(row: tuple) -> str:
    """What is wrong with a row's columns, or "" (SQLite keeps whatever type a writer gave a column)."""
    text, is_error, ok, origin, mac = row
    if type(text) is not str:
        return f"its text is {type(text).__name__}, not text"
    for name, flag in (("is_error", is_error), ("succeeded", ok)):
        if type(flag) is not int or flag not in (0, 1):
            return f"its {name} is {flag!r}, not 0 or 1"
    for name, value in (("origin", origin), ("mac", mac)):
        if type(value) is not str:
            return f"its {name} is {type(value).__name__}, not text"
    return ""


# ---------------------------------------------------------------- signing rows


def key_path() -> Path:
    """Where this user's cache key lives: their own config folder (`$XDG_CONFIG_HOME`, else `~/.config`)."""
    return config_dir() / KEY_FILE


def user_key(path: Path | None = None) -> bytes:
    """The key this user signs the rows they record with, made on first use. A key others can read
    could sign forged rows, so one that is not the user's alone is refused."""
    path = path or key_path()
    try:
        if not path.exists():
            _make_key(path)
        text, mode = path.read_text(encoding="ascii"), path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheError(f"cannot read or make the cache key {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if os.name == "posix" and mode & 0o077:
        raise CacheError(f"the cache key {path} can be read by other users: chmod 600 {path}")
    if not re.fullmatch(r"[0-9a-f]{64}\n?", text):
        raise CacheError(
            f"the cache key {path} is damaged: delete it (a new one is made; the rows signed with the "
            "old one are then asked again)"
        )
    return bytes.fromhex(text.strip())


def _make_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(secrets.token_hex(32) + "\n")
        os.link(temporary, path)  # in place whole or not at all; where another process made one first, it is kept
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)


def signature(
    key: bytes, server: str, tool: str, arguments: str, text: str, is_error: int, ok: int, origin: str
) -> str:
    """The row's HMAC-SHA256 under the user's key, over every column that decides what is served."""
    message = json.dumps([server, tool, arguments, text, is_error, ok, origin]).encode()  # ASCII: any text encodes
    return hmac.new(key, message, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- the file


def connect(path: Path, replay: bool) -> sqlite3.Connection:
    """The file opened in WAL mode with its schema checked (`CacheError` for a file that cannot be used)."""
    if replay and not path.is_file():
        raise CacheError(f"--replay: there is no cache file {path}; record one first with --cache")
    if path.is_dir():
        raise CacheError(f"--cache {path} is a folder; give a file path")
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        db = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # in WAL mode: no fsync per write, never corrupt
            db.execute("BEGIN IMMEDIATE")  # the write lock first: a reader cannot upgrade while others write
            check_schema(db, replay)
            db.execute("COMMIT")
            return db
        except (sqlite3.Error, OSError) as exc:
            if db is not None:
                db.close()
            # Switching a new file to WAL while other processes open it can be refused at once, busy
            # timeout or not: another try a moment later succeeds
            if "locked" in str(exc) and time.monotonic() < deadline:
                time.sleep(random.uniform(0.02, 0.2))
                continue
            raise CacheError(f"cannot use {path} as a tool-result cache: {exc}") from None


def accept(path: Path) -> tuple[int, int]:
    """Sign every well-formed row of a cache made elsewhere with this user's key, so that its rows are
    served here (their origins are still checked); returns the rows signed and the malformed ones left."""
    if not path.is_file():
        raise CacheError(f"{path}: no such cache file")
    key, db = user_key(), connect(path, replay=True)
    try:
        db.execute("BEGIN IMMEDIATE")
        rows = db.execute(
            "SELECT server, tool, arguments, text, is_error, succeeded, origin, mac FROM tool_results"
        ).fetchall()
        good = [row for row in rows if all(type(v) is str for v in row[:3]) and not malformed(row[3:])]
        db.executemany(
            "UPDATE tool_results SET mac = ? WHERE server = ? AND tool = ? AND arguments = ?",
            [(signature(key, *row[:7]), *row[:3]) for row in good],
        )
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise CacheError(f"cannot sign the rows of {path}: {exc}") from None
    finally:
        db.close()
    return len(good), len(rows) - len(good)


class ToolCache:
    """One cache file, shared by every run of a command. Open with `await ToolCache.open(...)`."""

    def __init__(self, path: Path, replay: bool = False, notice: Callable[[str], None] | None = None):
        self.path = path
        self.replay = replay
        """Serve only from the file; never write to it."""
        self.notice = notice
        """Says once that the file holds rows this user did not sign (a live run asks their tools again)."""
        self.hits = 0
        self.misses = 0
        """Calls the cache could serve but did not (the tool was called instead)."""
        self.errors = 0
        """Reads and writes the file refused (a disk that is full, a lock held past the busy timeout)."""
        self.last_error = ""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-cache")
        self._db: sqlite3.Connection | None = None
        self._key = b""
        self._said_unsigned = False

    @classmethod
    async def open(cls, path: Path, replay: bool = False, notice: Callable[[str], None] | None = None) -> ToolCache:
        cache = cls(path, replay, notice)
        try:
            cache._key = user_key()
            await cache._run(cache._connect)
        except BaseException:
            cache._thread.shutdown()
            raise
        return cache

    async def lookup(
        self, server: str, tool: str, arguments: dict[str, Any], origin: str = ""
    ) -> tuple[str, bool] | None:
        """The recorded (text, is_error) to serve for this call, or None to call the tool. Replay raises
        `ReplayMiss` where a live run would call the tool. `origin` is the live server's (see `put`)."""
        if server in UNCACHED_SERVERS:
            return None
        key = canonical_arguments(arguments)
        shown = key if len(key) <= 500 else key[:500] + "…"
        try:
            row = await self._run(self.get, server, tool, key)
        except sqlite3.Error as exc:  # a live run goes on without the cache; a replay cannot
            if self.replay:
                raise ReplayMiss(f"--replay: cannot read the cache {self.path}: {exc}") from None
            row = self._failed(exc)
        unusable = (
            ""
            if row is None
            else (malformed(row) or self._foreign(row, origin) or self._unsigned(server, tool, key, row))
        )
        if unusable and self.replay:
            raise ReplayMiss(
                f"--replay: the cache {self.path} holds an answer for {tool} on server {server} with "
                f"arguments {shown} that cannot be served: {unusable}"
            )
        if row is not None and not unusable and (self.replay or row[2]):
            self.hits += 1
            return row[0], bool(row[1])
        if self.replay:
            raise ReplayMiss(
                f"--replay: the cache {self.path} holds no answer for {tool} on server {server} with arguments {shown}"
            )
        if unusable.startswith(NOT_SIGNED) and self.notice and not self._said_unsigned:
            self._said_unsigned = True
            self.notice(
                f"the cache {self.path} holds rows not recorded here (the first: {tool} on server "
                f"{server}): they are not served, and the tools are asked again. To use a cache made "
                f"elsewhere, accept it: nanbeige cache accept {self.path}"
            )
        self.misses += 1
        return None

    def _foreign(self, row: tuple, origin: str) -> str:
        if row[3] == origin:
            return ""
        recorded = f"recorded from {row[3]!r}" if row[3] else "recorded with no origin (an older nanbeige)"
        return f"it was {recorded}, and the server now is {origin!r}"

    def _unsigned(self, server: str, tool: str, key: str, row: tuple) -> str:
        expected = signature(self._key, server, tool, key, *row[:4])
        if hmac.compare_digest(row[4].encode("utf-8", "surrogatepass"), expected.encode()):
            return ""
        return (
            f"{NOT_SIGNED} {key_path()}); if you trust whoever made the file, accept it with "
            f"`nanbeige cache accept {self.path}`"
        )

    async def record(
        self, server: str, tool: str, arguments: dict[str, Any], text: str, is_error: bool, origin: str = ""
    ) -> None:
        """Record a tool's answer (the newest answer replaces an older one)."""
        if server in UNCACHED_SERVERS or self.replay:
            return
        try:
            await self._run(self.put, server, tool, canonical_arguments(arguments), text, is_error, origin)
        except sqlite3.Error as exc:  # the answer is good all the same: the run goes on with it
            self._failed(exc)

    def _failed(self, exc: sqlite3.Error) -> None:
        self.errors, self.last_error = self.errors + 1, str(exc)

    def summary(self) -> str:
        line = f"cache: {self.hits} hit{'s' * (self.hits != 1)}, {self.misses} miss{'es' * (self.misses != 1)}"
        if self.errors:
            line += f", {self.errors} failed to read or write the file (the last: {self.last_error})"
        return line

    async def aclose(self) -> None:
        await self._run(self._close)
        self._thread.shutdown()

    # The rest runs in the cache's own thread: the connection is used by no other.

    async def _run(self, work: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(self._thread.submit(work, *args))

    def _connect(self) -> None:
        self._db = connect(self.path, self.replay)

    def get(self, server: str, tool: str, key: str) -> tuple | None:
        """The row's (text, is_error, succeeded, origin, mac), as the file holds them (see `malformed`)."""
        assert self._db is not None
        return self._db.execute(
            "SELECT text, is_error, succeeded, origin, mac FROM tool_results "
            "WHERE server = ? AND tool = ? AND arguments = ?",
            (server, tool, key),
        ).fetchone()

    def put(self, server: str, tool: str, key: str, text: str, is_error: bool, origin: str) -> None:
        assert self._db is not None
        flags = int(is_error), int(succeeded(text, is_error))
        self._db.execute(
            "INSERT OR REPLACE INTO tool_results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                server,
                tool,
                key,
                text,
                *flags,
                time.time(),
                origin,
                signature(self._key, server, tool, key, text, *flags, origin),
            ),
        )

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
