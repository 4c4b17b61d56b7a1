"""Sandboxes where the model runs Python and shell commands: E2B's cloud, or a local one.

`Sandboxes` holds what the `tool-python` MCP server offers (create, run Python, run a command,
move files in and out), the sandbox ids and their idle timeouts, over one of two backends:

- `sandbox_e2b.E2BBackend`: E2B cloud sandboxes through `e2b-code-interpreter` (needs `E2B_API_KEY`).
- `sandbox_local.LocalBackend`: a folder and a persistent Python process per sandbox on this
  machine, under OS limits (see that module).

Both answer in the text shapes of E2B's SDK (`format_execution`, `format_command`): what the model
saw during training. Settings come from `NANBEIGE_SANDBOX_*` environment variables (`config_from_env`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any


SANDBOX_HOME = "/home/user"
TRUNCATED = " [Result truncated due to length limit]"
ERROR_DETAIL_CHARS = 4000  # the reference server cut an error's details to this many characters
# Ids the model makes up instead of calling create_sandbox. Every tool that takes a sandbox_id answers
# one of these with invalid_id's text, as the reference server the model was trained with (MiroThinker
# v1.0) did: the model learned to create a sandbox then. The same ids, compared as that server did:
# exactly, case and spaces included (`None` or ` auto ` are not in it; they are looked up like any id).
PLACEHOLDER_IDS = frozenset({
    "default", "sandbox1", "sandbox", "some_id", "new_sandbox", "python", "create_sandbox", "sandbox123",
    "temp", "sandbox-0", "sandbox-1", "sandbox_0", "sandbox_1", "new", "0", "auto", "default_sandbox", "none",
    "sandbox_12345", "dummy", "sandbox_01",
})
MB = 1024 * 1024
log = logging.getLogger(__name__)


class SandboxError(Exception):
    """Something the model can fix (a bad id, a timeout, a path outside the sandbox); the message is for it."""


@dataclass
class SandboxConfig:
    """Settings of the `tool-python` server; `config_from_env` fills them from `NANBEIGE_SANDBOX_*`."""

    backend: str = "local"
    """`local` or `e2b` (NANBEIGE_SANDBOX_BACKEND; default `e2b` when E2B_API_KEY is set)."""
    placeholder_ids: frozenset[str] = PLACEHOLDER_IDS
    """Ids every tool answers with `placeholder_text` (NANBEIGE_SANDBOX_PLACEHOLDER_IDS, a JSON list;
    `--reference` sets the reference server's own)."""
    placeholder_text: str | None = None
    """What a placeholder id is answered with after `[ERROR]: `, `{sandbox_id}` standing for the id
    (NANBEIGE_SANDBOX_PLACEHOLDER_TEXT; `--reference` sets the reference server's own). None:
    `invalid_id`'s text."""
    root: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / f"nanbeige-sandboxes-{os.getuid()}")
    """Folder holding one folder per local sandbox (NANBEIGE_SANDBOX_DIR; default
    `<temp dir>/nanbeige-sandboxes-<uid>`). Temporary by nature: sandboxes are deleted when they close."""
    timeout_s: float = 120.0
    """Wall-clock limit of one call (NANBEIGE_SANDBOX_TIMEOUT)."""
    cpu_seconds: int = 120
    """CPU time limit of one call (NANBEIGE_SANDBOX_CPU_SECONDS)."""
    memory_mb: int = 2048
    """Memory of all of a local sandbox's processes together (a cgroup, or a watch over their
    resident memory), and address space of each, RLIMIT_AS (NANBEIGE_SANDBOX_MEMORY_MB); numpy needs ~1 GB."""
    disk_mb: int = 2048
    """Disk a local sandbox's files may take, /home/user and /tmp together (a file system of its own
    as root, else a watch over the folder) (NANBEIGE_SANDBOX_DISK_MB)."""
    file_size_mb: int = 100
    """Largest file a sandbox may write, RLIMIT_FSIZE (NANBEIGE_SANDBOX_FILE_SIZE_MB); also caps
    uploads and downloads to local."""
    max_processes: int = 64
    """Processes and threads a sandbox may run at once (NANBEIGE_SANDBOX_MAX_PROCESSES)."""
    max_open_files: int = 1024
    """Open file descriptors per process, RLIMIT_NOFILE (NANBEIGE_SANDBOX_MAX_OPEN_FILES)."""
    max_output_chars: int = 20_000
    """Longest tool result; longer ones are cut with a marker (NANBEIGE_SANDBOX_MAX_OUTPUT_CHARS)."""
    idle_timeout_s: int = 600
    """A sandbox unused this long is closed; `create_sandbox(timeout=...)` may ask for less
    (NANBEIGE_SANDBOX_IDLE_TIMEOUT)."""
    max_sandboxes: int = 16
    """Open sandboxes per server; creating one more closes the least recently used
    (NANBEIGE_SANDBOX_MAX_SANDBOXES)."""
    network: bool = False
    """Let local sandboxed code use the network (NANBEIGE_SANDBOX_NETWORK=1); off where the OS can do it."""
    jail: bool = True
    """Run local sandboxes in a filesystem jail (bwrap) where it works here (NANBEIGE_SANDBOX_JAIL)."""
    drop_privileges: bool = True
    """When the server runs as root, run each local sandbox as its own unprivileged uid
    (NANBEIGE_SANDBOX_DROP_PRIVILEGES)."""
    python: str = sys.executable
    """Interpreter of local sandboxes (NANBEIGE_SANDBOX_PYTHON); its packages are what the code can import."""
    upload_dirs: list[Path] = field(default_factory=lambda: [Path.cwd()])
    """Local folders files may be uploaded from (NANBEIGE_SANDBOX_UPLOAD_DIRS, os.pathsep-separated)."""
    download_dir: Path | None = None
    """Local folder that receives files downloaded from sandboxes (NANBEIGE_SANDBOX_DOWNLOAD_DIR;
    default `root/downloads`)."""
    max_download_mb: int = 100
    """Largest file `download_file_from_internet_to_sandbox` fetches (NANBEIGE_SANDBOX_MAX_DOWNLOAD_MB)."""
    allow_local_urls: bool = False
    """Let internet downloads reach loopback and private addresses (NANBEIGE_SANDBOX_ALLOW_LOCAL_URLS=1; tests)."""
    e2b_template: str | None = None
    """E2B template id (NANBEIGE_E2B_TEMPLATE); None uses E2B's code-interpreter default."""
    e2b_api_key: str | None = field(default=None, repr=False)
    """E2B API key (E2B_API_KEY)."""


