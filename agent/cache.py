"""The tool-result cache: one SQLite file that records what tool calls returned and serves the same
results again (`--cache PATH`), or serves only from it (`--replay`).

A row is keyed by server, tool and the canonical JSON of the arguments (sorted keys, no spaces), and
holds the text the tool answered (before the cut to the result size limit, so a run with another
`--max-result-chars` reads what a live call would have given it), whether it was an error, whether it
succeeded, when it was recorded, and its origin: the name and version the server gave for itself and
a digest of the tool's description and schema. Secrets are taken out of every column (the arguments
too: a model may quote a key), so the file holds no key the runtime knows.

A cache file is untrusted input like any other: a row whose columns have the wrong types is never
served (a live run calls the tool instead and records a good row; a replay stops, naming the row), and
a row recorded from another server, or another version of the server or of its tool, is not served
either: a live run calls the tool again, a replay stops and says which origin the row came from.

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
import json
import random
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2  # 2: the origin column
BUSY_TIMEOUT_S = 60.0
UNCACHED_SERVERS = ("tool-python",)
"""Servers whose calls are never recorded or served: their results depend on state and effects."""

SCHEMA = """CREATE TABLE IF NOT EXISTS tool_results (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    text TEXT NOT NULL,
    is_error INTEGER NOT NULL,
    succeeded INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (server, tool, arguments)
) WITHOUT ROWID"""


class CacheError(Exception):
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
    text, is_error, ok, origin = row
    if type(text) is not str:
        return f"its text is {type(text).__name__}, not text"
    for name, flag in (("is_error", is_error), ("succeeded", ok)):
        if type(flag) is not int or flag not in (0, 1):
            return f"its {name} is {flag!r}, not 0 or 1"
    if type(origin) is not str:
        return f"its origin is {type(origin).__name__}, not text"
    return ""


class ToolCache:
    """One cache file, shared by every run of a command. Open with `await ToolCache.open(...)`."""

    def __init__(self, path: Path, replay: bool = False):
        self.path = path
        self.replay = replay
        """Serve only from the file; never write to it."""
        self.hits = 0
        self.misses = 0
        """Calls the cache could serve but did not (the tool was called instead)."""
        self.errors = 0
        """Reads and writes the file refused (a disk that is full, a lock held past the busy timeout)."""
        self.last_error = ""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-cache")
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: Path, replay: bool = False) -> ToolCache:
        cache = cls(path, replay)
        try:
            await cache._run(cache._connect)
        except BaseException:
            cache._thread.shutdown()
            raise
        return cache

    async def lookup(self, server: str, tool: str, arguments: dict[str, Any],
                     origin: str = "") -> tuple[str, bool] | None:
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
        unusable = row is not None and (malformed(row) or self._foreign(row, origin))
        if unusable and self.replay:
            raise ReplayMiss(f"--replay: the cache {self.path} holds an answer for {tool} on server {server} with "
                             f"arguments {shown} that cannot be served: {unusable}")
        if row is not None and not unusable and (self.replay or row[2]):
            self.hits += 1
            return row[0], bool(row[1])
        if self.replay:
            raise ReplayMiss(f"--replay: the cache {self.path} holds no answer for {tool} on server {server} "
                             f"with arguments {shown}")
        self.misses += 1
        return None

    def _foreign(self, row: tuple, origin: str) -> str:
        if row[3] == origin:
            return ""
        recorded = f"recorded from {row[3]!r}" if row[3] else "recorded with no origin (an older nanbeige)"
        return f"it was {recorded}, and the server now is {origin!r}"

    async def record(self, server: str, tool: str, arguments: dict[str, Any], text: str, is_error: bool,
                     origin: str = "") -> None:
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
        if self.replay and not self.path.is_file():
            raise CacheError(f"--replay: there is no cache file {self.path}; record one first with --cache")
        if self.path.is_dir():
            raise CacheError(f"--cache {self.path} is a folder; give a file path")
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # in WAL mode: no fsync per write, never corrupt
                self._db.execute("BEGIN IMMEDIATE")  # the write lock first: a reader cannot upgrade while others write
                self._check_schema()
                self._db.execute("COMMIT")
                return
            except (sqlite3.Error, OSError) as exc:
                self._close()
                # Switching a new file to WAL while other processes open it can be refused at once, busy
                # timeout or not: another try a moment later succeeds
                if "locked" in str(exc) and time.monotonic() < deadline:
                    time.sleep(random.uniform(0.02, 0.2))
                    continue
                raise CacheError(f"cannot use {self.path} as a tool-result cache: {exc}") from None

    def _check_schema(self) -> None:
        assert self._db is not None
        tables = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if (tables and "tool_results" not in tables) or (self.replay and not tables):
            raise sqlite3.DatabaseError("it is another SQLite file, not a tool-result cache")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"it was written by a newer nanbeige (format {version})")
        if not tables:
            self._db.execute(SCHEMA)
        elif version < SCHEMA_VERSION:  # format 1 had no origin: its rows read as recorded from no server
            self._db.execute("ALTER TABLE tool_results ADD COLUMN origin TEXT NOT NULL DEFAULT ''")
        if version != SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def get(self, server: str, tool: str, key: str) -> tuple | None:
        """The row's (text, is_error, succeeded, origin), as the file holds them (see `malformed`)."""
        assert self._db is not None
        return self._db.execute("SELECT text, is_error, succeeded, origin FROM tool_results "
                                "WHERE server = ? AND tool = ? AND arguments = ?", (server, tool, key)).fetchone()

    def put(self, server: str, tool: str, key: str, text: str, is_error: bool, origin: str) -> None:
        assert self._db is not None
        self._db.execute("INSERT OR REPLACE INTO tool_results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (server, tool, key, text, int(is_error), int(succeeded(text, is_error)), time.time(), origin))

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
