"""Which of the OS's isolation tools work here, found by trying them (`probe_isolation`): a jail (bwrap),
a uid of its own per sandbox (setpriv, as root), network and pid namespaces (unshare); what the local
sandbox then enforces is `Isolation`.

The jail fails closed: where it is wanted (unless the operator set NANBEIGE_SANDBOX_JAIL=0) and cannot be
made now, for a moment or for good, the probe raises `ProbeError` and no code runs; only a jail that
works is kept, so a failed probe is tried again by the next call.
"""

from __future__ import annotations

import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nanbeige.tools.sandbox.jail import (
    JAIL_WORKER,
    Jail,
    account_files,
    find_bwrap,
    interpreter_paths,
    jail_args,
    namespace_args,
)
from nanbeige.tools.sandbox.sandbox_config import SandboxError
from nanbeige.tools.sandbox.seccomp import filter_fd, supported
from nanbeige.tools.sandbox.system import allocate_uid, minimal_env, release_uid, remove_tree, setpriv_args

log = logging.getLogger(__name__)

# a try that runs out of its time is tried again with the next: on a loaded machine a start may take long
PROBE_TIMEOUTS_S = (20.0, 120.0)
BWRAP_TRIES = 3
JAIL_OFF = "the server's operator can set NANBEIGE_SANDBOX_JAIL=0 to run code without the jail"
INSTALL = f"install it (apt-get install bubblewrap, or dnf install bubblewrap), or {JAIL_OFF}"
RETRY = f"the next call tries again; if it keeps failing, {JAIL_OFF}"


class ProbeError(SandboxError):
    """Whether the sandbox can be isolated here could not be decided, or the jail could not be made:
    no code may run, since it would run with less isolation than it should. One line: `why`, then
    `fix`, what the model or the operator can do."""

    def __init__(self, why: str, fix: str = "try again later") -> None:
        super().__init__(f"The sandbox could not be made: {why}. No code was run; {fix}.")


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


def probe_isolation(
    *, python: str, worker: str, root: Path, network: bool, drop_privileges: bool, jail: bool
) -> Isolation:
    """Tries which of the OS's isolation tools work here (each try is ~10 ms). `worker` is the sandbox
    worker script, run under setpriv to check what a sandbox uid can reach. With `jail`, the jail or
    ProbeError; without (the operator's choice), what the OS allows, or ProbeError where that cannot be
    decided now."""
    root_user = os.geteuid() == 0
    can_drop = root_user and drop_privileges and shutil.which("setpriv")
    if jail:
        isolation = Isolation(
            not network,
            True,
            bool(can_drop),
            False,
            bool(can_drop) or not root_user,
            (),
            probe_jail(python, worker, root, as_root=bool(can_drop)),
        )
        log.info("local sandbox isolation: %s", isolation)
        return isolation
    own_uid, read_all = _probe_uid(python, worker, root) if can_drop else (False, False)
    # Without a uid of its own, a pid namespace keeps the code from signalling the server or the
    # user's other processes, which share the uid.
    wanted = [
        flags for flags, want in ((("--net",), not network), (("--pid", "--fork", "--kill-child"), not own_uid)) if want
    ]
    user = () if root_user else ("--map-root-user",)
    candidates = [
        ("unshare", *user, *itertools.chain(*combo))
        for size in range(len(wanted), 0, -1)
        for combo in itertools.combinations(wanted, size)
    ]
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


def unjailed_notice(isolation: Isolation | None) -> str:
    """What the model is told when its sandbox is not jailed (empty when it is, or not known yet): what code
    in it can do."""
    if isolation is None or isolation.jail:
        return ""
    if isolation.own_uid and isolation.read_all:
        reach = (
            "code in it can read every file on this machine (the interpreter is readable only to the "
            "server's user, so the sandbox keeps CAP_DAC_READ_SEARCH), and write its own folder and /tmp"
        )
    elif isolation.own_uid:
        reach = "code in it can read the host's world-readable files, and write its own folder and /tmp"
    else:
        reach = (
            "code in it runs as the server's user: it can read and change that user's files, other sandboxes' included"
        )
    return f"This sandbox has no filesystem jail (the jail is turned off here, NANBEIGE_SANDBOX_JAIL=0): {reach}."


