"""The operating-system layer of the local sandbox (`local.py`): allocating a uid per
sandbox, building `setpriv` command prefixes, listing and killing processes by owner, collecting
a process's output under a deadline, reaping orphans as a subreaper, and removing folders.

It knows nothing of sandboxes, ids or the model: callers pass plain paths, uids and predicates.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

UID_BASE, UID_SPAN = 1_700_000_000, 10_000_000  # far above any real account; one uid per sandbox


# --- uids -------------------------------------------------------------------------------------

UID_LOCKS = Path(tempfile.gettempdir()) / "nanbeige-sandbox-uids"


def setpriv_args(uid: int, read_all: bool) -> list[str]:
    caps = (
        ["--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search", "--bounding-set=-all,+dac_read_search"]
        if read_all
        else ["--inh-caps=-all", "--bounding-set=-all"]
    )
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", *caps, "--"]


def allocate_uid() -> tuple[int, int]:
    """A uid no process uses, held by a lock file so concurrent servers never share one."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    if UID_LOCKS.stat().st_uid != os.geteuid():
        raise RuntimeError(f"{UID_LOCKS} belongs to another user")
    for _ in range(100):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # a sweep or a release may have removed the file between our open and our lock
            if os.fstat(fd).st_ino == os.stat(UID_LOCKS / str(uid)).st_ino and not any(
                p.uid == uid for p in processes()
            ):
                return uid, fd
        except (BlockingIOError, FileNotFoundError):
            pass
        os.close(fd)
    raise RuntimeError("no free uid for a sandbox")


def release_uid(uid: int, lock: int) -> None:
    """Gives a uid back, lock file and all, once nothing of the sandbox runs as it."""
    with suppress(OSError):
        os.unlink(UID_LOCKS / str(uid))
    os.close(lock)


def sweep_uid_locks() -> int:
    """Removes the lock files of uids no live server holds (a killed server leaves its own);
    returns how many."""
    removed = 0
    if os.geteuid() != 0 or not UID_LOCKS.is_dir() or UID_LOCKS.stat().st_uid != 0:
        return 0  # only root gives sandboxes uids of their own
    for name in os.listdir(UID_LOCKS):
        with suppress(OSError):
            fd = os.open(UID_LOCKS / name, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(UID_LOCKS / name)
                removed += 1
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
    return removed


def minimal_env(home: Path, python: str = sys.executable) -> dict[str, str]:
    """All the environment sandboxed code gets: nothing of the server's, so no API keys."""
    bin_dir = os.path.dirname(python)
    return {
        "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "USER": "user",
        "LOGNAME": "user",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONIOENCODING": "utf-8",
        "MPLBACKEND": "Agg",
        # one BLAS thread each: threads count against the process limit
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


# --- processes ---------------------------------------------------------------------------------


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


def children(pid: int) -> list[int]:
    """The children of a single-threaded process (empty when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def pid_namespace(pid: int) -> str:
    """Which pid namespace a process is in ("" when it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def descendant_chain(ancestor: int, inner_pid: int) -> list[int]:
    """The pids, as this process sees them, from ancestor down to its descendant that is inner_pid
    in its own pid namespace (a jailed process knows only that number). Empty when none is found.
    The processes above it (bwrap's) have one thread each, whose children `children` lists."""
    paths = [[ancestor]]
    while paths:
        path = paths.pop()
        try:
            with open(f"/proc/{path[-1]}/status", "rb") as f:
                found = re.search(rb"^NSpid:\s+(.*)$", f.read(), re.M)
        except OSError:
            continue
        if found and int(found[1].split()[-1]) == inner_pid and len(path) > 1:
            return path
        paths += [[*path, child] for child in children(path[-1])]
    return []


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


def reap_orphans(waited: set[int]) -> None:
    """Reaps the zombies handed to this process (a subreaper), except those a Popen in `waited`
    will wait for: bwrap leaves its pid namespace's init behind for its parent's reaper, and until
    reaped it counts against the sandbox cgroup's process limit."""
    me = os.getpid()
    for p in processes():
        if p.ppid == me and p.state in b"ZX" and p.pid not in waited:
            with suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)


def collect(
    proc: subprocess.Popen, deadline: float, max_bytes: int, cleanup: Callable[[], None]
) -> tuple[bytes, bytes, bool]:
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


def exit_text(code: int | None) -> str:
    return f"exit code {code}" if code is None or code >= 0 else f"killed by {signal_name(-code)}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- folders -----------------------------------------------------------------------------------


def remove_tree(folder: Path) -> None:
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


# world-writable places code outside a jail may leave files in
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def remove_files_of(uid: int) -> None:
    """Removes what a sandbox uid left in the shared temporary folders: only it ever owns files there."""
    for shared in SHARED_TMP:
        with suppress(OSError):
            for entry in os.scandir(shared):
                with suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        remove_tree(Path(entry.path))
                    else:
                        os.unlink(entry.path)
