"""The operating-system layer of the local sandbox (`sandbox_local.py`): finding which isolation
tools work here (`probe_isolation`), allocating a uid per sandbox, building `setpriv` command
prefixes, listing and killing processes by owner, collecting a process's output under a deadline,
and reaping orphans as a subreaper.

It knows nothing of sandboxes, ids or the model: callers pass plain paths, uids and predicates.
"""

from __future__ import annotations

import fcntl
import itertools
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
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nanbeige.tools.sandbox_jail import JAIL_WORKER, Jail, account_files, interpreter_paths, jail_args

log = logging.getLogger(__name__)

UID_BASE, UID_SPAN = 1_700_000_000, 10_000_000  # far above any real account; one uid per sandbox


# --- what the OS can enforce -------------------------------------------------------------------


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
    """Command prefix that enters the namespaces (`unshare ...`) and, for root without a uid of its
    own, drops CAP_SYS_RESOURCE (`setpriv ...`), so that hard rlimits hold there too. Empty with a jail."""
    jail: Jail | None = None
    """The filesystem jail (bwrap), which also brings its own namespaces: no network, own pids."""


def setpriv_args(uid: int, read_all: bool) -> list[str]:
    caps = ["--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search",
            "--bounding-set=-all,+dac_read_search"] if read_all else ["--inh-caps=-all", "--bounding-set=-all"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", *caps, "--"]


def probe_isolation(*, python: str, worker: str, root: Path, network: bool, drop_privileges: bool,
                    jail: bool) -> Isolation:
    """Tries, once per server, which of the OS's isolation tools work here (each try is ~10 ms).
    `worker` is the sandbox worker script, run under setpriv to check what a sandbox uid can reach."""
    root_user = os.geteuid() == 0
    can_drop = root_user and drop_privileges and shutil.which("setpriv")
    jailed = probe_jail(python, worker, root, as_root=bool(can_drop)) if jail else None
    if jailed:
        isolation = Isolation(not network, True, bool(can_drop), False, bool(can_drop) or not root_user, (), jailed)
        log.info("local sandbox isolation: %s", isolation)
        return isolation
    own_uid, read_all = _probe_uid(python, worker, root) if can_drop else (False, False)
    # Without a uid of its own, a pid namespace keeps the code from signalling the server or the
    # user's other processes, which share the uid.
    wanted = [flags for flags, want in ((("--net",), not network),
                                        (("--pid", "--fork", "--kill-child"), not own_uid)) if want]
    user = () if root_user else ("--map-root-user",)
    candidates = [("unshare", *user, *itertools.chain(*combo))
                  for size in range(len(wanted), 0, -1) for combo in itertools.combinations(wanted, size)]
    prefix = next((c for c in candidates if _succeeds([*c, "true"])), ()) if shutil.which("unshare") else ()
    if root_user and not own_uid and shutil.which("setpriv"):
        # root keeps CAP_SYS_RESOURCE, with which code could raise its hard limits (CPU time among them)
        keep_limits = ("setpriv", "--bounding-set=-sys_resource", "--inh-caps=-sys_resource", "--")
        prefix += keep_limits if _succeeds([*prefix, *keep_limits, "true"]) else ()
    isolation = Isolation("--net" in prefix, "--pid" in prefix, own_uid, read_all, own_uid or not root_user, prefix)
    if not network and not isolation.network_off:
        log.warning("local sandbox: cannot make a network namespace (unshare); sandboxed code can use the network")
    if not own_uid and not isolation.own_pids:
        log.warning("local sandbox: no pid namespace; sandboxed code can signal this user's other processes")
    if root_user and not own_uid:
        log.warning("local sandbox: running as root without a uid of its own; the process limit does not hold")
    log.info("local sandbox isolation: %s", isolation)
    return isolation


def probe_jail(python: str, worker: str, root: Path, as_root: bool) -> Jail | None:
    """A jail, if bwrap can run the worker and the interpreter in one here (as the sandbox's uid,
    as root); None where it cannot (no bwrap, no user namespaces)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None
    try:
        jail = Jail(bwrap, interpreter_paths(python), as_root)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    uid, lock = allocate_uid() if as_root else (os.getuid(), None)
    folder = Path(tempfile.mkdtemp(prefix=".jail-probe-", dir=root))
    try:
        for name, text in zip(("passwd", "group"), account_files(uid), strict=True):
            (folder / name).write_text(text)
        for name in ("home", "tmp"):
            (folder / name).mkdir(mode=0o700)
            os.chown(folder / name, uid, uid)
        args = jail_args(jail, home=str(folder / "home"), tmp=str(folder / "tmp"), passwd=str(folder / "passwd"),
                         group=str(folder / "group"), worker=worker, uid=uid, network=False)
        drop = setpriv_args(uid, False) if as_root else []
        check = "import os; os.listdir('/home/user'); open('/tmp/x', 'w')"
        return jail if _succeeds([*args, *drop, python, "-I", "-S", "-B", JAIL_WORKER, "", "exec", "-1",
                                  python, "-I", "-S", "-c", check]) else None
    finally:
        remove_tree(folder)
        if lock is not None:
            release_uid(uid, lock)


def _probe_uid(python: str, worker: str, root: Path) -> tuple[bool, bool]:
    """Whether sandboxes can run as a uid of their own, and whether that needs CAP_DAC_READ_SEARCH.
    An interpreter the uid cannot read may still start, with another stdlib and without its
    packages: the check compares sys.base_prefix, and enters the sandbox root."""
    where = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"],
                           capture_output=True, text=True, timeout=20).stdout.strip()
    check = f"import os, sys; os.chdir(sys.argv[1]); sys.exit(sys.base_prefix != {where!r})"
    uid, lock = allocate_uid()
    try:
        for read_all in (False, True):
            if _succeeds([*setpriv_args(uid, read_all), python, "-I", "-S", "-B", worker, "", "exec", "-1",
                          python, "-I", "-S", "-c", check, str(root)]):
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


UID_LOCKS = Path(tempfile.gettempdir()) / "nanbeige-sandbox-uids"


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
            if os.fstat(fd).st_ino == os.stat(UID_LOCKS / str(uid)).st_ino \
                    and not any(p.uid == uid for p in processes()):
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
    return {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
            "TMPDIR": str(home), "USER": "user", "LOGNAME": "user", "LANG": "C.UTF-8", "TERM": "dumb",
            "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg",
            # one BLAS thread each: threads count against the process limit
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
    in its own pid namespace (a jailed process knows only that number). Empty when none is found."""
    children: dict[int, list[int]] = {}
    for p in processes():
        children.setdefault(p.ppid, []).append(p.pid)
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
        paths += [[*path, child] for child in children.get(path[-1], ())]
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


def collect(proc: subprocess.Popen, deadline: float, max_bytes: int,
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