def probe_jail(python: str, worker: str, root: Path, as_root: bool) -> Jail:
    """The jail, once bwrap has run the worker and the interpreter in one here (as the sandbox's uid, as
    root). ProbeError where none can be made now: no bwrap, a bwrap that fails (for a moment or for good:
    which, no one probe can tell), a machine the seccomp filter has no numbers for, a jail that does not
    run the interpreter, a try that never finishes. No code may run then, rather than run unjailed."""
    bwrap = find_bwrap()
    if not bwrap:
        raise ProbeError("bwrap (Bubblewrap), the jail sandboxed code runs in, is not installed here", INSTALL)
    if not supported():
        raise ProbeError(
            f"the jail's system call filter has no numbers for this machine ({platform.machine()})", JAIL_OFF
        )
    if failed := _bwrap_fails(bwrap, as_root):
        raise ProbeError(f"bwrap could not make the jail's namespaces, {BWRAP_TRIES} tries ({failed})", RETRY)
    jail = Jail(bwrap, _interpreter_paths(python), as_root)
    uid, lock = allocate_uid() if as_root else (os.getuid(), None)
    folder = Path(tempfile.mkdtemp(prefix=".jail-probe-", dir=root))
    seccomp = filter_fd()
    try:
        for name, text in zip(("passwd", "group"), account_files(uid), strict=True):
            (folder / name).write_text(text)
        for name in ("home", "tmp"):
            (folder / name).mkdir(mode=0o700)
            os.chown(folder / name, uid, uid)
        args = jail_args(
            jail,
            home=str(folder / "home"),
            tmp=str(folder / "tmp"),
            passwd=str(folder / "passwd"),
            group=str(folder / "group"),
            worker=worker,
            uid=uid,
            network=False,
            seccomp=seccomp,
        )
        drop = setpriv_args(uid, False) if as_root else []
        check = "import os; os.listdir('/home/user'); open('/tmp/x', 'w')"
        done = _run(
            [*args, *drop, python, "-I", "-S", "-B", JAIL_WORKER, "", "exec", "-1", python, "-I", "-S", "-c", check],
            (seccomp,),
        )
    finally:
        os.close(seccomp)
        remove_tree(folder)
        if lock is not None:
            release_uid(uid, lock)
    if done.returncode != 0:
        raise ProbeError(
            f"bwrap works on this machine, but the jail could not run the interpreter ({_said(done)})", RETRY
        )
    return jail


def _bwrap_fails(bwrap: str, as_root: bool) -> str:
    """How bwrap failed to make a jail's namespaces here, each of its tries; empty once one worked. A
    failure may be passing (memory or processes short for a moment), so it is tried more than once."""
    args = [
        bwrap,
        *namespace_args(as_root=as_root, network=False),
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    for attempt in range(BWRAP_TRIES):
        done = _run(args)
        if done.returncode == 0:
            return ""
        log.info("local sandbox: bwrap failed (try %d of %d): %s", attempt + 1, BWRAP_TRIES, _said(done))
        time.sleep(0.1)
    return _said(done)


def _said(done: subprocess.CompletedProcess[bytes]) -> str:
    """A failed run as one line: its exit status and the end of what it wrote on stderr."""
    said = " ".join(done.stderr.decode(errors="replace").split())[-300:]
    return f"exit status {done.returncode}{': ' + said if said else ''}"


def _interpreter_paths(python: str) -> tuple[str, ...]:
    for timeout in PROBE_TIMEOUTS_S:
        try:
            return interpreter_paths(python, timeout)
        except subprocess.TimeoutExpired:
            log.warning("local sandbox: %s did not start within %g s; trying again", python, timeout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise ProbeError(f"the interpreter {python} could not tell its folders: {exc}") from None
    raise ProbeError(
        f"the interpreter {python} did not finish within {sum(PROBE_TIMEOUTS_S):g} s while the jail "
        "was tested, so whether code can be jailed here is not yet known (the machine may be overloaded)"
    )


def _probe_uid(python: str, worker: str, root: Path) -> tuple[bool, bool]:
    """Whether sandboxes can run as a uid of their own, and whether that needs CAP_DAC_READ_SEARCH.
    An interpreter the uid cannot read may still start, with another stdlib and without its
    packages: the check compares sys.base_prefix, and enters the sandbox root."""
    where = _run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"], output=True).stdout.decode().strip()
    check = f"import os, sys; os.chdir(sys.argv[1]); sys.exit(sys.base_prefix != {where!r})"
    uid, lock = allocate_uid()
    try:
        for read_all in (False, True):
            if _succeeds(
                [
                    *setpriv_args(uid, read_all),
                    python,
                    "-I",
                    "-S",
                    "-B",
                    worker,
                    "",
                    "exec",
                    "-1",
                    python,
                    "-I",
                    "-S",
                    "-c",
                    check,
                    str(root),
                ]
            ):
                return True, read_all
        return False, False
    finally:
        os.close(lock)


def _succeeds(args: list[str]) -> bool:
    return _run(args).returncode == 0


def _run(args: list[str], pass_fds: tuple[int, ...] = (), output: bool = False) -> subprocess.CompletedProcess[bytes]:
    """Runs a probe's command (exit status 127 where it cannot start). A try that runs out of time
    tells nothing about the tool, only that the machine is slow: it is tried again with more time,
    and ProbeError says when every try did."""
    for timeout in PROBE_TIMEOUTS_S:
        try:
            return subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                stdout=subprocess.PIPE if output else subprocess.DEVNULL,
                env=minimal_env(Path("/")),
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            log.warning("local sandbox: probing with %s took more than %g s; trying again", args[0], timeout)
        except OSError as exc:
            return subprocess.CompletedProcess(args, 127, b"", str(exc).encode())
    raise ProbeError(
        f"{os.path.basename(args[0])} did not finish within {sum(PROBE_TIMEOUTS_S):g} s while the "
        "sandbox's isolation was tested, so what it can enforce here is not yet known (the machine may "
        "be overloaded)"
    )
