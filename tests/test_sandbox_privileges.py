"""The privileges hostile code in the local sandbox would reach for, run for real under the jail:
set-uid programs, user namespaces, mounts, raised limits, the jail's own init, and a jail killed from inside."""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from jailed_sandboxes import JAILED, boxes, make_boxes, new_id, outcomes, run_hostile, value  # noqa: F401 (boxes: the fixture)
from processes import wait_for

from nanbeige.tools.sandbox import SandboxError, Sandboxes
from nanbeige.tools.sandbox.local import LocalBackend

I386_UNSHARE = (
    "import ctypes, mmap\ncode = bytes([0x53, 0xb8, 0x36, 1, 0, 0, 0xbb, 0, 0, 0, 0x10, 0xcd, 0x80, 0x5b, "
    "0xc3])\nm = mmap.mmap(-1, 4096, prot=7)\nm.write(code)\n"
    "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())\n"
)

# --- privileges an attacker reaches for ----------------------------------------------------------


SETUID_PROGRAMS = ("/usr/bin/passwd", "/usr/bin/chfn", "/usr/bin/chsh")


@JAILED
def test_set_uid_programs_run_without_their_privileges(boxes: Sandboxes) -> None:
    """no_new_privs (and nosuid mounts): a set-uid-root program runs as the sandbox's uid."""
    program = next(
        (
            p
            for p in SETUID_PROGRAMS
            if os.path.exists(p) and os.stat(p).st_mode & stat.S_ISUID and os.stat(p).st_uid == 0
        ),
        None,
    )
    if program is None:
        pytest.skip("no set-uid-root program here to try")
    sid = new_id(boxes)
    uid = boxes.backend._box(sid).uid
    # the program waits for a password on stdin; meanwhile its effective uid is read from /proc
    uids = value(
        boxes,
        sid,
        f"import subprocess, time\n"
        f"p = subprocess.Popen([{program!r}], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\ntime.sleep(0.5)\n"
        "status = open(f'/proc/{p.pid}/status').read()\np.kill()\np.wait()\n"
        "[int(u) for u in status.split('Uid:')[1].split()[:4]]",
    )
    assert uids == [uid] * 4
    caps = value(
        boxes,
        sid,
        "status = open('/proc/self/status').read()\n"
        "{k: v.strip() for k, v in (line.split(':', 1) for line in status.splitlines()) "
        "if k.startswith('Cap') or k == 'NoNewPrivs'}",
    )
    assert caps == {
        "CapInh": "0" * 16,
        "CapPrm": "0" * 16,
        "CapEff": "0" * 16,
        "CapBnd": "0" * 16,
        "CapAmb": "0" * 16,
        "NoNewPrivs": "1",
    }


@JAILED
def test_code_cannot_make_user_namespaces(boxes: Sandboxes) -> None:
    """A user namespace would make the code root over namespaces of its own (mounts, netfilter, the
    kernel's less guarded paths): refused, both to `unshare` and to the system call."""
    sid = new_id(boxes)
    run_hostile(boxes, sid, "unshare --user --map-root-user id")
    # the worker has threads, where unshare(CLONE_NEWUSER) fails anyway: a process of one thread tries
    made = boxes.run_command("python3 -c 'import ctypes; print(ctypes.CDLL(None).unshare(0x10000000))'", sid)
    assert "stdout='-1\\n'" in made, made
    if os.uname().machine == "x86_64":  # the 32-bit system call (int 0x80) a 64-bit kernel also takes
        boxes.backend.write_file(sid, "/home/user/i386.py", I386_UNSHARE.encode())
        # the filter's numbers are x86-64's, so any call through the other ABI kills the process (SIGSYS)
        killed = run_hostile(boxes, sid, "python3 i386.py")
        assert f"code {128 + signal.SIGSYS}" in killed and "Bad system call" in killed, killed


