"""The open sandboxes of one `tool-python` server: `Sandboxes` holds what the MCP server offers (create,
run Python, run a command, move files in and out), the sandbox ids, their leases and the idle timer
that closes them, over one of two backends (`make_backend`):

- `e2b.E2BBackend`: E2B cloud sandboxes through `e2b-code-interpreter` (needs `E2B_API_KEY`).
- `local.LocalBackend`: a folder and a persistent Python process per sandbox on this machine,
  under OS limits (see that module).

Both answer in the text shapes of E2B's SDK (`answers.py`): what the model saw during training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from nanbeige.tools.sandbox.answers import invalid_id, placeholder_answer, truncate
from nanbeige.tools.sandbox.e2b import E2BBackend
from nanbeige.tools.sandbox.local import LocalBackend
from nanbeige.tools.sandbox.sandbox_config import MB, SANDBOX_HOME, SandboxConfig, SandboxError
from nanbeige.tools.sandbox.transfer import allowed_local_file, fetch_url, write_local_file

log = logging.getLogger(__name__)


@dataclass
class Lease:
    idle_timeout_s: float
    last_used: float
    busy: int = 0
    """Calls using the sandbox now: one in use is never idle, however long the call takes."""


DEFAULT_TIMEOUT = 600  # create_sandbox's default in the signature the model was trained with
REAP_EVERY_S = 1.0  # the longest the idle timer sleeps: a sandbox made meanwhile is closed at most this late


def idle_seconds(timeout: Any, limit: int) -> int:
    """create_sandbox's `timeout` as whole seconds in 1..limit (a fraction is dropped, as int() does), or a
    SandboxError naming the range and the value. The default, 600, means `limit` where that is less: the
    model may leave it out on a server whose operator allows less."""
    allowed = f"timeout must be a whole number of seconds from 1 to {limit}, not {timeout!r}."
    if isinstance(timeout, str) and timeout.strip().isdecimal():  # the schema is untyped: a model may quote it
        timeout = int(timeout)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or timeout != timeout
        or timeout in (float("inf"), float("-inf"))
    ):
        raise SandboxError(allowed)
    if timeout == DEFAULT_TIMEOUT:
        return min(DEFAULT_TIMEOUT, limit)
    if not 1 <= int(timeout) <= limit:
        raise SandboxError(allowed)
    return int(timeout)


def make_backend(config: SandboxConfig) -> Any:
    if config.backend == "e2b":
        return E2BBackend(config)
    return LocalBackend(config)


class Sandboxes:
    """The open sandboxes of one server and the tool operations on them.

    A backend provides create(timeout) -> id, attach(id, timeout) (take up a sandbox this server
    did not create, or raise SandboxError), run_python(id, code), run_command(id, command),
    is_dir(id, path), write_file(id, path, data), read_file(id, path, max_bytes), destroy(id), close().
    """

    def __init__(self, config: SandboxConfig, backend: Any = None) -> None:
        self.config = config
        self.backend = backend or make_backend(config)
        self._lock = threading.Lock()
        self._open: dict[str, Lease] = {}
        self._gone: dict[str, str] = {}
        self._reaper: threading.Thread | None = None
        self._closing: threading.Event | None = None  # set once the close under way is over

    def create(self, timeout: Any = DEFAULT_TIMEOUT) -> str:
        timeout = idle_seconds(timeout, self.config.idle_timeout_s)
        self._close_idle()
        with self._lock:
            evict = sorted(self._open, key=lambda i: self._open[i].last_used)[
                : max(0, len(self._open) + 1 - self.config.max_sandboxes)
            ]
        for old in evict:
            self._close(
                old,
                f"Sandbox '{old}' was closed because more than {self.config.max_sandboxes} sandboxes "
                "were open. Please create a new sandbox using the create_sandbox tool.",
            )
        sandbox_id = self.backend.create(timeout)
        with self._lock:
            self._open[sandbox_id] = Lease(timeout, time.monotonic())
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="sandbox-idle-timer", daemon=True)
                self._reaper.start()
        notice = getattr(self.backend, "notice", "")  # isolation it lacks, never claimed
        return f"Sandbox created with sandbox_id: {sandbox_id}" + (f"\n{notice}" if notice else "")

    def start(self) -> None:
        """Lets the backend get ready (the local one finds its isolation and says what it lacks)."""
        if start := getattr(self.backend, "start", None):
            start()

    def run_python(self, code_block: str, sandbox_id: str) -> str:
        with self._use(sandbox_id) as real_id:
            return truncate(self.backend.run_python(real_id, code_block), self.config.max_output_chars)

    def run_command(self, command: str, sandbox_id: str) -> str:
        with self._use(sandbox_id) as real_id:
            return truncate(self.backend.run_command(real_id, command), self.config.max_output_chars)

    def upload(self, sandbox_id: str, local_file_path: str, sandbox_file_path: str = SANDBOX_HOME) -> str:
        with self._use(sandbox_id) as real_id:  # the id first: a placeholder is answered before the file
            source = allowed_local_file(local_file_path, self.config.upload_dirs)
            if source.stat().st_size > self.config.file_size_mb * MB:
                raise SandboxError(f"{local_file_path} is larger than the {self.config.file_size_mb} MB file limit.")
            target = self._target(real_id, sandbox_file_path, source.name)
            self.backend.write_file(real_id, target, source.read_bytes())
        return f"File uploaded to {target}"

    def download_url(self, sandbox_id: str, url: str, sandbox_file_path: str = SANDBOX_HOME) -> str:
        with self._use(sandbox_id) as real_id:
            data, name = fetch_url(url, self.config)
            target = self._target(real_id, sandbox_file_path, name)
            self.backend.write_file(real_id, target, data)
        return f"File downloaded to {target}"

    def download_to_local(self, sandbox_id: str, sandbox_file_path: str, local_filename: str | None = None) -> str:
        with self._use(sandbox_id) as real_id:
            data = self.backend.read_file(real_id, sandbox_file_path, self.config.file_size_mb * MB)
        folder = self.config.download_dir or self.config.root / "downloads"
        target = write_local_file(folder, local_filename or PurePosixPath(sandbox_file_path).name, data)
        return f"File downloaded successfully to: {target}"

    def close(self) -> None:
        """Closes every sandbox; safe from any thread, at once. A call made while another is closing
        returns when that one is over: a server stopping on a signal must not exit halfway through."""
        with self._lock:
            under_way, self._closing = self._closing, self._closing or threading.Event()
            closing = self._closing
            if under_way is None:
                self._gone.update({i: invalid_id(i) for i in self._open})
                self._open.clear()
        if under_way is not None:
            under_way.wait()
            return
        try:
            self.backend.close()  # all of them together: faster than one by one
        finally:
            with self._lock:
                self._closing = None
            closing.set()

    @contextmanager
    def _use(self, sandbox_id: str) -> Iterator[str]:
        # A placeholder or an empty id is never looked up: neither can name a sandbox, and asking
        # E2B about one would only cost a round trip to learn so.
        if sandbox_id in self.config.placeholder_ids and self.config.placeholder_text is not None:
            raise SandboxError(placeholder_answer(self.config.placeholder_text, sandbox_id))
        if not sandbox_id or sandbox_id in self.config.placeholder_ids:
            raise SandboxError(invalid_id(sandbox_id))
        self._close_idle()
        with self._lock:
            lease = self._open.get(sandbox_id)
            if lease is None and sandbox_id in self._gone:
                raise SandboxError(self._gone[sandbox_id])
            if lease is not None:
                lease.busy += 1  # under the lock: the idle timer cannot take it from here on
        if lease is None:
            lease = self._attach(sandbox_id)
        try:
            yield sandbox_id
        finally:
            with self._lock:
                lease.busy -= 1
                lease.last_used = time.monotonic()

    def _attach(self, sandbox_id: str) -> Lease:
        """An id this server did not create: E2B sandboxes outlive the server that made them."""
        self.backend.attach(sandbox_id, self.config.idle_timeout_s)
        with self._lock:
            lease = self._open.setdefault(sandbox_id, Lease(self.config.idle_timeout_s, time.monotonic()))
            lease.busy += 1
            return lease

    def _close_idle(self) -> float:
        """Closes the sandboxes unused past their timeout; returns the seconds until the next one is due."""
        now, due = time.monotonic(), REAP_EVERY_S
        with self._lock:
            idle = [
                (i, lease)
                for i, lease in self._open.items()
                if not lease.busy and now - lease.last_used > lease.idle_timeout_s
            ]
            for sandbox_id, lease in idle:
                del self._open[sandbox_id]
                self._gone[sandbox_id] = (
                    f"Sandbox '{sandbox_id}' was shut down after {lease.idle_timeout_s:.0f} "
                    "s without use. Please create a new sandbox using the create_sandbox tool."
                )
            for lease in self._open.values():
                if not lease.busy:
                    due = min(due, lease.last_used + lease.idle_timeout_s - now)
        for sandbox_id, _ in idle:
            self.backend.destroy(sandbox_id)
        return due

    def _reap(self) -> None:
        """The idle timer: closes each sandbox when its timeout passes, not at the next call, so that an
        abandoned one gives back its processes and disk on time. Ends when no sandbox is open."""
        while True:
            try:
                due = self._close_idle()
            except Exception:  # noqa: BLE001 - a sandbox that cannot be removed must not stop the timer
                log.exception("closing an idle sandbox failed")
                due = REAP_EVERY_S
            with self._lock:
                if not self._open:
                    self._reaper = None
                    return
            time.sleep(min(REAP_EVERY_S, max(0.01, due + 0.01)))

    def _close(self, sandbox_id: str, reason: str) -> None:
        with self._lock:
            if self._open.pop(sandbox_id, None) is None:
                return
            self._gone[sandbox_id] = reason
        self.backend.destroy(sandbox_id)

    def _target(self, sandbox_id: str, path: str, name: str) -> str:
        """Where a file called `name` goes when the model names `path`: into it when it is a folder."""
        path = path or SANDBOX_HOME
        if path.endswith("/") or not PurePosixPath(path).suffix or self.backend.is_dir(sandbox_id, path):
            return str(PurePosixPath(path) / name)
        return path
