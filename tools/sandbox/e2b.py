"""The E2B sandbox backend: cloud sandboxes through the synchronous `e2b_code_interpreter.Sandbox`
API (needs `E2B_API_KEY`). Calls run in the server's worker threads.

Like the reference server the model was trained with, it connects to sandbox ids it did not
create (`Sandbox.connect`), so sandboxes outlive the server that made them.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nanbeige.tools import paid_units
from nanbeige.tools.sandbox.answers import command_failed, format_command, invalid_id
from nanbeige.tools.sandbox.program_runs import ProgramRun
from nanbeige.tools.sandbox.sandbox_config import MB, SANDBOX_HOME, SandboxConfig, SandboxError

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launch.py")
PYTHON = "python3"
"""The interpreter of E2B's sandboxes (its code-interpreter template's)."""
NETWORK_SLACK_S = 30.0
"""How much longer than a program's own limit (kept by the launcher, by the sandbox's clock) this side waits
for its command to end: the round trips to E2B, never the program's time."""
NO_STDIN = (
    "code-tests on E2B needs a sandbox that can close a command's stdin (envd 0.3 or later: rebuild the template)"
)


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

    def run_program(
        self,
        sandbox_id: str,
        args: list[str],
        stdin: bytes = b"",
        timeout_s: float | None = None,
        cpu_seconds: int | None = None,
        memory_mb: int | None = None,
    ) -> ProgramRun:
        """Runs a program (args, in the sandbox's home) as `LocalBackend.run_program` does: `stdin` handed
        over on the command's stdin (never a file), its limits kept inside the sandbox by the launcher
        (`launch.py`). A program that ends its sandbox or its launcher is its own failure when a known-good
        program runs in a fresh sandbox after it; otherwise the machine failed and `SandboxError` is raised."""
        c = self.config
        timeout = timeout_s or c.timeout_s
        nonce, started = secrets.token_hex(16), time.monotonic()
        command = shlex.join(
            [
                PYTHON,
                "-I",
                "-B",
                "-c",
                LAUNCHER.read_text(encoding="utf-8"),
                repr(timeout),
                str(cpu_seconds or c.cpu_seconds),
                str(memory_mb or c.memory_mb),
                str(4 * c.max_output_chars),
                *args,
            ]
        )
        try:
            result = self._launch(
                self._get(sandbox_id), command, nonce.encode() + b"\n" + stdin, timeout + NETWORK_SLACK_S
            )
        except self._e2b.TimeoutException:  # its launcher stopped answering (a program can stop it)
            return ProgramRun(exit_code=-9, stdout=b"", stderr=b"", seconds=timeout, timed_out=True)
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - the sandbox went away while the program ran
            result = None
            said = self._secret_free(f"{type(exc).__name__}: {exc}")
        run = launched(result, nonce) if result is not None else None
        if run is not None:
            return run
        said = said if result is None else f"exit {result.exit_code}: {result.stderr[-300:]}"
        if broken := self.known_good_fails():
            raise SandboxError(
                f"the E2B sandbox ended while the program ran ({said}), and a known-good program "
                f"failed in a fresh sandbox too ({broken})"
            )
        return ProgramRun(
            exit_code=-9,
            stdout=(result.stdout if result else "").encode(),
            stderr=b"",
            seconds=time.monotonic() - started,
            timed_out=False,
            reported=False,
            killed_sandbox=True,
        )

    def _launch(self, sandbox: Any, command: str, stdin: bytes, wait_s: float) -> Any:
        """The command's result (a non-zero exit too) once it ended; its stdin closed after `stdin`."""
        e2b = self._e2b
        handle = sandbox.commands.run(command, background=True, stdin=True, cwd=SANDBOX_HOME, timeout=wait_s)
        try:
            handle.send_stdin(stdin)
            handle.close_stdin()
        except e2b.SandboxException as exc:
            if "closing stdin" in str(exc):  # the SDK's words for an envd too old for it
                handle.kill()
                raise SandboxError(NO_STDIN) from None
            raise
        try:
            return handle.wait()
        except e2b.CommandExitException as exc:
            return exc
        except e2b.TimeoutException:
            handle.kill()
            raise

    def known_good_fails(self) -> str:
        """How a known-good program failed in a fresh sandbox through the launcher; empty when it ran as it
        should. Asked before the first program (a judge that cannot grade says so at once) and after a
        program's sandbox ended."""
        try:
            sandbox_id = self.create(int(self.config.idle_timeout_s))
        except SandboxError as exc:
            return f"it could not be made: {exc}"
        try:
            run = self.run_program_once(sandbox_id)
        except SandboxError as exc:
            if str(exc) == NO_STDIN:
                raise  # a refusal of its own: what the sandbox lacks, not that it failed
            return f"it could not run: {exc}"
        except Exception as exc:  # noqa: BLE001 - any failure here is the machine's
            return self._secret_free(f"it could not run: {type(exc).__name__}: {exc}")
        finally:
            self.destroy(sandbox_id)
        if run is not None and run.exit_code == 0 and run.stdout == b"42\n":
            return ""
        return "it did not print 42" if run is None else f"exit {run.exit_code}: {run.stderr[-300:]!r}"

    def run_program_once(self, sandbox_id: str) -> ProgramRun | None:
        nonce = secrets.token_hex(16)
        command = shlex.join(
            [
                PYTHON,
                "-I",
                "-B",
                "-c",
                LAUNCHER.read_text(encoding="utf-8"),
                "30",
                "30",
                str(self.config.memory_mb),
                "1024",
                PYTHON,
                "-I",
                "-S",
                "-c",
                "print(6 * 7)",
            ]
        )
        return launched(self._launch(self._get(sandbox_id), command, nonce.encode() + b"\n", 60.0), nonce)

    def _secret_free(self, text: str) -> str:
        key = self.config.e2b_api_key
        return text.replace(key, "[E2B_API_KEY]") if key else text

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
            paid_units.add("e2b_seconds", round(now - since, 3))

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
                raise SandboxError(
                    f"Sandbox '{sandbox_id}' no longer exists (E2B closed it). "
                    "Please create a new sandbox using the create_sandbox tool."
                ) from None
            raise SandboxError(self._secret_free(f"Could not {action}: {exc}")) from None
        except (e2b.SandboxException, e2b.AuthenticationException) as exc:
            raise SandboxError(self._secret_free(f"Could not {action} on E2B: {type(exc).__name__}: {exc}")) from None


def launched(result: Any, nonce: str) -> ProgramRun | None:
    """The run the launcher reported on its last stderr line (with the run's nonce, which the program never
    sees); None when that line is missing: the launcher, or its sandbox, ended first."""
    stderr, _, last = result.stderr.rstrip("\n").rpartition("\n")
    try:
        report = json.loads(last)
    except ValueError:
        return None
    if not isinstance(report, dict) or report.get("launched") != nonce:
        return None
    return ProgramRun(
        exit_code=int(report["exit"]),
        stdout=result.stdout.encode(),
        stderr=stderr.encode(),
        seconds=float(report["seconds"]),
        timed_out=bool(report["timed_out"]),
    )