@JAILED
def test_mounts_chroot_device_files_and_the_hostname_are_refused(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    assert "must be superuser" in run_hostile(boxes, sid, "mount -t tmpfs none /tmp")
    refused = outcomes(
        boxes,
        sid,
        "import ctypes, os, stat\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def c(result):\n    if result:\n        raise OSError(ctypes.get_errno(), "
        "os.strerror(ctypes.get_errno()))",
        "(('mount', lambda: c(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))),"
        " ('umount', lambda: c(libc.umount2(b'/home/user', 2))),"
        " ('hostname', lambda: c(libc.sethostname(b'x', 1))), ('chroot', lambda: os.chroot('/tmp')),"
        " ('mknod', lambda: os.mknod('sda', 0o600 | stat.S_IFBLK, os.makedev(8, 0))),"
        " ('setuid', lambda: os.setuid(0)))",
    )
    assert refused == dict.fromkeys(
        ["mount", "umount", "hostname", "chroot", "mknod", "setuid"], "Operation not permitted"
    )


@JAILED
def test_limits_cannot_be_raised(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    raised = outcomes(
        boxes,
        sid,
        "import resource",
        "((n, lambda n=n: resource.setrlimit(getattr(resource, "
        "'RLIMIT_' + n), (resource.RLIM_INFINITY,) * 2)) for n in ('NPROC', 'AS', 'FSIZE'))",
        "str(e)",
    )
    assert raised == dict.fromkeys(["NPROC", "AS", "FSIZE"], "not allowed to raise maximum limit")


@JAILED
def test_system_folders_are_read_only_and_sys_devices_and_host_accounts_are_absent(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    written = outcomes(
        boxes, sid, "", "((p, lambda p=p: open(p, 'a')) for p in ('/usr/bin/evil', '/etc/evil', '/etc/passwd'))"
    )
    assert all(error in ("Read-only file system", "Permission denied") for error in written.values()), written
    found = value(
        boxes,
        sid,
        "import os, stat\nout = {'sys': os.path.exists('/sys')}\n"
        "modes = {n: os.lstat('/dev/' + n).st_mode for n in os.listdir('/dev')}\n"
        "out['devices'] = [n for n, m in modes.items() if stat.S_ISBLK(m) or stat.S_ISCHR(m)]\n"
        "out['accounts'] = [line.split(':')[0] for line in open('/etc/passwd')]\nout",
    )
    assert found["sys"] is False
    assert set(found["devices"]) <= {"full", "null", "random", "tty", "urandom", "zero", "ptmx"}
    assert found["accounts"] == ["root", "user"]


@JAILED
def test_the_jails_init_cannot_be_signalled_or_looked_into(boxes: Sandboxes) -> None:
    """Pid 1 of the jail is bwrap, as root: killing it, or reading its environment, root or program, is refused."""
    sid = new_id(boxes)
    refused = outcomes(
        boxes,
        sid,
        "import os, signal",
        "(('kill', lambda: os.kill(1, signal.SIGKILL)), "
        "('environ', lambda: open('/proc/1/environ').read()), "
        "('root', lambda: os.listdir('/proc/1/root')), ('exe', lambda: os.readlink('/proc/1/exe')))",
        "type(e).__name__",
    )
    assert refused == dict.fromkeys(["kill", "environ", "root", "exe"], "PermissionError")
    assert value(boxes, sid, "1 + 1") == 2


@JAILED
@pytest.mark.parametrize(
    "kill",
    ["os.kill(-1, signal.SIGKILL)", "os.killpg(0, signal.SIGKILL)", "os.kill(os.getppid(), signal.SIGKILL)"],
    ids=["all", "group", "worker"],
)
def test_a_program_that_kills_its_jail_is_told_apart_from_a_jail_that_fails(tmp_path: Path, kill: str) -> None:
    """A program run for a judge can end its jail's worker with everything it can signal, its process group
    or its parent: the worker reports nothing. A known-good program, run in a fresh jail, then shows the
    machine works, so the run is the program's failure; where the machine breaks meanwhile (bwrap fails for
    the known-good program), it is the machine's, an error."""
    backend = LocalBackend(make_boxes(tmp_path).config)
    try:
        sid = backend.create(60)
        run = backend.run_program(sid, [sys.executable, "-I", "-c", f"import os, signal\n{kill}"])
        assert (run.killed_sandbox, run.started, run.reported, run.exit_code) == (True, True, False, -signal.SIGKILL), (
            run
        )
        assert backend.run_program(sid, [sys.executable, "-I", "-c", "print(1)"]).stdout == b"1\n"
        folder = backend._box(sid).folder
        waiting = (
            f"import os, signal, time\nopen('ready', 'w').close()\nwhile not os.path.exists('go'):\n"
            f"    time.sleep(0.01)\n{kill}"
        )

        def break_bwrap_while_it_runs() -> None:
            wait_for(lambda: (folder / "ready").exists(), 30)
            isolation = backend.isolation
            backend._isolation = replace(isolation, jail=replace(isolation.jail, bwrap="/bin/false"))
            backend.write_file(sid, "/home/user/go", b"")

        breaker = threading.Thread(target=break_bwrap_while_it_runs)
        breaker.start()
        with pytest.raises(
            SandboxError,
            match=r"the sandbox ended while the program ran \(killed by SIGKILL.*a "
            r"known-good program failed in a fresh sandbox too \(exit code 1",
        ):
            backend.run_program(sid, [sys.executable, "-I", "-c", waiting])
        breaker.join()
        with pytest.raises(SandboxError, match=r"the sandbox's jail did not run the program \(exit code 1"):
            backend.run_program(sid, [sys.executable, "-I", "-c", "print(1)"])  # never started: never a reward
    finally:
        backend.close()
    assert os.listdir(tmp_path / "sandboxes") == []
