"""The filesystem jail of the local sandbox: Bubblewrap (`bwrap`) command lines that show sandboxed
code only read-only system folders, the interpreter's prefix and packages, the sandbox's own folder
as /home/user, and a /tmp, /dev and /proc of its own, in namespaces with no network and no host
sockets. As root, the code then becomes the sandbox's unprivileged uid with no capabilities
(`setpriv` inside the jail); as another user, bwrap maps that user into a user namespace.

It knows nothing of sandboxes: callers pass folders and uids. `probe.probe_jail` makes sure a
jail can be made here (a server keeps one that works, and tries again after a failure); `jail_args`
builds the prefix of each command, and `seccomp` the system calls it refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath

JAIL_HOME = "/home/user"
JAIL_WORKER = "/run/sandbox/worker.py"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SHM_BYTES = 64 * 1024 * 1024  # /dev/shm, for multiprocessing's semaphores


@dataclass(frozen=True)
class Jail:
    """What every sandbox of this server shares in its jail, found once by `probe_jail`."""

    bwrap: str
    """Path of the bwrap program."""
    read_only: tuple[str, ...]
    """Host folders shown read-only at the same path: the interpreter's prefixes and package folders."""
    as_root: bool
    """The server runs as root: bwrap needs no user namespace, and the code drops to the sandbox's uid."""


def interpreter_paths(python: str, timeout: float = 30.0) -> tuple[str, ...]:
    """The folders an interpreter needs to start and import its packages: its prefixes and every
    site-packages on its path (a .pth file may add one from elsewhere)."""
    script = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, os.path.realpath(sys.executable), "
        "*[p for p in sys.path if os.path.basename(p) in ('site-packages', 'dist-packages')]]))"
    )
    out = subprocess.run(
        [python, "-I", "-c", script], capture_output=True, text=True, timeout=timeout, check=True
    ).stdout
    prefix, base, executable, *sites = json.loads(out)
    paths = [prefix, base, os.path.dirname(executable), *sites]
    kept: list[str] = []
    folders = {p for p in paths if os.path.isdir(p)}
    for path in sorted(folders | {os.path.realpath(p) for p in folders}):
        if not any(PurePosixPath(path).is_relative_to(k) for k in kept) and not path.startswith(SYSTEM_DIRS):
            kept.append(path)
    return tuple(kept)


def jail_args(
    jail: Jail,
    *,
    home: str,
    tmp: str,
    passwd: str,
    group: str,
    worker: str,
    uid: int | None,
    network: bool,
    seccomp: int,
    hidden: tuple[str, ...] = (),
) -> list[str]:
    """The command prefix that runs a program in the jail: home and tmp are host folders shown as
    /home/user and /tmp, passwd and group files to show as /etc/passwd and /etc/group (so that the
    uid has a name, `user`), worker the worker script, shown at JAIL_WORKER, seccomp a descriptor
    of `seccomp.syscall_filter()`, hidden folders inside the read-only ones to show empty."""
    args = [jail.bwrap, *namespace_args(as_root=jail.as_root, network=network), *system_args()]
    args += [
        "--ro-bind",
        passwd,
        "/etc/passwd",
        "--ro-bind",
        group,
        "/etc/group",
        "--perms",
        "0755",
        "--dir",
        "/home",
        "--bind",
        home,
        JAIL_HOME,
        "--bind",
        tmp,
        "/tmp",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(SHM_BYTES),
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
    ]
    # after /tmp and /home/user: an interpreter under /tmp (a virtual environment there) stays visible
    args += read_only_args(jail.read_only)
    for folder in hidden:
        args += ["--tmpfs", folder]
    args += ["--perms", "0755", "--dir", "/run/sandbox", "--ro-bind", worker, JAIL_WORKER, "--chdir", JAIL_HOME]
    args += ["--seccomp", str(seccomp)]
    if jail.as_root and uid is not None:
        # what setpriv needs to become the sandbox's uid and drop every capability after it
        args += ["--cap-add", "cap_setuid", "--cap-add", "cap_setgid", "--cap-add", "cap_setpcap"]
    return [*args, "--"]


def system_args() -> list[str]:
    """The host's system folders, read-only at the same paths (a folder that is a symlink, as /bin often
    is, shown as the same symlink)."""
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    return args


def read_only_args(read_only: tuple[str, ...]) -> list[str]:
    """The interpreter's folders (`Jail.read_only`), read-only at the same paths, with their missing
    parents made first."""
    args: list[str] = []
    made: set[str] = set()
    for folder in read_only:
        # bwrap would make the missing parents 0700, closed to the sandbox's uid
        for parent in reversed(PurePosixPath(folder).parents[:-1]):
            if str(parent) not in made and not str(parent).startswith(SYSTEM_DIRS) and str(parent) != "/tmp":
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", folder, folder]
    return args


def namespace_args(*, as_root: bool, network: bool) -> list[str]:
    """The namespaces of a jail, and its bond to the thread that starts it."""
    # --die-with-parent: the kernel kills the jail when the thread that started it dies, so callers
    # start long-lived jails from a thread that lives as long as the server (and dies with it)
    args = [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--new-session",
        "--die-with-parent",
        "--hostname",
        "sandbox",
    ]
    if not network:
        args.append("--unshare-net")
    if not as_root:
        args += ["--unshare-user", "--disable-userns"]
    return args


def account_files(uid: int) -> tuple[str, str]:
    """/etc/passwd and /etc/group for a jail: root, and `user` with the sandbox's uid."""
    return (
        f"root:x:0:0:root:/root:/usr/sbin/nologin\nuser:x:{uid}:{uid}:user:{JAIL_HOME}:/bin/sh\n",
        f"root:x:0:\nuser:x:{uid}:\n",
    )


def find_bwrap() -> str | None:
    return shutil.which("bwrap")
