"""Budgets of a whole local sandbox, not of one process: memory and process count for all of its
processes together (a cgroup, v1 or v2, where the host lets this server make one), and disk (its
folders on a file system of their own, an ext4 image on a loop device, where the server runs as
root). Where neither can be had, `local.py` watches the sums itself (`rss_bytes`,
`folder_bytes`) and stops a sandbox past its budget. And the sweep of what a killed server left.

A sandbox's place is a folder named by its id under the sandbox root, which its server keeps
locked (flock) while it lives, holding `owner.json` (its uid and cgroups), and `files`, the mount
point of its file system.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from nanbeige.tools.sandbox.system import (
    UID_BASE,
    UID_SPAN,
    kill_processes,
    remove_files_of,
    remove_tree,
    sweep_uid_locks,
)

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "nanbeige-sandboxes"
# The jail's own processes (bwrap's two, the worker that runs a command) count against pids too.
JAIL_PROCESSES = 8
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
STALE_AFTER_S = 10.0
LOOP_DETACH_S = 2.0  # past it, something outside the sandbox holds its file system: waiting longer is no use
PLACE_NAME = re.compile(r"[0-9a-f]{20}")  # a sandbox id
EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # stop at once, writing nothing back
JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


# --- cgroups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cgroup:
    """One sandbox's cgroup: a folder per v1 controller (memory, pids) or one v2 folder."""

    folders: tuple[Path, ...]
    version: int

    def join_prefix(self) -> list[str]:
        """A command prefix that moves the process into this cgroup before it runs the rest, so
        that everything it starts is counted from the first instruction."""
        return ["/bin/sh", "-c", JOIN, "cgroup-join", *(str(f / "cgroup.procs") for f in self.folders), "--"]

    def members(self) -> set[int]:
        try:
            return {int(line) for line in (self.folders[0] / "cgroup.procs").read_text().split()}
        except OSError:
            return set()

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for want of memory so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.folders[0] / name).read_text()
        except OSError:
            return 0
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields.get("oom_kill", 0))

    def kill(self, wait: bool = True) -> None:
        """SIGKILLs every process in it; a fork bomb cannot outrun this, since pids.max holds. Without
        `wait`, signals once and returns, for a caller that waits for many sandboxes' processes at once."""
        if self.version == 2 and (self.folders[0] / "cgroup.kill").exists():
            with suppress(OSError):
                (self.folders[0] / "cgroup.kill").write_text("1")
        for _ in range(200 if wait else 1):
            members = self.members()
            if not members:
                return
            for pid in members:
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def hold(self) -> int:
        """A lock on the cgroup, held while its sandbox lives: `sweep_cgroups` takes only unheld ones."""
        fd = os.open(self.folders[0], os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def remove(self) -> None:
        self.kill()
        for folder in self.folders:
            for _ in range(50):  # killed processes leave their cgroup a moment after the signal
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def cgroup_parents() -> tuple[int, tuple[Path, ...]] | None:
    """Where this server may make sandbox cgroups with memory and pids limits: v1 controller
    folders it can write, or a v2 subtree delegated to it. None where it may not."""
    v1 = tuple(CGROUP_ROOT / c for c in ("memory", "pids"))
    if all((c / "cgroup.procs").exists() for c in v1):
        try:
            for c in v1:
                (c / GROUP_NAME).mkdir(exist_ok=True)
            if all(os.access(c / GROUP_NAME, os.W_OK) for c in v1):  # another user may have made them
                return 1, tuple(c / GROUP_NAME for c in v1)
            return None
        except OSError:
            return None
    return _v2_parent()


def _v2_parent() -> tuple[int, tuple[Path, ...]] | None:
    """The server's own v2 cgroup, made able to hold sandbox cgroups: v2 lets only leaves hold
    processes, so the server moves itself into a leaf of its own (`server`) first. A systemd user
    session delegates such a subtree (`systemd-run --user -p Delegate=yes`)."""
    try:
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        base = CGROUP_ROOT / own.lstrip("/")
        if not {"memory", "pids"} <= set((base / "cgroup.controllers").read_text().split()):
            return None
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            leaf = base / "server"
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            (base / "cgroup.subtree_control").write_text("+memory +pids")
        return 2, (base,)
    except (OSError, StopIteration):
        return None


def make_cgroup(parents: tuple[int, tuple[Path, ...]], name: str, memory_bytes: int, max_processes: int) -> Cgroup:
    version, folders = parents
    group = Cgroup(tuple(p / name for p in folders), version)
    for folder in group.folders:
        folder.mkdir(exist_ok=True)
    limits = {
        1: {
            "memory.limit_in_bytes": memory_bytes,
            "memory.memsw.limit_in_bytes": memory_bytes,
            "pids.max": max_processes + JAIL_PROCESSES,
        },
        2: {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": max_processes + JAIL_PROCESSES},
    }
    for setting, value in limits[version].items():
        for folder in group.folders:
            if (folder / setting).exists():
                (folder / setting).write_text(str(value))
    return group


# --- disk --------------------------------------------------------------------------------------


def can_make_disks() -> bool:
    """Loop-mounted ext4 images need root and the tools; where they work, `make_disk` is ~20 ms."""
    return (
        os.geteuid() == 0
        and bool(shutil.which("mkfs.ext4"))
        and bool(shutil.which("mount"))
        and os.path.exists("/dev/loop-control")
    )


def make_disk(image: Path, mount_point: Path, size_mb: int) -> None:
    """An ext4 file system of size_mb (a sparse image: it takes host disk only as it fills),
    mounted at mount_point without device files or set-uid programs."""
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "timeout": 60, "check": True}
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", str(image)],
        **quiet,
    )  # type: ignore[call-overload]
    mount_point.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "loop,nodev,nosuid", str(image), str(mount_point)], **quiet)  # type: ignore[call-overload]


