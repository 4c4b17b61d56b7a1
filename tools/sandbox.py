"""Sandboxes where the model runs Python and shell commands: E2B's cloud, or a local one.

`Sandboxes` holds what the `tool-python` MCP server offers (create, run Python, run a command,
move files in and out), the sandbox ids and their idle timeouts, over one of two backends:

- `E2BBackend`: E2B cloud sandboxes through `e2b-code-interpreter` (needs `E2B_API_KEY`).
- `LocalBackend`: a folder per sandbox under `SandboxConfig.root`, shown to the model as
  `/home/user`, and a persistent Python process per sandbox (`sandbox_worker.py`) so variables
  survive between calls. Every process runs with rlimits on CPU time, address space, file size,
  open files and processes, a wall-clock timeout after which everything it started is killed, a
  minimal environment (no API keys), and, where the OS allows (`probe_isolation`), no network
  (`unshare --net`) and, when the server runs as root, its own unprivileged uid per sandbox
  (`setpriv`), which makes the process limit hold, keeps the limits from being raised and makes
  everything but the sandbox folder and world-writable places (/tmp) read-only to it.

Settings come from `NANBEIGE_SANDBOX_*` environment variables (`config_from_env`).
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple
from urllib.parse import unquote, urljoin, urlsplit

import httpx

log = logging.getLogger(__name__)

SANDBOX_HOME = "/home/user"
WORKER = str(Path(__file__).with_name("sandbox_worker.py"))
TRUNCATED = " [Result truncated due to length limit]"
# Ids the model makes up instead of calling create_sandbox; code sent with one runs in a
# throwaway sandbox, as in the reference server the model was trained with.
PLACEHOLDER_IDS = frozenset({
    "default", "sandbox", "sandbox1", "sandbox_1", "sandbox-1", "sandbox0", "sandbox_0", "sandbox-0",
    "sandbox_01", "sandbox123", "sandbox_12345", "default_sandbox", "new_sandbox", "create_sandbox",
    "some_id", "sandbox_id", "your_sandbox_id", "python", "new", "temp", "dummy", "auto", "none", "null",
    "0", "1",
})
HOME_IN_TEXT = re.compile(r"/home/user(?![\w.-])")
UID_BASE, UID_SPAN = 1_700_000_000, 10_000_000  # far above any real account; one uid per sandbox
MB = 1024 * 1024
REPLY_LIMIT = 64 * MB


class SandboxError(Exception):
    """Something the model can fix (a bad id, a timeout, a path outside the sandbox); the message is for it."""


@dataclass
class SandboxConfig:
    """Settings of the `tool-python` server; `config_from_env` fills them from `NANBEIGE_SANDBOX_*`."""

    backend: str = "local"
    """`local` or `e2b` (NANBEIGE_SANDBOX_BACKEND; default `e2b` when E2B_API_KEY is set)."""
    root: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / f"nanbeige-sandboxes-{os.getuid()}")
    """Folder holding one folder per local sandbox (NANBEIGE_SANDBOX_DIR; default
    `<temp dir>/nanbeige-sandboxes-<uid>`). Temporary by nature: sandboxes are deleted when they close."""
    timeout_s: float = 120.0
    """Wall-clock limit of one call (NANBEIGE_SANDBOX_TIMEOUT)."""
    cpu_seconds: int = 120
    """CPU time limit of one call (NANBEIGE_SANDBOX_CPU_SECONDS)."""
    memory_mb: int = 2048
    """Address-space limit per process, RLIMIT_AS (NANBEIGE_SANDBOX_MEMORY_MB); numpy needs ~1 GB."""
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
        if not name.startswith("NANBEIGE_SANDBOX_") or key in ("backend", "dir", "upload_dirs", "download_dir"):
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


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATED


def invalid_id(sandbox_id: str) -> str:
    return (f"'{sandbox_id}' is not a valid sandbox_id. "
            "Please create a real sandbox first using the create_sandbox tool.")


# --- the tools ---------------------------------------------------------------------------------


@dataclass
class Lease:
    idle_timeout_s: float
    last_used: float


class Sandboxes:
    """The open sandboxes of one server and the tool operations on them.

    A backend provides create(timeout) -> id, run_python(id, code), run_command(id, command),
    is_dir(id, path), write_file(id, path, data), read_file(id, path, max_bytes), destroy(id), close().
    """

    def __init__(self, config: SandboxConfig, backend: Any = None) -> None:
        self.config = config
        self.backend = backend or (E2BBackend(config) if config.backend == "e2b" else LocalBackend(config))
        self._lock = threading.Lock()
        self._open: dict[str, Lease] = {}
        self._gone: dict[str, str] = {}

    def create(self, timeout: int = 600) -> str:
        self._close_idle()
        timeout = max(1, min(int(timeout), self.config.idle_timeout_s))
        with self._lock:
            evict = sorted(self._open, key=lambda i: self._open[i].last_used)[: max(0, len(self._open) + 1
                                                                                       - self.config.max_sandboxes)]
        for old in evict:
            self._close(old, f"Sandbox '{old}' was closed because more than {self.config.max_sandboxes} sandboxes "
                             "were open. Please create a new sandbox using the create_sandbox tool.")
        sandbox_id = self.backend.create(timeout)
        with self._lock:
            self._open[sandbox_id] = Lease(timeout, time.monotonic())
        return f"Sandbox created with sandbox_id: {sandbox_id}"

    def run_python(self, code_block: str, sandbox_id: str) -> str:
        with self._use(sandbox_id, throwaway=True) as real_id:
            return truncate(self.backend.run_python(real_id, code_block), self.config.max_output_chars)

    def run_command(self, command: str, sandbox_id: str) -> str:
        with self._use(sandbox_id, throwaway=True) as real_id:
            return truncate(self.backend.run_command(real_id, command), self.config.max_output_chars)

    def upload(self, sandbox_id: str, local_file_path: str, sandbox_file_path: str = SANDBOX_HOME) -> str:
        source = allowed_local_file(local_file_path, self.config.upload_dirs)
        if source.stat().st_size > self.config.file_size_mb * MB:
            raise SandboxError(f"{local_file_path} is larger than the {self.config.file_size_mb} MB file limit.")
        with self._use(sandbox_id) as real_id:
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
        with self._lock:
            ids = list(self._open)
        for sandbox_id in ids:
            self._close(sandbox_id, invalid_id(sandbox_id))
        self.backend.close()

    @contextmanager
    def _use(self, sandbox_id: str, throwaway: bool = False) -> Iterator[str]:
        sandbox_id = (sandbox_id or "").strip()
        if throwaway and (not sandbox_id or sandbox_id.lower() in PLACEHOLDER_IDS):
            real_id = self.backend.create(self.config.idle_timeout_s)
            try:
                yield real_id
            finally:
                self.backend.destroy(real_id)
            return
        self._close_idle()
        with self._lock:
            lease = self._open.get(sandbox_id)
            if lease is None:
                raise SandboxError(self._gone.get(sandbox_id, invalid_id(sandbox_id)))
            lease.last_used = time.monotonic()
        try:
            yield sandbox_id
        finally:
            lease.last_used = time.monotonic()

    def _close_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [(i, lease) for i, lease in self._open.items() if now - lease.last_used > lease.idle_timeout_s]
        for sandbox_id, lease in idle:
            self._close(sandbox_id, f"Sandbox '{sandbox_id}' was shut down after {lease.idle_timeout_s:.0f} s "
                                    "without use. Please create a new sandbox using the create_sandbox tool.")

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


# --- local backend -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    """What the local sandbox can enforce on this machine, found by trying (`probe_isolation`)."""

    network_off: bool
    """Sandboxed code runs in a network namespace of its own, with no usable interface."""
    own_pids: bool
    """It runs in a pid namespace of its own (used when it has no uid of its own): it cannot signal
    the server or the user's other processes, and when a call's first process ends the kernel
    kills whatever else it left."""
    own_uid: bool
    """Each sandbox runs as its own unprivileged uid (server running as root): the process limit
    holds, rlimits cannot be raised, and only its folder and world-writable places such as /tmp
    are writable to it."""
    read_all: bool
    """That uid keeps CAP_DAC_READ_SEARCH, because the interpreter (or the sandbox root) is not
    readable by other users here: sandboxed code can then read, not write, every file."""
    process_limit: bool
    """RLIMIT_NPROC bounds the sandbox's processes (root ignores it, so false for root without own_uid)."""
    prefix: tuple[str, ...] = ()
    """Command prefix that enters the namespaces (`unshare ...`)."""


