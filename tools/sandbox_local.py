"""The local sandbox backend: a folder per sandbox under `SandboxConfig.root`, shown to the model as
`/home/user`, and a persistent Python process per sandbox (`sandbox_worker.py`) so variables
survive between calls.

Every process runs with rlimits on CPU time (a Python cell's also watched from outside, by
`sandbox_channel.py`, which carries the worker's requests and replies), address space, file size,
open files and processes, a wall-clock timeout after which everything it started is killed, a
minimal environment (no API keys), and, where the OS allows (`sandbox_os.probe_isolation`), no
network (`unshare --net`) and, when the server runs as root, its own unprivileged uid per sandbox
(`setpriv`), which makes the process limit hold, keeps the limits from being raised and makes
everything but the sandbox folder and world-writable places (/tmp) read-only to it. The OS side
of this (probing, uids, listing and killing processes) lives in `sandbox_os.py`; this module is the
sandbox logic over it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import stat
import subprocess
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from nanbeige.tools.sandbox import (
    MB, SANDBOX_HOME, SandboxConfig, SandboxError, command_failed, format_command, format_execution, inside, invalid_id,
    truncate,
)
from nanbeige.tools.sandbox_channel import Channel, ChannelError, check_cell_reply, cpu_time, exchange, read_line
from nanbeige.tools.sandbox_os import (
    Isolation, Proc, allocate_uid, become_subreaper, collect, exit_text, kill_processes, minimal_env, probe_isolation,
    processes, remove_tree, setpriv_args, signal_name,
)

log = logging.getLogger(__name__)

WORKER = str(Path(__file__).with_name("sandbox_worker.py"))
HOME_IN_TEXT = re.compile(r"/home/user(?![\w.-])")
IDLE_CHECK_S = 1.0  # how often idle workers' CPU time is read
STATE_LOST = ("The Python process was restarted, so variables, imports and definitions from earlier calls are "
              "lost; files in /home/user are kept.")


# --- paths inside a sandbox folder -------------------------------------------------------------


def host_path(folder: Path, path: str) -> Path:
    """The place in a local sandbox's folder that the model's path (under /home/user) names."""
    model_path = PurePosixPath(path or SANDBOX_HOME)
    if model_path.is_absolute():
        if not (model_path == PurePosixPath(SANDBOX_HOME) or PurePosixPath(SANDBOX_HOME) in model_path.parents):
            raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
        model_path = model_path.relative_to(SANDBOX_HOME)
    full = Path(os.path.normpath(folder / model_path))
    if not inside(full, folder):
        raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
    return full


def open_dir(folder: Path, parts: tuple[str, ...], create: bool, owner: int | None) -> int:
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


# --- the backend -------------------------------------------------------------------------------


@dataclass
class LocalSandbox:
    id: str
    folder: Path
    uid: int | None
    uid_lock: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: subprocess.Popen | None = None
    channel: Channel = field(default_factory=lambda: Channel(-1, -1))
    sessions: set[int] = field(default_factory=set)
    idle_cpu: float | None = None
    """The worker's CPU time when its last call ended, as the idle watch first read it (None: not yet)."""
    stopped_idle: str = ""
    """Why the worker was stopped between calls, for the next call to say."""

    def to_host(self, text: str) -> str:
        return HOME_IN_TEXT.sub(lambda _: str(self.folder), text)

    def to_model(self, text: str) -> str:
        return text.replace(str(self.folder), SANDBOX_HOME)

    def owns(self, p: Proc) -> bool:
        return p.uid == self.uid if self.uid is not None else p.session in self.sessions


