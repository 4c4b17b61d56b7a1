"""One local sandbox's state (`LocalSandbox`), the command lines of its processes, and the making
and removal of its place on the host:
a folder named by its id under the sandbox root, locked by its server while it lives, holding
`owner.json` (what a later server needs to sweep it), the jail's account files, and `files/` (a
file system of its own where the server may make one) with `home/` (/home/user) and `tmp/` (/tmp).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from nanbeige.tools.sandbox.budget import Cgroup, make_cgroup, make_disk, place_lock, unmount
from nanbeige.tools.sandbox.channel import Channel
from nanbeige.tools.sandbox.jail import JAIL_WORKER, account_files, jail_args
from nanbeige.tools.sandbox.probe import Isolation
from nanbeige.tools.sandbox.sandbox_config import MB, SANDBOX_HOME, SandboxConfig, SandboxError
from nanbeige.tools.sandbox.seccomp import filter_fd
from nanbeige.tools.sandbox.system import (
    Proc,
    allocate_uid,
    children,
    kill_processes,
    minimal_env,
    pid_namespace,
    processes,
    release_uid,
    remove_files_of,
    remove_tree,
    setpriv_args,
)

WORKER = str(Path(__file__).with_name("worker.py"))
HOME_IN_TEXT = re.compile(r"/home/user(?![\w.-])")


@dataclass
class LocalSandbox:
    id: str
    place: Path
    """The sandbox's own folder on the host, the server's: the lock, the disk image, account files."""
    folder: Path
    """Its home, shown to the code as /home/user."""
    uid: int | None
    uid_lock: int | None
    place_lock: int
    """A lock on `place`, held while the server lives: a later server sweeps only unlocked places."""
    jailed: bool = False
    cgroup: Cgroup | None = None
    cgroup_lock: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    killing: threading.Lock = field(default_factory=threading.Lock)
    """Held while the budget watch kills the sandbox's processes; a new process waits for it."""
    worker: subprocess.Popen | None = None
    channel: Channel = field(default_factory=lambda: Channel(-1, -1))
    keep: set[int] = field(default_factory=set)
    """The worker and, in a jail, the processes between Popen's and it."""
    sessions: set[int] = field(default_factory=set)
    idle_cpu: float | None = None
    """The worker's CPU time when its last call ended, as the idle watch first read it (None: not yet)."""
    stopped_idle: str = ""
    """Why the worker was stopped between calls, for the next call to say."""
    oom_kills: int = 0
    """The cgroup's count of processes killed for want of memory, when last reported."""
    disk_used: int = 0
    """Bytes its files took at the disk watch's last look (where no file system of its own holds them)."""
    over_budget: str = ""
    """Why the budget watch stopped the sandbox's processes, for the call that saw them die to say."""
    memory_mb: int = 0
    """The memory its processes together may use (`SandboxConfig.memory_mb`), as its errors say it."""

    @property
    def tmp(self) -> Path:
        return self.folder.with_name("tmp")

    def to_host(self, text: str) -> str:
        return text if self.jailed else HOME_IN_TEXT.sub(lambda _: str(self.folder), text)

    def to_model(self, text: str) -> str:
        return text if self.jailed else text.replace(str(self.folder), SANDBOX_HOME)

    def status(self, code: int) -> int:
        """A process's exit status as Popen gives it: bwrap passes on a death by signal as 128 + the signal."""
        return 128 - code if self.jailed and code > 128 else code

    def wait_for_kills(self) -> None:
        """Returns once a kill by the budget watch is over, so that no new process of this sandbox dies in it."""
        with self.killing:
            pass

    def may_have_strays(self) -> bool:
        """Whether processes other than the worker may run: with a cgroup, one small read tells, instead of a
        scan of every process (the worker and the jail reap their own children, so nothing else waits)."""
        return not self.cgroup or bool(self.cgroup.members() - self.keep)

    def owns(self) -> Callable[[Proc], bool]:
        """Whether a process is the sandbox's: its uid, or else its jails' pid namespaces, or else
        its session (the sessions of the processes the server started)."""
        if self.uid is not None:
            uid = self.uid
            return lambda p: p.uid == uid
        if self.jailed:  # the pid namespace of each of its jails, which code cannot leave
            spaces = {pid_namespace(child) for pid in self.sessions for child in children(pid)} - {""}
            me = os.getuid()
            return lambda p: p.uid == me and pid_namespace(p.pid) in spaces
        sessions = set(self.sessions)
        return lambda p: p.session in sessions

    def kill_strays(self) -> int:
        """Kills what the last call left running (only the Python worker may outlive a call); returns how many."""
        return kill_processes(self.owns(), keep=self.keep, waited=set(self.sessions))

    def budget_spent(self) -> str:
        """Why the sandbox's processes were killed, if a budget of the whole sandbox did it; said once."""
        reason, self.over_budget = self.over_budget, ""
        if not reason and self.cgroup and (kills := self.cgroup.oom_kills()) > self.oom_kills:
            self.oom_kills = kills
            reason = (
                f"the sandbox ran out of memory (its processes together may use {self.memory_mb} MB), "
                "so the kernel killed a process"
            )
        return reason