def config_from_env(env: Mapping[str, str] | None = None) -> SandboxConfig:
    env = os.environ if env is None else env
    config = SandboxConfig(e2b_api_key=env.get("E2B_API_KEY") or None)
    config.backend = env.get("NANBEIGE_SANDBOX_BACKEND") or ("e2b" if config.e2b_api_key else "local")
    if config.backend not in ("local", "e2b"):
        raise ValueError(f"NANBEIGE_SANDBOX_BACKEND must be local or e2b, not {config.backend!r}")
    for name, value in env.items():
        key = name.removeprefix("NANBEIGE_SANDBOX_").lower()
        if not name.startswith("NANBEIGE_SANDBOX_") or key in ("backend", "dir", "upload_dirs", "download_dir",
                                                                "placeholder_ids", "placeholder_text"):
            continue
        key = {"timeout": "timeout_s", "idle_timeout": "idle_timeout_s"}.get(key, key)
        if key not in SandboxConfig.__dataclass_fields__:
            raise ValueError(f"unknown setting {name}")
        kind = type(getattr(config, key))
        setattr(config, key, value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value))
    if env.get("NANBEIGE_SANDBOX_DIR"):
        config.root = Path(env["NANBEIGE_SANDBOX_DIR"])
    if env.get("NANBEIGE_SANDBOX_UPLOAD_DIRS"):
        config.upload_dirs = [Path(p) for p in env["NANBEIGE_SANDBOX_UPLOAD_DIRS"].split(os.pathsep) if p]
    if env.get("NANBEIGE_SANDBOX_DOWNLOAD_DIR"):
        config.download_dir = Path(env["NANBEIGE_SANDBOX_DOWNLOAD_DIR"])
    config.e2b_template = env.get("NANBEIGE_E2B_TEMPLATE") or None
    if env.get("NANBEIGE_SANDBOX_PLACEHOLDER_IDS"):
        ids = json.loads(env["NANBEIGE_SANDBOX_PLACEHOLDER_IDS"])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("NANBEIGE_SANDBOX_PLACEHOLDER_IDS must be a JSON list of strings")
        config.placeholder_ids = frozenset(ids)
    config.placeholder_text = env.get("NANBEIGE_SANDBOX_PLACEHOLDER_TEXT") or None
    return config


# --- results in E2B's text shapes ------------------------------------------------------------