class LocalBackend:
    """Sandboxes on this machine: a folder and a persistent Python worker each."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._boxes: dict[str, LocalSandbox] = {}
        self._lock = threading.Lock()
        self._isolation: Isolation | None = None
        self._idle_watch: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def isolation(self) -> Isolation:
        with self._lock:
            if self._isolation is None:
                self.config.root.mkdir(parents=True, exist_ok=True)
                os.chmod(self.config.root, 0o711)  # sandbox uids pass through, but cannot list
                become_subreaper()
                c = self.config
                self._isolation = probe_isolation(python=c.python, worker=WORKER, root=c.root, network=c.network,
                                                  drop_privileges=c.drop_privileges)
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

    def attach(self, sandbox_id: str, timeout: int) -> None:
        raise SandboxError(invalid_id(sandbox_id))  # local sandboxes end with the server that made them

    def run_python(self, sandbox_id: str, code: str) -> str:
        box = self._box(sandbox_id)
        with box.lock:
            if box.stopped_idle:
                message, box.stopped_idle = box.stopped_idle, ""
                raise SandboxError(message)
            if box.worker is None:
                self._start_worker(box)
            try:
                reply = check_cell_reply(exchange(box.channel, {"code": box.to_host(code)},
                                                  time.monotonic() + self.config.timeout_s, self.config.cpu_seconds))
            except ChannelError as exc:
                raise SandboxError(f"{self._broken(box, exc)}. {STATE_LOST}") from None
            if self._kill_strays(box):
                # the worker reaps the zombies of its children now, not at the next cell: until then they
                # would count against the process limit of the sandbox's commands
                try:
                    exchange(box.channel, {"reap": True}, time.monotonic() + 5.0)
                except ChannelError as exc:
                    reply["stderr"] += f"\n[sandbox] After this cell: {self._broken(box, exc)}. {STATE_LOST}\n"
            box.idle_cpu = None  # read by the idle watch, not here: a call costs one /proc read less
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
                out, err, finished = collect(proc, time.monotonic() + self.config.timeout_s,
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
        if code != 0:
            signal_text = f"signal: {signal_name(-code)}" if code < 0 else None
            raise SandboxError(command_failed(-1 if code < 0 else code, stderr, signal_text))
        return format_command(stdout, stderr, 0, None)

    def is_dir(self, sandbox_id: str, path: str) -> bool:
        full = host_path(self._box(sandbox_id).folder, path)
        return full.is_dir() and not full.is_symlink()

    def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        box = self._box(sandbox_id)
        parts = host_path(box.folder, path).relative_to(box.folder).parts
        if not parts:
            raise SandboxError(f"{path!r} is a folder, not a file name.")
        dir_fd = open_dir(box.folder, parts[:-1], create=True, owner=box.uid)
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
        dir_fd = open_dir(box.folder, parts[:-1], create=False, owner=None)
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
        remove_tree(box.folder)
        if box.uid_lock is not None:
            os.close(box.uid_lock)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            ids = list(self._boxes)
        for sandbox_id in ids:
            self.destroy(sandbox_id)

    def _watch_idle(self, closed: threading.Event) -> None:
        """Stops workers that used more than a call's CPU time since their last call ended: code may
        leave a thread running, and between calls no limit inside the process holds."""
        while not closed.wait(IDLE_CHECK_S):
            with self._lock:
                boxes = list(self._boxes.values())
            for box in boxes:
                if not box.lock.acquire(blocking=False):
                    continue  # in a call, which watches its own CPU time
                try:
                    used = cpu_time(box.channel.pid) if box.worker else 0.0
                    if box.idle_cpu is None:
                        box.idle_cpu = used
                    elif box.worker and used - box.idle_cpu > self.config.cpu_seconds:
                        self._stop_worker(box)
                        box.stopped_idle = (f"Between calls, code left running in the Python process used more "
                                            f"than {self.config.cpu_seconds} s of CPU time, so it was stopped. "
                                            f"{STATE_LOST} The code of this call did not run; send it again.")
                finally:
                    box.lock.release()

    def leftover_processes(self, sandbox_id: str) -> list[int]:
        """Live processes of the sandbox other than its Python worker (between calls: none)."""
        box = self._box(sandbox_id)
        return [p.pid for p in processes() if p.state not in b"ZX" and box.owns(p) and p.pid not in _worker_pids(box)]

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
                str(4 * self.config.max_output_chars), str(int(box.uid is not None))]
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
        box.channel = Channel(request_write, reply_read)
        box.sessions.add(box.worker.pid)
        # the worker's first line is its pid, which differs from Popen's when unshare forks it
        try:
            box.channel.pid = int(json.loads(read_line(box.channel, time.monotonic() + max(self.config.timeout_s,
                                                                                             30.0)))["pid"])
        except (ChannelError, ValueError, KeyError, TypeError):
            status = self._stop_worker(box)
            raise SandboxError(f"The Python process could not start ({exit_text(status)}).") from None
        with self._lock:
            if self._idle_watch is None or not self._idle_watch.is_alive():
                self._closed = threading.Event()
                self._idle_watch = threading.Thread(target=self._watch_idle, args=(self._closed,),
                                                    name="sandbox-idle-watch", daemon=True)
                self._idle_watch.start()

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
        for fd in (box.channel.requests, box.channel.replies):
            with suppress(OSError):
                os.close(fd)
        return code

    def _broken(self, box: LocalSandbox, exc: ChannelError) -> str:
        """Stops a worker that timed out, overran its CPU time or broke the protocol; says what happened."""
        status = self._stop_worker(box)
        if exc.kind == "timeout":
            return f"Execution timed out after {self.config.timeout_s:g} s and was stopped"
        if exc.kind == "cpu":
            return (f"Execution used more than {self.config.cpu_seconds} s of CPU time without stopping at its limit, "
                    "so it was stopped")
        if exc.kind == "protocol":
            log.warning("local sandbox %s: the Python process sent %s; restarting it", box.id, exc)
            return f"The Python process sent {exc} instead of its reply, so it was stopped"
        return f"The Python process died ({exit_text(status)})"

    def _kill_strays(self, box: LocalSandbox) -> int:
        """Kills what the last call left running (only the Python worker may outlive a call); returns how many."""
        return kill_processes(box.owns, keep=_worker_pids(box), waited=set(box.sessions))


def _worker_pids(box: LocalSandbox) -> set[int]:
    # two pids when unshare forks the worker: Popen's and the worker's own
    return {box.worker.pid, box.channel.pid} if box.worker else set()