def make_sandbox(
    config: SandboxConfig, *, own_uid: bool, jailed: bool, cgroups: tuple[int, tuple[Path, ...]] | None, disks: bool
) -> LocalSandbox:
    """A new sandbox's place, uid, cgroup and file system; SandboxError (with nothing left) if one fails."""
    sandbox_id = secrets.token_hex(10)
    place = Path(os.path.realpath(config.root / sandbox_id))
    guard = place_lock(config.root, shared=True)
    try:
        place.mkdir(mode=0o711)
        held = os.open(place, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(held, fcntl.LOCK_EX)
    finally:
        os.close(guard)
    uid, uid_lock = allocate_uid() if own_uid else (None, None)
    box = LocalSandbox(
        sandbox_id, place, place / "files" / "home", uid, uid_lock, held, jailed=jailed, memory_mb=config.memory_mb
    )
    try:
        _make_place(box, config, cgroups, disks)
    except (OSError, subprocess.SubprocessError) as exc:
        remove_sandbox(box)
        raise SandboxError(f"The sandbox could not be made: {exc}") from None
    return box


def _make_place(
    box: LocalSandbox, config: SandboxConfig, cgroups: tuple[int, tuple[Path, ...]] | None, disks: bool
) -> None:
    owner = box.uid if box.uid is not None else os.getuid()
    if cgroups:
        box.cgroup = make_cgroup(cgroups, f"sandbox-{box.id}", config.memory_mb * MB, config.max_processes)
        box.cgroup_lock = box.cgroup.hold()
    # what a later server needs to sweep this sandbox if this one is killed
    owner_file = os.open(box.place / "owner.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(owner_file, "w") as f:
        json.dump(
            {
                "uid": box.uid,
                "cgroup": [str(f) for f in box.cgroup.folders] if box.cgroup else [],
                "version": box.cgroup.version if box.cgroup else 0,
            },
            f,
        )
    if disks:
        make_disk(box.place / "disk.img", box.place / "files", config.disk_mb)
    else:
        (box.place / "files").mkdir()
    for folder in (box.folder, box.tmp):
        folder.mkdir(mode=0o700)
        os.chown(folder, owner, owner)
    for name, text in zip(("passwd", "group"), account_files(owner), strict=True):
        (box.place / name).write_text(text)


def remove_sandbox(box: LocalSandbox, killed: bool = False) -> None:
    """Everything of a sandbox once its worker is stopped: processes (unless `killed` says `kill_all`
    did it), cgroup, file system, folders, what it left in the shared temporary folders (outside a
    jail), uid and locks."""
    if box.cgroup:
        box.cgroup.remove()
    if box.cgroup_lock is not None:
        os.close(box.cgroup_lock)
    if not killed:
        kill_processes(box.owns(), keep=set(), waited=set(box.sessions))
    unmount(box.place / "files", image=box.place / "disk.img")  # its loop device goes once nothing holds it
    remove_tree(box.place)
    if box.uid is not None and not box.jailed:
        remove_files_of(box.uid)
    if box.uid is not None and box.uid_lock is not None:
        release_uid(box.uid, box.uid_lock)
    os.close(box.place_lock)


def kill_all(boxes: list[LocalSandbox]) -> None:
    """SIGKILLs every process of these sandboxes, in one pass over /proc for all of them rather than
    one each: a server told to stop has about two seconds, also with many busy sandboxes. Killed
    first, before any is taken apart, nothing of theirs holds a file system when it is unmounted."""
    owners = [box.owns() for box in boxes]  # before the kills: a jail's processes name its namespaces
    waited = {pid for box in boxes for pid in box.sessions}
    for box in boxes:
        if box.cgroup:
            box.cgroup.kill(wait=False)
        for pid in box.sessions:
            with suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    kill_processes(lambda p: any(owns(p) for owns in owners), keep=set(), waited=waited)


# --- the command line of its processes ---------------------------------------------------------


def limits(box: LocalSandbox, c: SandboxConfig, python: bool) -> str:
    """The rlimits the worker sets on itself before it runs anything."""
    values = {"AS": c.memory_mb * MB, "FSIZE": c.file_size_mb * MB, "NOFILE": c.max_open_files, "CORE": 0}
    if box.uid is not None:
        values["NPROC"] = c.max_processes
    elif os.geteuid() != 0:
        # RLIMIT_NPROC counts all of the user's tasks, so allow what already runs plus the budget
        values["NPROC"] = sum(p.threads for p in processes() if p.uid == os.getuid()) + c.max_processes
    if not python:
        values["CPU"] = c.cpu_seconds  # the Python worker sets its own, per cell
    return ",".join(f"{name}={value}" for name, value in values.items())


def command_line(
    box: LocalSandbox, config: SandboxConfig, isolation: Isolation, mode: list[str], python: bool
) -> tuple[list[str], list[int]]:
    """The command line of a sandbox process (the worker in `mode`), and the descriptors it needs
    passed (the caller closes them)."""
    worker, fds = WORKER, []
    prefix = box.cgroup.join_prefix() if box.cgroup else []
    if isolation.jail:
        fds.append(filter_fd())
        prefix += jail_args(
            isolation.jail,
            home=str(box.folder),
            tmp=str(box.tmp),
            passwd=str(box.place / "passwd"),
            group=str(box.place / "group"),
            worker=WORKER,
            uid=box.uid,
            network=config.network,
            seccomp=fds[0],
            hidden=config.hidden,
        )
        worker = JAIL_WORKER
    prefix += isolation.prefix
    if box.uid is not None:
        prefix += setpriv_args(box.uid, isolation.read_all)
    # -S (no site-packages) starts faster; only the Python worker needs the packages
    flags = ["-I", "-B"] if python else ["-I", "-S", "-B"]
    return [*prefix, config.python, *flags, worker, limits(box, config, python), *mode], fds


def sandbox_env(box: LocalSandbox, config: SandboxConfig) -> dict[str, str]:
    """All the environment its processes get (no API keys): see `minimal_env`."""
    env = minimal_env(Path(SANDBOX_HOME) if box.jailed else box.folder, config.python)
    if box.jailed:
        env["TMPDIR"] = "/tmp"
    return env