def unmount(mount_point: Path, image: Path | None = None) -> None:
    """Detaches a sandbox's file system (its loop device goes with it); a no-op where none is mounted.
    `image`, its image file, is about to be deleted: the file system is then shut down first, so that
    the unmount does not write back what the sandbox's files hold (seconds, for a few busy sandboxes),
    and its loop device is waited for, so that a sandbox once removed holds none."""
    if is_mounted(mount_point):
        loop = shut_down(mount_point, image) if image is not None else None
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(str(mount_point).encode(), 2) != 0:  # MNT_DETACH: even if something still uses it
            log.warning("local sandbox: cannot unmount %s: %s", mount_point, os.strerror(ctypes.get_errno()))
        elif loop is not None and image is not None:
            # copies of the mount in other mount namespaces (a jail starting elsewhere copies them all)
            # are detached by the kernel once their mount point is gone
            with suppress(OSError):
                mount_point.rmdir()
            wait_detached(loop, image)


def shut_down(mount_point: Path, image: Path) -> Path | None:
    """Stops the ext4 file system at mount_point from writing anything more, without flushing it, where
    it is the one on `image` (the check matters: the same ioctl on the host's file system would stop it).
    Returns its loop device's `backing_file` entry where it is ours."""
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        device = os.fstat(fd).st_dev
        backing = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/loop/backing_file")
        if backing.read_text().strip() != os.path.realpath(image):
            return None
        with suppress(OSError):  # not shut down: the unmount writes back as usual
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        return backing
    except OSError:
        return None  # not on a loop device
    finally:
        os.close(fd)


def wait_detached(backing: Path, image: Path) -> None:
    """Waits until the loop device no longer holds `image`. The kernel lets go of it when the last hold on
    its file system goes, which may be a moment after the unmount: a copy of the mount in another mount
    namespace is let go by a kernel worker (seen 17 ms late on a busy machine)."""
    target, deadline = os.path.realpath(image), time.monotonic() + LOOP_DETACH_S
    while time.monotonic() < deadline:
        try:
            if backing.read_text().strip().removesuffix(" (deleted)") != target:
                return  # detached, or already another sandbox's
        except OSError:
            return  # detached
        time.sleep(0.005)
    log.warning("local sandbox: the loop device of %s is still attached after %.0f s", image, LOOP_DETACH_S)


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path).encode()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return any(line.split()[4] == target for line in f)
    except OSError:
        return False


# --- sums, where no cgroup or disk of its own can be had --------------------------------------------


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes together."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def folder_bytes(folder: Path, stop_at: int) -> int:
    """Disk used under folder (allocated blocks, so sparse files count as what they take), counted
    until stop_at is passed."""
    total = 0
    for path, dirs, files in os.walk(folder):
        for name in dirs + files:
            with suppress(OSError):
                total += os.lstat(os.path.join(path, name)).st_blocks * 512
        if total > stop_at:
            break
    return total


# --- what a killed server left -------------------------------------------------------------------


def place_lock(root: Path, shared: bool) -> int:
    """A lock over root's sandbox places: shared while one is made and locked, exclusive while
    they are swept, so a sweep never takes a place that is being made for one not yet locked."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return fd


def sweep_cgroups(parents: tuple[int, tuple[Path, ...]]) -> int:
    """Removes the sandbox cgroups no live server holds, whatever folder their sandboxes were in
    (the folder may be gone, and the cgroup with it would stay until the machine restarts)."""
    version, folders = parents
    swept = 0
    for entry in os.scandir(folders[0]):
        if not entry.name.startswith("sandbox-") or not entry.is_dir(follow_symlinks=False):
            continue
        with suppress(OSError):
            if time.time() - entry.stat().st_ctime < STALE_AFTER_S:
                continue  # being made this moment, before its server could lock it
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            finally:
                os.close(fd)
            Cgroup(tuple(f / entry.name for f in folders), version).remove()
            swept += 1
    return swept


def sweep(root: Path) -> int:
    """Removes the sandboxes under root that no live server holds (those of a server that was
    killed): their processes, cgroups, file systems and folders, and stale uid locks. Returns how
    many sandboxes it removed."""
    swept = 0
    guard = place_lock(root, shared=False)
    try:
        for entry in os.scandir(root):
            if not PLACE_NAME.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # a live server's
            try:
                _sweep_place(Path(entry.path))
                swept += 1
            finally:
                os.close(fd)
    finally:
        os.close(guard)
    sweep_uid_locks()
    return swept


def _sweep_place(place: Path) -> None:
    try:
        owner = json.loads((place / "owner.json").read_text())
    except (OSError, ValueError):
        owner = {}
    # only what a server of ours would have written: the place's own cgroup, a sandbox uid
    for folder in owner.get("cgroup", []) if isinstance(owner, dict) else []:
        if isinstance(folder, str) and Path(folder).name == f"sandbox-{place.name}":
            Cgroup((Path(folder),), int(owner.get("version", 1))).remove()
    uid = owner.get("uid") if isinstance(owner, dict) else None
    if isinstance(uid, int) and UID_BASE <= uid < UID_BASE + UID_SPAN:
        kill_processes(lambda p: p.uid == uid, keep=set(), waited=set())
        remove_files_of(uid)
    unmount(place / "files", image=place / "disk.img")
    remove_tree(place)