def format_execution(results: list[str], stdout: str, stderr: str, error: dict[str, str] | None) -> str:
    """The text of E2B's `str(Execution)`: what the model saw during training."""
    logs = f"Logs(stdout: {[stdout] if stdout else []!r}, stderr: {[stderr] if stderr else []!r})"
    if error is not None:
        name, value, tb = error["name"], error["value"], error["traceback"]
        error_text = f"ExecutionError(name={name!r}, value={value!r}, traceback={tb!r})"
    else:
        error_text = "None"
    return f"Execution(Results: [{', '.join(f'Result({r})' for r in results)}], Logs: {logs}, Error: {error_text})"


def format_command(stdout: str, stderr: str, exit_code: int, error: str | None) -> str:
    """The text of E2B's `str(CommandResult)`."""
    return f"CommandResult(stderr={stderr!r}, stdout={stdout!r}, exit_code={exit_code!r}, error={error!r})"


def command_failed(exit_code: int, stderr: str, signal_text: str | None = None) -> str:
    """The error text for a command that exited non-zero. E2B raises `CommandExitException` then, and
    the reference server answered with its text (stderr only, no stdout) in this layout."""
    code = f"{exit_code} ({signal_text})" if signal_text else f"{exit_code}"
    details = f"Command exited with code {code} and error:\n{stderr}"
    return f"Failed to run command.\n\nException type: CommandExitException\nDetails: {details[:ERROR_DETAIL_CHARS]}"


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED


def placeholder_answer(template: str, sandbox_id: str) -> str:
    """A `str.format` template with `{sandbox_id}` filled in; one that needs other fields is shown as it is."""
    try:
        return template.format(sandbox_id=sandbox_id)
    except (IndexError, KeyError, ValueError, AttributeError):
        return template


def invalid_id(sandbox_id: str) -> str:
    return (f"'{sandbox_id}' is not a valid sandbox_id. "
            "Please create a real sandbox first using the create_sandbox tool.")


# --- the tools ---------------------------------------------------------------------------------


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
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout \
            or timeout in (float("inf"), float("-inf")):
        raise SandboxError(allowed)
    if timeout == DEFAULT_TIMEOUT:
        return min(DEFAULT_TIMEOUT, limit)
    if not 1 <= int(timeout) <= limit:
        raise SandboxError(allowed)
    return int(timeout)


def make_backend(config: SandboxConfig) -> Any:
    # Imported here because the backends import this module for the pieces they share.
    if config.backend == "e2b":
        from nanbeige.tools.sandbox_e2b import E2BBackend

        return E2BBackend(config)
    from nanbeige.tools.sandbox_local import LocalBackend

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
            evict = sorted(self._open, key=lambda i: self._open[i].last_used)[: max(0, len(self._open) + 1
                                                                                       - self.config.max_sandboxes)]
        for old in evict:
            self._close(old, f"Sandbox '{old}' was closed because more than {self.config.max_sandboxes} sandboxes "
                             "were open. Please create a new sandbox using the create_sandbox tool.")
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
        from nanbeige.tools.sandbox_transfer import allowed_local_file  # it imports this module

        with self._use(sandbox_id) as real_id:  # the id first: a placeholder is answered before the file
            source = allowed_local_file(local_file_path, self.config.upload_dirs)
            if source.stat().st_size > self.config.file_size_mb * MB:
                raise SandboxError(f"{local_file_path} is larger than the {self.config.file_size_mb} MB file limit.")
            target = self._target(real_id, sandbox_file_path, source.name)
            self.backend.write_file(real_id, target, source.read_bytes())
        return f"File uploaded to {target}"

    def download_url(self, sandbox_id: str, url: str, sandbox_file_path: str = SANDBOX_HOME) -> str:
        from nanbeige.tools.sandbox_transfer import fetch_url  # it imports this module

        with self._use(sandbox_id) as real_id:
            data, name = fetch_url(url, self.config)
            target = self._target(real_id, sandbox_file_path, name)
            self.backend.write_file(real_id, target, data)
        return f"File downloaded to {target}"

    def download_to_local(self, sandbox_id: str, sandbox_file_path: str, local_filename: str | None = None) -> str:
        from nanbeige.tools.sandbox_transfer import write_local_file  # it imports this module

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
            idle = [(i, lease) for i, lease in self._open.items()
                    if not lease.busy and now - lease.last_used > lease.idle_timeout_s]
            for sandbox_id, lease in idle:
                del self._open[sandbox_id]
                self._gone[sandbox_id] = (f"Sandbox '{sandbox_id}' was shut down after {lease.idle_timeout_s:.0f} "
                                          "s without use. Please create a new sandbox using the create_sandbox tool.")
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


# --- local files -------------------------------------------------------------------------------


def inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
