"""The E2B sandbox backend: cloud sandboxes through the synchronous `e2b_code_interpreter.Sandbox`
API (needs `E2B_API_KEY`). Calls run in the server's worker threads.

Like the reference server the model was trained with, it connects to sandbox ids it did not
create (`Sandbox.connect`), so sandboxes outlive the server that made them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nanbeige.tools import usage
from nanbeige.tools.sandbox.answers import command_failed, format_command, invalid_id
from nanbeige.tools.sandbox.config import MB, SandboxConfig, SandboxError

log = logging.getLogger(__name__)


class E2BBackend:
    """E2B sandboxes by id; `sandbox_class` stands in for `e2b_code_interpreter.Sandbox` in tests."""

    def __init__(self, config: SandboxConfig, sandbox_class: Any = None) -> None:
        import e2b  # imported here: the SDK is heavy, and the local backend does not need it

        if sandbox_class is None:
            from e2b_code_interpreter import Sandbox as sandbox_class
        self.config = config
        self._class = sandbox_class
        self._e2b = e2b
        self._live: dict[str, Any] = {}
        self._counted: dict[str, float] = {}  # when each sandbox's alive time was last counted (E2B bills it)
        self._lock = threading.Lock()

    def create(self, timeout: int) -> str:
        options: dict[str, Any] = {"timeout": timeout, "api_key": self.config.e2b_api_key}
        if self.config.e2b_template:
            options["template"] = self.config.e2b_template
        with self._errors("create a sandbox"):
            sandbox = self._class.create(**options)
        with self._lock:
            self._live[sandbox.sandbox_id] = sandbox
            self._counted[sandbox.sandbox_id] = time.monotonic()
        return sandbox.sandbox_id

    def attach(self, sandbox_id: str, timeout: int) -> None:
        """Connects to a sandbox this server did not create (one from before a restart, say)."""
        e2b = self._e2b
        with self._errors("connect to the sandbox"):
            try:
                sandbox = self._class.connect(sandbox_id, timeout=timeout, api_key=self.config.e2b_api_key)
            except e2b.SandboxException as exc:
                # 404: no such sandbox (or no longer running); 400: not even the shape of an id
                if isinstance(exc, e2b.SandboxNotFoundException) or exc.status_code in (400, 404):
                    raise SandboxError(invalid_id(sandbox_id)) from None
                raise
        with self._lock:
            self._live.setdefault(sandbox_id, sandbox)
            self._counted.setdefault(sandbox_id, time.monotonic())

    def run_python(self, sandbox_id: str, code: str) -> str:
        with self._errors("run the code", sandbox_id):
            return str(self._get(sandbox_id).run_code(code, timeout=self.config.timeout_s))

    def run_command(self, sandbox_id: str, command: str) -> str:
        with self._errors("run the command", sandbox_id):
            try:
                result = self._get(sandbox_id).commands.run(command, timeout=self.config.timeout_s)
            except self._e2b.CommandExitException as exc:
                raise SandboxError(command_failed(exc.exit_code, exc.stderr or "")) from None
        return format_command(result.stdout, result.stderr, result.exit_code, result.error)

    def is_dir(self, sandbox_id: str, path: str) -> bool:
        return False  # decided from the path's shape alone, like the reference server

    def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        with self._errors(f"write {path}", sandbox_id):
            self._get(sandbox_id).files.write(path, data)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        with self._errors(f"read {path}", sandbox_id):
            data = bytes(self._get(sandbox_id).files.read(path, format="bytes"))
        if len(data) > max_bytes:
            raise SandboxError(f"{path} is larger than {max_bytes // MB} MB.")
        return data

    def destroy(self, sandbox_id: str) -> None:
        self._count_alive_time(sandbox_id)
        with self._lock:
            sandbox = self._live.pop(sandbox_id, None)
            self._counted.pop(sandbox_id, None)
        if sandbox is not None:
            try:
                sandbox.kill()
            except Exception as exc:  # noqa: BLE001 - it times out on E2B's side anyway
                log.warning("could not kill E2B sandbox %s: %s", sandbox_id, exc)

    def close(self) -> None:
        with self._lock:
            ids = list(self._live)
        for sandbox_id in ids:
            self.destroy(sandbox_id)

    def _get(self, sandbox_id: str) -> Any:
        with self._lock:
            sandbox = self._live.get(sandbox_id)
        if sandbox is None:
            raise SandboxError(invalid_id(sandbox_id))
        self._count_alive_time(sandbox_id)
        sandbox.set_timeout(self.config.idle_timeout_s)  # E2B counts its lifetime from the last refresh
        return sandbox

    def _count_alive_time(self, sandbox_id: str) -> None:
        """Count the sandbox's seconds alive since they were last counted against the current call."""
        now = time.monotonic()
        with self._lock:
            since = self._counted.get(sandbox_id)
            if since is not None:
                self._counted[sandbox_id] = now
        if since is not None:
            usage.add("e2b_seconds", round(now - since, 3))

    @contextmanager
    def _errors(self, action: str, sandbox_id: str | None = None) -> Iterator[None]:
        e2b = self._e2b
        try:
            yield
        except e2b.TimeoutException:
            raise SandboxError(f"Timed out after {self.config.timeout_s:g} s trying to {action}.") from None
        except e2b.NotFoundException as exc:
            if sandbox_id is not None and isinstance(exc, e2b.SandboxNotFoundException):
                with self._lock:
                    self._live.pop(sandbox_id, None)
                raise SandboxError(f"Sandbox '{sandbox_id}' no longer exists (E2B closed it). "
                                   "Please create a new sandbox using the create_sandbox tool.") from None
            raise SandboxError(f"Could not {action}: {exc}") from None
        except (e2b.SandboxException, e2b.AuthenticationException) as exc:
            raise SandboxError(f"Could not {action} on E2B: {type(exc).__name__}: {exc}") from None