def setpriv_args(uid: int, read_all: bool) -> list[str]:
    caps = ["--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search",
            "--bounding-set=-all,+dac_read_search"] if read_all else ["--inh-caps=-all", "--bounding-set=-all"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", *caps, "--"]


def probe_isolation(config: SandboxConfig) -> Isolation:
    """Tries, once per server, which of the OS's isolation tools work here (each try is ~10 ms)."""
    root = os.geteuid() == 0
    own_uid, read_all = (_probe_uid(config) if root and config.drop_privileges and shutil.which("setpriv")
                         else (False, False))
    # Without a uid of its own, a pid namespace keeps the code from signalling the server or the
    # user's other processes, which share the uid.
    wanted = [flags for flags, want in ((("--net",), not config.network),
                                        (("--pid", "--fork", "--kill-child"), not own_uid)) if want]
    user = () if root else ("--map-root-user",)
    candidates = [("unshare", *user, *itertools.chain(*combo))
                  for size in range(len(wanted), 0, -1) for combo in itertools.combinations(wanted, size)]
    prefix = next((c for c in candidates if _succeeds([*c, "true"])), ()) if shutil.which("unshare") else ()
    isolation = Isolation("--net" in prefix, "--pid" in prefix, own_uid, read_all, own_uid or not root, prefix)
    if not config.network and not isolation.network_off:
        log.warning("local sandbox: cannot make a network namespace (unshare); sandboxed code can use the network")
    if not own_uid and not isolation.own_pids:
        log.warning("local sandbox: no pid namespace; sandboxed code can signal this user's other processes")
    if root and not own_uid:
        log.warning("local sandbox: running as root without a uid of its own; the process limit does not hold")
    log.info("local sandbox isolation: %s", isolation)
    return isolation


def _probe_uid(config: SandboxConfig) -> tuple[bool, bool]:
    """Whether sandboxes can run as a uid of their own, and whether that needs CAP_DAC_READ_SEARCH.
    An interpreter the uid cannot read may still start, with another stdlib and without its
    packages: the check compares sys.base_prefix, and enters the sandbox root."""
    where = subprocess.run([config.python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"],
                           capture_output=True, text=True, timeout=20).stdout.strip()
    check = f"import os, sys; os.chdir(sys.argv[1]); sys.exit(sys.base_prefix != {where!r})"
    uid, lock = allocate_uid()
    try:
        for read_all in (False, True):
            if _succeeds([*setpriv_args(uid, read_all), config.python, "-I", "-S", "-B", WORKER, "", "exec", "-1",
                          config.python, "-I", "-S", "-c", check, str(config.root)]):
                return True, read_all
        return False, False
    finally:
        os.close(lock)


def _succeeds(args: list[str]) -> bool:
    try:
        return subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=minimal_env(Path("/")), timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def allocate_uid() -> tuple[int, int]:
    """A uid no process uses, held by a lock file so concurrent servers never share one."""
    lock_dir = Path(tempfile.gettempdir()) / "nanbeige-sandbox-uids"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    if lock_dir.stat().st_uid != os.geteuid():
        raise RuntimeError(f"{lock_dir} belongs to another user")
    for _ in range(100):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not any(p.uid == uid for p in processes()):
                return uid, fd
        except BlockingIOError:
            pass
        os.close(fd)
    raise RuntimeError("no free uid for a sandbox")


def minimal_env(home: Path, python: str = sys.executable) -> dict[str, str]:
    """All the environment sandboxed code gets: nothing of the server's, so no API keys."""
    bin_dir = os.path.dirname(python)
    return {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
            "TMPDIR": str(home), "USER": "user", "LOGNAME": "user", "LANG": "C.UTF-8", "TERM": "dumb",
            "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg",
            # one BLAS thread each: threads count against the process limit
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Proc(NamedTuple):
    pid: int
    state: bytes
    ppid: int
    session: int
    uid: int
    threads: int


PROC_FIELDS = [re.compile(rb"^%s:\s+(\S+)" % name, re.M) for name in (b"State", b"PPid", b"NSsid", b"Uid", b"Threads")]


def processes() -> Iterator[Proc]:
    """Every process, from /proc (empty where there is none)."""
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                text = f.read()
            state, *numbers = (pattern.search(text)[1] for pattern in PROC_FIELDS)  # type: ignore[index]
            yield Proc(int(name), state, *map(int, numbers))
        except (OSError, TypeError):
            continue


def become_subreaper() -> None:
    """Makes orphaned sandbox processes children of this process, so that it can reap them: an
    init that never reaps (as in some VMs and containers) would leave zombies that keep counting
    against the sandbox's process limit."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def kill_processes(match: Callable[[Proc], bool], keep: set[int], waited: set[int]) -> int:
    """SIGKILLs every live process that match() selects, except keep, until none is left (with the
    process limit in force a fork bomb cannot outrun this), and reaps the zombies handed to this
    process, except those a Popen in `waited` will wait for. Returns how many it killed."""
    me, killed, total = os.getpid(), False, 0
    for _ in range(200):
        live = []
        for p in processes():
            if p.pid in keep or not match(p):
                continue
            if p.state not in b"ZX":
                live.append(p.pid)
            elif p.ppid == me and p.pid not in waited:
                with suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)
        if not live and not killed:
            return total
        total += len(live)
        for pid in live:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        # after the last kills, one more pass reaps the zombies they hand over
        killed = bool(live)
        time.sleep(0.002 if live else 0.01)
    log.warning("local sandbox: some processes survived SIGKILL")
    return total


@dataclass
class LocalSandbox:
    id: str
    folder: Path
    uid: int | None
    uid_lock: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: subprocess.Popen | None = None
    worker_pid: int = 0
    requests: int = -1
    replies: int = -1
    sessions: set[int] = field(default_factory=set)

    def to_host(self, text: str) -> str:
        return HOME_IN_TEXT.sub(lambda _: str(self.folder), text)

    def to_model(self, text: str) -> str:
        return text.replace(str(self.folder), SANDBOX_HOME)

    def owns(self, p: Proc) -> bool:
        return p.uid == self.uid if self.uid is not None else p.session in self.sessions


STATE_LOST = ("The Python process was restarted, so variables, imports and definitions from earlier calls are "
              "lost; files in /home/user are kept.")


class LocalBackend:
    """Sandboxes on this machine: a folder and a persistent Python worker each."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._boxes: dict[str, LocalSandbox] = {}
        self._lock = threading.Lock()
        self._isolation: Isolation | None = None

    @property
    def isolation(self) -> Isolation:
        with self._lock:
            if self._isolation is None:
                self.config.root.mkdir(parents=True, exist_ok=True)
                os.chmod(self.config.root, 0o711)  # sandbox uids pass through, but cannot list
                become_subreaper()
                self._isolation = probe_isolation(self.config)
            return self._isolation

    def create(self, timeout: int) -> str:
        own_uid = self.isolation.own_uid
        sandbox_id = secrets.token_hex(10)
        folder = Path(os.path.realpath(self.config.root / sandbox_id))
        folder.mkdir(mode=0o700)
        uid, lock = allocate_uid() if own_uid else (None, None)
        if uid is not None:
            os.chown(folder, uid, uid)
        with self._lock:
            self._boxes[sandbox_id] = LocalSandbox(sandbox_id, folder, uid, lock)
        return sandbox_id

    def run_python(self, sandbox_id: str, code: str) -> str:
        box = self._box(sandbox_id)
        with box.lock:
            if box.worker is None:
                self._start_worker(box)
            assert box.worker is not None
            try:
                _write_all(box.requests, json.dumps({"code": box.to_host(code)}).encode() + b"\n")
                line = _read_line(box.replies, time.monotonic() + self.config.timeout_s)
                reply = json.loads(line) if line else None
            except (OSError, ValueError):
                line, reply = b"", None
            if reply is None:
                status = self._stop_worker(box)
                what = (f"Execution timed out after {self.config.timeout_s:g} s and was stopped" if line is None
                        else f"The Python process died ({_exit_text(status)})")
                raise SandboxError(f"{what}. {STATE_LOST}")
            if self._kill_strays(box):
                # the worker reaps the zombies of its children now, not at the next cell: until then they
                # would count against the process limit of the sandbox's commands
                _write_all(box.requests, b'{"reap": true}\n')
                _read_line(box.replies, time.monotonic() + 5.0)
        return box.to_model(format_execution(reply["results"], reply["stdout"], reply["stderr"], reply["error"]))

    def run_command(self, sandbox_id: str, command: str) -> str:
        box = self._box(sandbox_id)
        status_read, status_write = os.pipe()
        with box.lock, open(status_read, "rb") as status:
            args = self._command_line(box, ["exec", str(status_write), "/bin/sh", "-c", box.to_host(command)],
                                      python=False)
            try:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        cwd=box.folder, env=minimal_env(box.folder, self.config.python),
                                        start_new_session=True, pass_fds=(status_write,))
            finally:
                os.close(status_write)
            box.sessions.add(proc.pid)
            try:
                out, err, finished = _collect(proc, time.monotonic() + self.config.timeout_s,
                                              4 * self.config.max_output_chars, cleanup=lambda: self._kill_strays(box))
            finally:
                box.sessions.discard(proc.pid)
            how, _, number = status.read().decode().partition(" ")  # empty when the worker itself was killed
        stdout, stderr = box.to_model(out.decode(errors="replace")), box.to_model(err.decode(errors="replace"))
        if not finished:
            partial = format_command(stdout, stderr, -1, "timeout")
            raise SandboxError(f"Command timed out after {self.config.timeout_s:g} s; it and every process it "
                               f"started were killed. Output so far: {truncate(partial, 4000)}")
        code = int(number) if how == "exit" else -int(number) if how == "signal" else proc.returncode
        if code < 0:
            return format_command(stdout, stderr, -1, f"signal: {_signal_name(-code)}")
        return format_command(stdout, stderr, code, f"exit status {code}" if code else None)

    def is_dir(self, sandbox_id: str, path: str) -> bool:
        full = host_path(self._box(sandbox_id).folder, path)
        return full.is_dir() and not full.is_symlink()

    def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        box = self._box(sandbox_id)
        parts = host_path(box.folder, path).relative_to(box.folder).parts
        if not parts:
            raise SandboxError(f"{path!r} is a folder, not a file name.")
        dir_fd = _open_dir(box.folder, parts[:-1], create=True, owner=box.uid)
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            raise SandboxError(f"Cannot write {path}: {exc.strerror}.") from None
        finally:
            os.close(dir_fd)
        with open(fd, "wb") as f:
            if box.uid is not None:
                os.fchown(fd, box.uid, box.uid)
            f.write(data)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        box = self._box(sandbox_id)
        parts = host_path(box.folder, path).relative_to(box.folder).parts
        dir_fd = _open_dir(box.folder, parts[:-1], create=False, owner=None)
        try:
            # no symlink is followed, and O_NONBLOCK keeps a FIFO from hanging the server
            fd = os.open(parts[-1] if parts else ".", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as exc:
            raise SandboxError(f"Cannot read {path} in the sandbox: {exc.strerror}.") from None
        finally:
            os.close(dir_fd)
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SandboxError(f"{path} is not a regular file.")
            if info.st_size > max_bytes:
                raise SandboxError(f"{path} is larger than {max_bytes // MB} MB.")
            return f.read(max_bytes + 1)[:max_bytes]

    def destroy(self, sandbox_id: str) -> None:
        with self._lock:
            box = self._boxes.pop(sandbox_id, None)
        if box is None:
            return
        self._stop_worker(box)
        kill_processes(box.owns, keep=set(), waited=set(box.sessions))
        _remove_tree(box.folder)
        if box.uid_lock is not None:
            os.close(box.uid_lock)

    def close(self) -> None:
        with self._lock:
            ids = list(self._boxes)
        for sandbox_id in ids:
            self.destroy(sandbox_id)

    def leftover_processes(self, sandbox_id: str) -> list[int]:
        """Live processes of the sandbox other than its Python worker (between calls: none)."""
        box = self._box(sandbox_id)
        worker = {box.worker.pid, box.worker_pid} if box.worker else set()
        return [p.pid for p in processes() if p.state not in b"ZX" and box.owns(p) and p.pid not in worker]

    def _box(self, sandbox_id: str) -> LocalSandbox:
        with self._lock:
            box = self._boxes.get(sandbox_id)
        if box is None:
            raise SandboxError(invalid_id(sandbox_id))
        return box

    def _limits(self, box: LocalSandbox, python: bool) -> str:
        c = self.config
        limits = {"AS": c.memory_mb * MB, "FSIZE": c.file_size_mb * MB, "NOFILE": c.max_open_files, "CORE": 0}
        if box.uid is not None:
            limits["NPROC"] = c.max_processes
        elif os.geteuid() != 0:
            # RLIMIT_NPROC counts all of the user's tasks, so allow what already runs plus the budget
            limits["NPROC"] = sum(p.threads for p in processes() if p.uid == os.getuid()) + c.max_processes
        if not python:
            limits["CPU"] = c.cpu_seconds  # the Python worker sets its own, per cell
        return ",".join(f"{name}={value}" for name, value in limits.items())

    def _command_line(self, box: LocalSandbox, mode: list[str], python: bool) -> list[str]:
        isolation = self.isolation
        prefix = [*isolation.prefix]
        if box.uid is not None:
            prefix += setpriv_args(box.uid, isolation.read_all)
        # -S (no site-packages) starts faster; only the Python worker needs the packages
        flags = ["-I", "-B"] if python else ["-I", "-S", "-B"]
        return [*prefix, self.config.python, *flags, WORKER, self._limits(box, python), *mode]

    def _start_worker(self, box: LocalSandbox) -> None:
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        mode = ["python", str(request_read), str(reply_write), str(self.config.cpu_seconds),
                str(4 * self.config.max_output_chars)]
        args = self._command_line(box, mode, python=True)
        try:
            box.worker = subprocess.Popen(args, pass_fds=(request_read, reply_write), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=box.folder,
                                          env=minimal_env(box.folder, self.config.python), start_new_session=True)
        except OSError:
            for fd in (request_write, reply_read):
                os.close(fd)
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
        box.requests, box.replies = request_write, reply_read
        box.sessions.add(box.worker.pid)
        # the worker's first line is its pid, which differs from Popen's when unshare forks it
        hello = _read_line(reply_read, time.monotonic() + max(self.config.timeout_s, 30.0))
        try:
            box.worker_pid = json.loads(hello or b"")["pid"]
        except (ValueError, KeyError):
            status = self._stop_worker(box)
            raise SandboxError(f"The Python process could not start ({_exit_text(status)}).") from None

    def _stop_worker(self, box: LocalSandbox) -> int | None:
        """Kills the worker and everything the sandbox started; returns the worker's exit status."""
        worker, box.worker = box.worker, None
        if worker is None:
            return None
        kill_processes(box.owns, keep=set(), waited=set(box.sessions))
        with suppress(OSError):
            os.killpg(worker.pid, signal.SIGKILL)
        code = worker.wait()
        box.sessions.discard(worker.pid)
        for fd in (box.requests, box.replies):
            with suppress(OSError):
                os.close(fd)
        return code

    def _kill_strays(self, box: LocalSandbox) -> int:
        """Kills what the last call left running (only the Python worker may outlive a call); returns how many."""
        keep = {box.worker.pid, box.worker_pid} if box.worker else set()
        return kill_processes(box.owns, keep=keep, waited=set(box.sessions))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_line(fd: int, deadline: float) -> bytes | None:
    """One line from fd; None when the deadline passes first, b"" at end of file or past REPLY_LIMIT
    (code that writes to the reply pipe itself must not fill the server's memory)."""
    buffer = bytearray()
    while not buffer.endswith(b"\n") and len(buffer) < REPLY_LIMIT:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        buffer += chunk
    return bytes(buffer) if buffer.endswith(b"\n") else b""


def _collect(proc: subprocess.Popen, deadline: float, max_bytes: int,
             cleanup: Callable[[], None]) -> tuple[bytes, bytes, bool]:
    """Reads stdout and stderr (keeping max_bytes of each) until the process ends or the deadline
    passes; then kills what is left and reads what the pipes still hold."""
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    open_fds = list(buffers)

    def pump(until: float, stop: Callable[[], bool]) -> None:
        while open_fds and not stop():
            # a short wait notices the end of a process whose background children keep the pipes open
            ready, _, _ = select.select(open_fds, [], [], min(0.05, max(0.0, until - time.monotonic())))
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.remove(fd)
                buffers[fd] += chunk[: max(0, max_bytes - len(buffers[fd]))]
            if time.monotonic() >= until:
                return

    pump(deadline, lambda: proc.poll() is not None)
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        finished = True
    except subprocess.TimeoutExpired:
        finished = False
    cleanup()
    with suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    pump(time.monotonic() + 1.0, lambda: False)
    out, err = buffers.values()
    proc.stdout.close()
    proc.stderr.close()
    return bytes(out), bytes(err), finished


def _exit_text(code: int | None) -> str:
    return f"exit code {code}" if code is None or code >= 0 else f"killed by {_signal_name(-code)}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- paths -------------------------------------------------------------------------------------


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def host_path(folder: Path, path: str) -> Path:
    """The place in a local sandbox's folder that the model's path (under /home/user) names."""
    model_path = PurePosixPath(path or SANDBOX_HOME)
    if model_path.is_absolute():
        if not (model_path == PurePosixPath(SANDBOX_HOME) or PurePosixPath(SANDBOX_HOME) in model_path.parents):
            raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
        model_path = model_path.relative_to(SANDBOX_HOME)
    full = Path(os.path.normpath(folder / model_path))
    if not _inside(full, folder):
        raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
    return full


def _open_dir(folder: Path, parts: tuple[str, ...], create: bool, owner: int | None) -> int:
    """A descriptor of folder/parts reached one step at a time without following symlinks, so
    links the sandboxed code planted cannot lead the server outside its folder."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, owner, owner, dir_fd=fd, follow_symlinks=False)
            step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
    except OSError as exc:
        os.close(fd)
        raise SandboxError(f"Cannot use folder {'/'.join(parts)} in the sandbox: {exc.strerror} "
                           "(symbolic links are not followed).") from None
    return fd


def _remove_tree(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():  # sandboxed code may leave folders behind that even their owner cannot change
        with suppress(OSError):
            os.chmod(folder, 0o700)
        for path, dirs, _ in os.walk(folder):
            for name in dirs:
                if not os.path.islink(os.path.join(path, name)):
                    with suppress(OSError):
                        os.chmod(os.path.join(path, name), 0o700)
        shutil.rmtree(folder, ignore_errors=True)


def allowed_local_file(path: str, allowed: list[Path]) -> Path:
    real = Path(os.path.realpath(os.path.expanduser(path)))
    roots = [Path(os.path.realpath(d)) for d in allowed]
    if not any(_inside(real, r) for r in roots):
        raise SandboxError(f"{path} cannot be uploaded: only files under {', '.join(map(str, roots))} can.")
    if not real.is_file():
        raise SandboxError(f"{path} does not exist or is not a file.")
    return real


def write_local_file(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.realpath(folder))
    target = Path(os.path.normpath(base / name))
    if not _inside(target, base) or target == base:
        raise SandboxError(f"{name} is not a file name inside the download folder {base}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not _inside(Path(os.path.realpath(target.parent)), base):
        raise SandboxError(f"{name} leads outside the download folder {base}.")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise SandboxError(f"Cannot write {target}: {exc.strerror}.") from None
    with open(fd, "wb") as f:
        f.write(data)
    return target


# --- downloads from the internet ---------------------------------------------------------------


def _check_url(url: str, allow_local: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SandboxError(f"Only http and https URLs can be downloaded, not {url!r}.")
    if allow_local:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise SandboxError(f"Cannot resolve {parts.hostname}: {exc}.") from None
    for info in infos:
        if not ipaddress.ip_address(info[4][0].split("%")[0]).is_global:
            # the sandbox has no network: this tool must not become its way into the local network
            raise SandboxError(f"{url} points to a local or private address; only public addresses are allowed.")


def fetch_url(url: str, config: SandboxConfig) -> tuple[bytes, str]:
    """The body of url (redirects followed and checked, at most max_download_mb) and a file name."""
    limit = config.max_download_mb * MB
    headers = {"User-Agent": "nanbeige-sandbox/0.1"}
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=20.0), headers=headers) as client:
        for _ in range(10):
            _check_url(url, config.allow_local_urls)
            try:
                with client.stream("GET", url) as response:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code >= 400:
                        raise SandboxError(f"Download failed: HTTP {response.status_code} for {url}.")
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > limit:
                            raise SandboxError(f"Download stopped: {url} is larger than {config.max_download_mb} MB.")
            except httpx.HTTPError as exc:
                raise SandboxError(f"Download failed: {type(exc).__name__}: {exc}.") from None
            name = unquote(PurePosixPath(urlsplit(url).path).name) or "downloaded_file"
            return bytes(data), name
    raise SandboxError(f"Download failed: too many redirects from {url}.")


# --- E2B backend -------------------------------------------------------------------------------


class E2BBackend:
    """E2B cloud sandboxes through the synchronous `e2b_code_interpreter.Sandbox` API (calls run in
    the server's worker threads). `sandbox_class` stands in for it in tests."""

    def __init__(self, config: SandboxConfig, sandbox_class: Any = None) -> None:
        import e2b

        if sandbox_class is None:
            from e2b_code_interpreter import Sandbox as sandbox_class
        self.config = config
        self._class = sandbox_class
        self._e2b = e2b
        self._live: dict[str, Any] = {}
        self._lock = threading.Lock()

    def create(self, timeout: int) -> str:
        options: dict[str, Any] = {"timeout": timeout, "api_key": self.config.e2b_api_key}
        if self.config.e2b_template:
            options["template"] = self.config.e2b_template
        with self._errors("create a sandbox"):
            sandbox = self._class.create(**options)
        with self._lock:
            self._live[sandbox.sandbox_id] = sandbox
        return sandbox.sandbox_id

    def run_python(self, sandbox_id: str, code: str) -> str:
        with self._errors("run the code", sandbox_id):
            return str(self._get(sandbox_id).run_code(code, timeout=self.config.timeout_s))

    def run_command(self, sandbox_id: str, command: str) -> str:
        with self._errors("run the command", sandbox_id):
            try:
                result = self._get(sandbox_id).commands.run(command, timeout=self.config.timeout_s)
            except self._e2b.CommandExitException as exc:  # a non-zero exit is a result, not a failure
                result = exc
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
        with self._lock:
            sandbox = self._live.pop(sandbox_id, None)
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
        sandbox.set_timeout(self.config.idle_timeout_s)  # E2B counts its lifetime from the last refresh
        return sandbox

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
