"""The local sandbox's jail against hostile code, run for real: what sandboxed code can see of the host
and of other sandboxes, whether memory and disk budgets hold for all of a sandbox's processes
together, which sockets it can reach, what a deleted sandbox or a server killed outright leaves
behind, and the privileges an attacker would reach for (set-uid programs, user namespaces, mounts,
raised limits). Each assertion fails if containment does."""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import JAIL
from processes import alive, command_line, tree, wait_for

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes
from nanbeige.tools.sandbox.budget import sweep
from nanbeige.tools.sandbox.local import LocalBackend
from nanbeige.tools.sandbox.system import UID_LOCKS, processes

MB = 1024 * 1024
JAILED = pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and JAIL), reason="needs root and a bwrap that works here")
NO_JAIL = "no filesystem jail"


def make_boxes(root: Path, **settings: object) -> Sandboxes:
    return Sandboxes(SandboxConfig(**{"root": root / "sandboxes", "upload_dirs": [root], "timeout_s": 15.0,
                                      "memory_mb": 512, "disk_mb": 64, **settings}))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    sandboxes = make_boxes(tmp_path_factory.mktemp("jail"))
    assert sandboxes.backend.isolation.jail is not None, "root with bwrap, yet no jail"
    yield sandboxes
    sandboxes.close()


def new_id(boxes: Sandboxes) -> str:
    return re.search(r"sandbox_id: ([0-9a-f]+)", boxes.create())[1]  # type: ignore[index]


def outcomes(boxes: Sandboxes, sid: str, setup: str, calls: str, describe: str = "e.strerror") -> dict[str, str]:
    """Runs each `(name, lambda)` of `calls` (the source of a tuple) in the sandbox after `setup`: per
    name, 'done', or the error as `describe` (an expression of `e`) tells it."""
    return value(boxes, sid, f"{setup}\nout = {{}}\nfor name, call in {calls}:\n    try:\n        call()\n"
                             f"        out[name] = 'done'\n    except (OSError, ValueError) as e:\n"
                             f"        out[name] = {describe}\nout")


def value(boxes: Sandboxes, sid: str, code: str) -> Any:
    """The value of the cell's last expression (a Python literal), which must run without error."""
    text = boxes.run_python(code, sid)
    found = re.fullmatch(r"Execution\(Results: \[Result\((.*)\)\], Logs: .*, Error: None\)", text, re.S)
    assert found, text
    return ast.literal_eval(found[1])


# unshare(CLONE_NEWUSER) as the i386 system call 310: push rbx; mov eax, 310; mov ebx, 0x10000000;
# int 0x80; pop rbx; ret
I386_UNSHARE = ("import ctypes, mmap\ncode = bytes([0x53, 0xb8, 0x36, 1, 0, 0, 0xbb, 0, 0, 0, 0x10, 0xcd, 0x80, 0x5b, "
                "0xc3])\nm = mmap.mmap(-1, 4096, prot=7)\nm.write(code)\n"
                "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())\n")


def run_hostile(boxes: Sandboxes, sid: str, command: str) -> str:
    """A command expected to fail: the error text."""
    try:
        text = boxes.run_command(command, sid)
    except SandboxError as failed:
        return str(failed)
    pytest.fail(f"{command!r} was not refused: {text}")


def mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


@dataclass
class Traces:
    """Where a sandbox leaves marks on the host: its place, file system, cgroups, uid lock, processes."""

    place: Path
    cgroups: tuple[Path, ...]
    uid: int

    @classmethod
    def of(cls, backend: LocalBackend, sid: str) -> Traces:
        box = backend._box(sid)
        assert box.uid is not None and box.cgroup is not None
        return cls(box.place, box.cgroup.folders, box.uid)

    def left(self) -> list[str]:
        found = [f"place {self.place}"] if self.place.exists() else []
        found += [f"mount {self.place / 'files'}"] if mounted(self.place / "files") else []
        found += [f"cgroup {f}" for f in self.cgroups if f.exists()]
        found += [f"uid lock {self.uid}"] if (UID_LOCKS / str(self.uid)).exists() else []
        return found + [f"process {p.pid} ({command_line(p.pid)})" for p in processes()
                        if p.uid == self.uid and p.state not in b"ZX"]


# --- the host is out of sight ------------------------------------------------------------------


@JAILED
def test_the_hosts_secrets_home_and_project_are_out_of_sight(boxes: Sandboxes) -> None:
    """/etc/shadow is unreadable, /root holds only the folders leading to the interpreter, and
    neither this project's files nor any of the host's processes (this one among them) exist."""
    sid = new_id(boxes)
    assert "name='PermissionError'" in boxes.run_python("open('/etc/shadow').read()", sid)
    interpreter = boxes.backend.isolation.jail.read_only  # type: ignore[union-attr]
    # every folder leading to the interpreter's folders, and nothing else, is seen on the way there
    seen = value(boxes, sid, f"import os\nkeep = {[*interpreter, '/home/user']!r}\nseen = []\n"
                              "for top in ('/root', '/work', '/home', '/run'):\n"
                              "    for path, dirs, files in os.walk(top):\n"
                              "        dirs[:] = [d for d in dirs if os.path.join(path, d) not in keep]\n"
                              "        seen += [os.path.join(path, n) for n in dirs + files]\nseen")
    leading = {str(p) for folder in interpreter for p in (PurePosixPath(folder), *PurePosixPath(folder).parents)}
    assert set(seen) - leading <= {"/home/user", "/run/sandbox", "/run/sandbox/worker.py"}, seen
    project = Path(__file__).resolve().parents[1]
    ours = [str(p) for p in (Path(__file__).resolve(), project / "README.md", project / "pyproject.toml",
                             project / "tools" / "sandbox" / "local.py", Path.home() / ".bashrc") if p.exists()]
    assert ours and value(boxes, sid, f"import os\n[p for p in {ours!r} if os.path.exists(p)]") == []
    uid = boxes.backend._box(sid).uid
    visible = value(boxes, sid, "import os\n[(int(p), open(f'/proc/{p}/comm').read().strip(), "
                                "int(open(f'/proc/{p}/status').read().split('Uid:')[1].split()[1])) "
                                "for p in os.listdir('/proc') if p.isdigit()]")
    assert os.getpid() not in {pid for pid, _, _ in visible}
    # the jail's own init (bwrap, as root) and the sandbox's processes: no server, no host process
    assert visible and all(name == "bwrap" or owner == uid for _, name, owner in visible), visible
    assert re.search("PermissionError", boxes.run_python("import os\nos.listdir('/proc/1/root')", sid))


@JAILED
def test_another_sandboxs_files_cannot_be_found_or_read_by_any_path(boxes: Sandboxes) -> None:
    """Even a file its owner opened to everyone: B's /home/user is its own, and A's folder is not in
    B's world at all, neither at A's host path nor through /proc."""
    a, b = new_id(boxes), new_id(boxes)
    secret = f"secret-{secrets.token_hex(8)}"
    boxes.run_python(f"import os\nos.makedirs('/home/user/private', mode=0o700)\n"
                     f"open('/home/user/private/{secret}.txt', 'w').write({secret!r})", a)
    assert value(boxes, a, f"open('/home/user/private/{secret}.txt').read()") == secret
    # now A opens everything up: only the jail keeps B out
    boxes.run_python(f"import os\nfor p in ('/home/user', '/home/user/private'): os.chmod(p, 0o777)\n"
                     f"os.chmod('/home/user/private/{secret}.txt', 0o666)", a)
    host_file = boxes.backend._box(a).folder / "private" / f"{secret}.txt"
    assert host_file.read_text() == secret
    tries = [str(host_file), str(host_file.parent), str(boxes.config.root), f"/home/user/private/{secret}.txt"]
    assert value(boxes, b, f"import os\n[p for p in {tries!r} if os.path.exists(p)]") == []
    # a search of everything B can see that is not system or interpreter files
    skip = ["/proc", "/sys", "/dev", "/usr", *boxes.backend.isolation.jail.read_only]  # type: ignore[union-attr]
    found = value(boxes, b, f"import glob, os\nskip = {skip!r}\nfound = []\n"
                            "for path, dirs, files in os.walk('/'):\n"
                            "    dirs[:] = [d for d in dirs if os.path.join(path, d) not in skip]\n"
                            f"    found += [os.path.join(path, f) for f in files if {secret!r} in f]\n"
                            f"found + glob.glob('/proc/*/root/home/user/private/*') + glob.glob('/proc/*/cwd/private')")
    assert found == []
    assert secret not in boxes.run_command("ls -laR /home/user /tmp", b)


# --- budgets of the whole sandbox ----------------------------------------------------------------


@JAILED
def test_a_multi_process_memory_bomb_is_held_to_the_sandbox_budget_by_the_kernel(boxes: Sandboxes) -> None:
    """Four processes of 300 MB each, each under its own address-space limit, against 512 MB for the
    sandbox: the kernel kills all but at most one, and the sandbox works on."""
    sid = new_id(boxes)
    cgroup = boxes.backend._box(sid).cgroup
    assert cgroup is not None
    before = cgroup.oom_kills()
    # Each hog takes its memory only once all four have started, so that they hold it at the same time
    # however slowly a busy machine starts them (a hog that ended before the next one began would survive).
    hog = ("import os, time\nopen(f'started.{os.getpid()}', 'w').close()\n"
           "while sum(name.startswith('started.') for name in os.listdir('.')) < 4:\n    time.sleep(0.01)\n"
           "b = b'1' * (300 * 1024 * 1024)\ntime.sleep(2)\nprint('survived')\n")
    boxes.run_python(f"open('hog.py', 'w').write({hog!r})", sid)
    text = boxes.run_command("for i in 1 2 3 4; do python3 hog.py & done; wait; echo done", sid)
    assert "done" in text and text.count("survived") <= 1, text
    assert cgroup.oom_kills() - before >= 3  # killed by the kernel for the sandbox's memory, not by rlimits
    # the command itself exited 0, yet the model is told (in its stderr) that processes were killed
    assert "[sandbox] the sandbox ran out of memory (its processes together may use 512 MB)" in text
    assert boxes.run_command("echo ok", sid) == "CommandResult(stderr='', stdout='ok\\n', exit_code=0, error=None)"


@JAILED
def test_a_process_started_between_calls_by_a_lingering_thread_is_stopped(boxes: Sandboxes) -> None:
    """A thread left by a cell starts a process after the call ended, which lifts its own CPU limit and
    spins: it does not get to run until the next call."""
    sid = new_id(boxes)
    boxes.run_python("import subprocess, threading\ndef spawn():\n"
                     "    subprocess.Popen(['python3', '-c', 'import resource; "
                     "resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\\nwhile True: pass'], start_new_session=True)\n"
                     "    open('spawned', 'w').close()\n"
                     "threading.Timer(0.5, spawn).start()", sid)
    # The thread leaves a file once the process exists (half a second after the call); the process spins
    # forever unless it is stopped: the watch, which reads every second, stops it. The file, not a sighting of
    # the process, shows it was started, since under load the watch may stop it before a look at the process
    # list (or the process itself) gets to run. The waits are only against a hang.
    spawned = boxes.backend._box(sid).folder / "spawned"
    assert wait_for(spawned.exists, 60)
    assert wait_for(lambda: boxes.backend.leftover_processes(sid) == [], 60)


def test_uploads_and_downloads_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO or a folder where a file is expected, or a NUL in a path, is an error the model can read,
    not a hang of the server or an unexpected failure (with or without a jail)."""
    boxes = make_boxes(tmp_path)
    try:
        sid = new_id(boxes)
        source = tmp_path / "up.txt"
        source.write_text("hello")
        boxes.run_command("mkfifo pipe.txt; mkdir folder.txt", sid)
        for call, error in ((lambda: boxes.upload(sid, str(source), "/home/user/pipe.txt"), "Cannot write"),
                            (lambda: boxes.download_to_local(sid, "/home/user/pipe.txt"), "not a regular file"),
                            (lambda: boxes.download_to_local(sid, "/home/user/folder.txt"), "not a regular file"),
                            (lambda: boxes.download_to_local(sid, "/home/user/a\0b.txt"), "NUL character")):
            with pytest.raises(SandboxError, match=error):
                call()
        assert boxes.upload(sid, str(source), "/home/user/ok.txt") == "File uploaded to /home/user/ok.txt"
    finally:
        boxes.close()


@JAILED
def test_a_worker_killed_for_the_sandboxs_memory_says_so_and_the_sandbox_goes_on(boxes: Sandboxes) -> None:
    """A cell holds 350 MB and starts a child that takes 250 MB more: the kernel kills the biggest
    process, the worker itself; the call says why, and the next call gets a fresh worker."""
    sid = new_id(boxes)
    boxes.run_python("kept = 1\nopen('kept.txt', 'w').write('x')", sid)
    with pytest.raises(SandboxError, match=r"died \(killed by SIGKILL\): the sandbox ran out of memory \(its "
                                           r"processes together may use 512 MB\).*restarted"):
        boxes.run_python("hog = b'1' * (350 * 1024 * 1024)\nimport subprocess, sys\n"
                         "subprocess.run([sys.executable, '-c', \"b = b'1' * (250 * 1024 * 1024)\"])", sid)
    assert "name 'kept' is not defined" in boxes.run_python("kept", sid)
    assert value(boxes, sid, "open('kept.txt').read()") == "x"
    assert boxes.backend.leftover_processes(sid) == []


@JAILED
def test_threads_grabbing_memory_together_are_stopped_and_the_sandbox_stays_usable(boxes: Sandboxes) -> None:
    """Four threads holding 200 MB each: the address-space limit answers MemoryError (or, were the
    kernel first, the worker is killed); either way 800 MB are never held, and the sandbox goes on."""
    sid = new_id(boxes)
    code = ("import threading\nheld, refused = [], []\n"
            "def grab():\n    try:\n        held.append(b'1' * (200 * 1024 * 1024))\n"
            "    except MemoryError:\n        refused.append('MemoryError')\n"
            "threads = []\nfor _ in range(4):\n    t = threading.Thread(target=grab)\n"
            "    try:\n        t.start()\n        threads.append(t)\n"
            "    except RuntimeError:  # no address space left for its stack\n        refused.append('no thread')\n"
            "for t in threads: t.join()\n(len(held), len(refused))")
    try:
        held, refused = value(boxes, sid, code)
        assert held * 200 < 512 and held + refused == 4
        boxes.run_python("del held", sid)
    except SandboxError as exc:
        assert "ran out of memory" in str(exc)
    assert value(boxes, sid, "1 + 1") == 2


@JAILED
def test_a_disk_fill_stops_at_the_sandbox_budget_and_tmp_shares_it(boxes: Sandboxes) -> None:
    """200 MB into a 64 MB sandbox: No space left on device, the host holds at most the budget, /tmp
    is full too, and after `rm` writing works again."""
    sid = new_id(boxes)
    place = boxes.backend._box(sid).place
    assert "No space left on device" in run_hostile(boxes, sid, "head -c 200000000 /dev/zero > big")
    assert host_bytes(place) < 70 * MB
    files = os.statvfs(place / "files")
    assert files.f_blocks * files.f_frsize <= 64 * MB
    assert "No space left on device" in run_hostile(boxes, sid, "head -c 1000000 /dev/zero > /tmp/more")
    assert "No space left on device" in boxes.run_python("open('/tmp/py', 'wb').write(b'1' * 1_000_000)", sid)
    boxes.run_command("rm -f big /tmp/more /tmp/py", sid)
    assert "stdout='written\\n'" in boxes.run_command("head -c 10000000 /dev/zero > /tmp/again && echo written",
                                                      sid)
    assert host_bytes(place) < 70 * MB


def host_bytes(folder: Path) -> int:
    """Host disk taken under folder, not counting file systems mounted below it (they are in their image)."""
    total = 0
    for path, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(path, d))]
        total += sum(os.lstat(os.path.join(path, name)).st_blocks * 512 for name in dirs + files)
    return total


# --- sockets -----------------------------------------------------------------------------------


@JAILED
def test_host_unix_sockets_cannot_be_reached(boxes: Sandboxes) -> None:
    """A socket file under the host's /tmp (open to everyone) does not exist in the jail, an abstract
    socket belongs to the host's network namespace, and nothing reaches either listener."""
    name = f"nanbeige-jail-{secrets.token_hex(6)}"
    path = Path("/tmp") / f"{name}.sock"
    with socket.socket(socket.AF_UNIX) as on_path, socket.socket(socket.AF_UNIX) as abstract:
        on_path.bind(str(path))
        os.chmod(path, 0o777)
        abstract.bind("\0" + name)
        for listener, address in ((on_path, str(path)), (abstract, "\0" + name)):
            listener.listen()
            with socket.socket(socket.AF_UNIX) as check:  # both do listen, on the host
                check.connect(address)
                listener.accept()[0].close()
            listener.setblocking(False)
        try:
            sid = new_id(boxes)
            addresses = {"path": str(path), "abstract": "\0" + name}
            reached = value(boxes, sid, f"import socket\nreached = {{}}\n"
                                        f"for kind, address in {addresses!r}.items():\n"
                                        "    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(2)\n"
                                        "    try:\n        s.connect(address)\n        s.sendall(b'hello')\n"
                                        "        reached[kind] = 'connected'\n"
                                        "    except OSError as e:\n        reached[kind] = type(e).__name__\n"
                                        "    s.close()\nreached")
            assert reached == {"path": "FileNotFoundError", "abstract": "ConnectionRefusedError"}
            for listener in (on_path, abstract):
                with pytest.raises(BlockingIOError):
                    listener.accept()
        finally:
            path.unlink()
    # no other way out either: only a loopback of its own, and no host runtime folders with sockets
    assert value(boxes, sid, "import socket\nsocket.if_nameindex()") == [(1, "lo")]
    assert value(boxes, sid, "import os\n(os.path.exists('/var'), os.path.exists('/run/dbus'), "
                             "os.listdir('/run'))") == (False, False, ["sandbox"])


# --- a sandbox of its own, and nothing left after it ----------------------------------------------


@JAILED
def test_tmp_and_shm_are_private_and_a_deleted_sandbox_leaves_nothing(boxes: Sandboxes) -> None:
    """A file in /tmp or /dev/shm is seen neither by another sandbox nor on the host. Deleting the
    sandbox removes its place, its file system's mount, its cgroups, its uid lock and its processes,
    also one a thread started after the call had ended."""
    a, b = new_id(boxes), new_id(boxes)
    marker = f"marker-{secrets.token_hex(6)}"
    boxes.run_python(f"open('/tmp/{marker}', 'w').write('a')\nopen('/dev/shm/{marker}', 'w').write('a')", a)
    assert value(boxes, a, f"import os\nos.path.exists('/tmp/{marker}') and os.path.exists('/dev/shm/{marker}')")
    assert value(boxes, b, f"import os\n[f for f in os.listdir('/tmp') + os.listdir('/dev/shm') if '{marker}' in f]") \
        == []
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
    traces = Traces.of(boxes.backend, a)
    # a process that starts after the call's end-of-call cleanup, in a session of its own
    boxes.run_python("import subprocess, threading\nthreading.Timer(0.3, lambda: subprocess.Popen("
                     "['sleep', '300'], start_new_session=True)).start()", a)
    assert wait_for(lambda: any(line.startswith("process") for line in traces.left()), 60)  # only against a hang
    assert {line.split()[0] for line in traces.left()} == {"place", "mount", "cgroup", "uid", "process"}
    boxes.backend.destroy(a)
    assert traces.left() == []
    assert value(boxes, b, "1 + 1") == 2  # the other sandbox is untouched


@JAILED
def test_links_and_locked_folders_left_by_code_do_not_harm_the_host_at_deletion(boxes: Sandboxes,
                                                                               tmp_path: Path) -> None:
    """Symbolic links to host paths are not followed when the sandbox is removed, and folders the
    code locked (mode 000) are removed all the same."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    sid = new_id(boxes)
    traces = Traces.of(boxes.backend, sid)
    boxes.run_python(f"import os\nos.symlink({str(victim)!r}, 'to-host')\nos.symlink({str(victim)!r}, '/tmp/to-host')\n"
                     "os.makedirs('locked/deeper')\nopen('locked/deeper/f', 'w').write('x')\n"
                     "os.chmod('locked/deeper', 0)\nos.chmod('locked', 0)", sid)
    boxes.backend.destroy(sid)
    assert (victim / "keep.txt").read_text() == "keep"
    assert traces.left() == []


# --- a server killed outright --------------------------------------------------------------------


def rpc(proc: subprocess.Popen, message: dict, reply: bool = True) -> dict | None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline()) if reply else None


# A cell that starts a process in a session of its own and blinds the worker's watch on the server:
# every descriptor but the standard ones becomes a pipe of its own, which never hangs up.
BLINDED = ("import os, subprocess, time\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\n"
           "r, w = os.pipe()\nfor fd in range(3, 64):\n    if fd not in (r, w):\n        try:\n"
           "            os.dup2(r, fd)\n        except OSError:\n            pass\ntime.sleep(50)")


@JAILED
def test_a_server_killed_outright_leaves_no_process_and_the_next_one_sweeps_the_rest(tmp_path: Path) -> None:
    """SIGKILL while a cell and a command run, each having started a process in a session of its own
    (the cell has also blinded the worker's own watch on the server):
    at once nothing of the sandboxes runs; their places, mounts, cgroups and uid locks stay until
    the next server on the same root sweeps them at its start."""
    root = tmp_path / "sandboxes"
    env = {"NANBEIGE_SANDBOX_BACKEND": "local", "NANBEIGE_SANDBOX_DIR": str(root), "NANBEIGE_SANDBOX_MEMORY_MB": "512",
           "NANBEIGE_SANDBOX_DISK_MB": "64", "NANBEIGE_SANDBOX_TIMEOUT": "60", "PATH": os.environ["PATH"]}
    proc = subprocess.Popen([sys.executable, "-m", "nanbeige.servers.python"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    started: set[int] = set()
    try:
        rpc(proc, {"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                               "clientInfo": {"name": "test", "version": "0"}}})
        rpc(proc, {"method": "notifications/initialized"}, reply=False)
        ids = []
        for n in (2, 3):
            answer = rpc(proc, {"id": n, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}})
            ids.append(re.search(r"sandbox_id: ([0-9a-f]+)", answer["result"]["content"][0]["text"])[1])  # type: ignore
        owners = [json.loads((root / sid / "owner.json").read_text()) for sid in ids]
        traces = [Traces(root / sid, tuple(Path(f) for f in o["cgroup"]), o["uid"]) for sid, o in zip(ids, owners)]
        uids = {t.uid for t in traces}
        # two calls left running: a cell and a command, each with a process in a session of its own
        rpc(proc, {"id": 4, "method": "tools/call", "params": {"name": "run_python_code", "arguments": {
            "sandbox_id": ids[0], "code_block": BLINDED}}}, reply=False)
        rpc(proc, {"id": 5, "method": "tools/call", "params": {"name": "run_command", "arguments": {
            "sandbox_id": ids[1], "command": "setsid sleep 301 & sleep 50"}}}, reply=False)

        def sleepers() -> set[str]:
            return {command_line(p.pid) for p in processes() if p.uid in uids and p.state not in b"ZX"}

        assert wait_for(lambda: {"sleep 300", "sleep 301"} <= sleepers(), 30), sleepers()
        started = tree(proc.pid) - {proc.pid}
        proc.kill()
        proc.wait()
        # gone long before the shortest of them (50 s) would end by itself, however busy the machine
        assert wait_for(lambda: not sleepers() and not alive(started), 20), \
            (sleepers(), [command_line(pid) for pid in alive(started)])
        for t in traces:  # the rest stays for the next server
            assert {line.split()[0] for line in t.left()} == {"place", "mount", "cgroup", "uid"}, t.left()
        after = make_boxes(tmp_path)
        try:
            assert after.config.root == root
            assert after.backend.isolation.jail  # its first use sweeps
            for t in traces:
                assert t.left() == []
            assert os.listdir(root) == []
        finally:
            after.close()
    finally:  # whatever survived a failure
        proc.kill()
        proc.wait()
        for pid in alive(started):
            os.kill(pid, signal.SIGKILL)
        if root.exists():
            sweep(root)


# --- without a jail ----------------------------------------------------------------------------


def test_without_a_jail_the_create_answer_carries_the_notice(tmp_path: Path) -> None:
    """The fallback is said, not hidden: the backend's notice and the create answer name the missing
    jail and why, and what they say the code can reach is true."""
    boxes = make_boxes(tmp_path, jail=False)
    try:
        answer = boxes.create()
        notice = boxes.backend.notice
        assert NO_JAIL in notice and "NANBEIGE_SANDBOX_JAIL=0" in notice and notice in answer
        sid = re.search(r"sandbox_id: ([0-9a-f]+)", answer)[1]  # type: ignore[index]
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "secret.txt").write_text("s3cret")
        os.chmod(private / "secret.txt", 0o600)
        text = boxes.run_python(f"open({str(private / 'secret.txt')!r}).read()", sid)
        isolation = boxes.backend.isolation
        if isolation.own_uid and not isolation.read_all:
            assert "world-readable" in notice and "PermissionError" in text
        else:  # it keeps CAP_DAC_READ_SEARCH, or runs as the server's user
            assert ("every file" in notice or "server's user" in notice) and "s3cret" in text
    finally:
        boxes.close()


@pytest.mark.skipif(not (sys.platform == "linux" and os.geteuid() == 0 and shutil.which("setpriv")),
                    reason="needs root and setpriv")
def test_without_a_jail_what_the_sandbox_left_in_the_shared_tmp_goes_with_it(tmp_path: Path) -> None:
    """Outside a jail the code can write to the host's /tmp; as its uid owns only what it made, those
    files and folders are removed with the sandbox, and so is its uid lock."""
    boxes = make_boxes(tmp_path, jail=False)
    try:
        sid = new_id(boxes)
        name = f"left-{secrets.token_hex(4)}"
        boxes.run_command(f"echo x > /tmp/{name}.txt; mkdir -p /tmp/{name}/deep; touch /tmp/{name}/deep/f", sid)
        uid = boxes.backend._box(sid).uid
        assert uid is not None and Path(f"/tmp/{name}.txt").exists() and Path(f"/tmp/{name}/deep/f").exists()
    finally:
        boxes.close()
    assert not Path(f"/tmp/{name}.txt").exists() and not Path(f"/tmp/{name}").exists()
    assert not (UID_LOCKS / str(uid)).exists()

@JAILED
def test_an_interpreter_in_a_virtual_environment_under_tmp_is_jailed_and_works(tmp_path: Path) -> None:
    """The sandbox's own /tmp must not hide an interpreter that lives under the host's /tmp."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    assert str(venv).startswith("/tmp/")
    boxes = make_boxes(tmp_path, python=str(venv / "bin" / "python"))
    try:
        sid = new_id(boxes)
        assert boxes.backend.isolation.jail is not None and boxes.backend.notice == ""
        assert value(boxes, sid, "import sys\nsys.prefix") == str(venv)
        assert "stdout='ok\\n'" in boxes.run_command("echo ok > /tmp/x && cat /tmp/x", sid)
    finally:
        boxes.close()


@JAILED
def test_with_the_jail_the_create_answer_claims_nothing_missing(boxes: Sandboxes) -> None:
    answer = boxes.create()
    assert boxes.backend.notice == ""
    assert re.fullmatch(r"Sandbox created with sandbox_id: [0-9a-f]+", answer)


# --- privileges an attacker reaches for ----------------------------------------------------------


SETUID_PROGRAMS = ("/usr/bin/passwd", "/usr/bin/chfn", "/usr/bin/chsh")


@JAILED
def test_set_uid_programs_run_without_their_privileges(boxes: Sandboxes) -> None:
    """no_new_privs (and nosuid mounts): a set-uid-root program runs as the sandbox's uid."""
    program = next((p for p in SETUID_PROGRAMS if os.path.exists(p) and os.stat(p).st_mode & stat.S_ISUID
                    and os.stat(p).st_uid == 0), None)
    if program is None:
        pytest.skip("no set-uid-root program here to try")
    sid = new_id(boxes)
    uid = boxes.backend._box(sid).uid
    # the program waits for a password on stdin; meanwhile its effective uid is read from /proc
    uids = value(boxes, sid, f"import subprocess, time\n"
                             f"p = subprocess.Popen([{program!r}], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, "
                             "stderr=subprocess.DEVNULL)\ntime.sleep(0.5)\n"
                             "status = open(f'/proc/{p.pid}/status').read()\np.kill()\np.wait()\n"
                             "[int(u) for u in status.split('Uid:')[1].split()[:4]]")
    assert uids == [uid] * 4
    caps = value(boxes, sid, "status = open('/proc/self/status').read()\n"
                             "{k: v.strip() for k, v in (line.split(':', 1) for line in status.splitlines()) "
                             "if k.startswith('Cap') or k == 'NoNewPrivs'}")
    assert caps == {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16,
                    "CapAmb": "0" * 16, "NoNewPrivs": "1"}


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
    refused = outcomes(boxes, sid, "import ctypes, os, stat\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                   "def c(result):\n    if result:\n        raise OSError(ctypes.get_errno(), "
                                   "os.strerror(ctypes.get_errno()))",
                       "(('mount', lambda: c(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))),"
                       " ('umount', lambda: c(libc.umount2(b'/home/user', 2))),"
                       " ('hostname', lambda: c(libc.sethostname(b'x', 1))), ('chroot', lambda: os.chroot('/tmp')),"
                       " ('mknod', lambda: os.mknod('sda', 0o600 | stat.S_IFBLK, os.makedev(8, 0))),"
                       " ('setuid', lambda: os.setuid(0)))")
    assert refused == dict.fromkeys(["mount", "umount", "hostname", "chroot", "mknod", "setuid"],
                                    "Operation not permitted")


@JAILED
def test_limits_cannot_be_raised(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    raised = outcomes(boxes, sid, "import resource", "((n, lambda n=n: resource.setrlimit(getattr(resource, "
                      "'RLIMIT_' + n), (resource.RLIM_INFINITY,) * 2)) for n in ('NPROC', 'AS', 'FSIZE'))", "str(e)")
    assert raised == dict.fromkeys(["NPROC", "AS", "FSIZE"], "not allowed to raise maximum limit")


@JAILED
def test_system_folders_are_read_only_and_sys_devices_and_host_accounts_are_absent(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    written = outcomes(boxes, sid, "", "((p, lambda p=p: open(p, 'a')) for p in ('/usr/bin/evil', '/etc/evil', "
                                       "'/etc/passwd'))")
    assert all(error in ("Read-only file system", "Permission denied") for error in written.values()), written
    found = value(boxes, sid, "import os, stat\nout = {'sys': os.path.exists('/sys')}\n"
                              "modes = {n: os.lstat('/dev/' + n).st_mode for n in os.listdir('/dev')}\n"
                              "out['devices'] = [n for n, m in modes.items() if stat.S_ISBLK(m) or stat.S_ISCHR(m)]\n"
                              "out['accounts'] = [line.split(':')[0] for line in open('/etc/passwd')]\nout")
    assert found["sys"] is False
    assert set(found["devices"]) <= {"full", "null", "random", "tty", "urandom", "zero", "ptmx"}
    assert found["accounts"] == ["root", "user"]


@JAILED
def test_the_jails_init_cannot_be_signalled_or_looked_into(boxes: Sandboxes) -> None:
    """Pid 1 of the jail is bwrap, as root: killing it, or reading its environment, root or program, is refused."""
    sid = new_id(boxes)
    refused = outcomes(boxes, sid, "import os, signal", "(('kill', lambda: os.kill(1, signal.SIGKILL)), "
                       "('environ', lambda: open('/proc/1/environ').read()), "
                       "('root', lambda: os.listdir('/proc/1/root')), ('exe', lambda: os.readlink('/proc/1/exe')))",
                       "type(e).__name__")
    assert refused == dict.fromkeys(["kill", "environ", "root", "exe"], "PermissionError")
    assert value(boxes, sid, "1 + 1") == 2


@JAILED
@pytest.mark.parametrize("kill", ["os.kill(-1, signal.SIGKILL)", "os.killpg(0, signal.SIGKILL)",
                                  "os.kill(os.getppid(), signal.SIGKILL)"], ids=["all", "group", "worker"])
def test_a_program_that_kills_its_jail_is_told_apart_from_a_jail_that_fails(tmp_path: Path, kill: str) -> None:
    """A program run for a judge can end its jail's worker with everything it can signal, its process group
    or its parent: the worker reports nothing. A known-good program, run in a fresh jail, then shows the
    machine works, so the run is the program's failure; where the machine breaks meanwhile (bwrap fails for
    the known-good program), it is the machine's, an error."""
    backend = LocalBackend(make_boxes(tmp_path).config)
    try:
        sid = backend.create(60)
        run = backend.run_program(sid, [sys.executable, "-I", "-c", f"import os, signal\n{kill}"])
        assert (run.killed_sandbox, run.started, run.reported, run.exit_code) == (
            True, True, False, -signal.SIGKILL), run
        assert backend.run_program(sid, [sys.executable, "-I", "-c", "print(1)"]).stdout == b"1\n"
        folder = backend._box(sid).folder
        waiting = f"import os, signal, time\nopen('ready', 'w').close()\nwhile not os.path.exists('go'):\n" \
                  f"    time.sleep(0.01)\n{kill}"

        def break_bwrap_while_it_runs() -> None:
            wait_for(lambda: (folder / "ready").exists(), 30)
            isolation = backend.isolation
            backend._isolation = replace(isolation, jail=replace(isolation.jail, bwrap="/bin/false"))
            backend.write_file(sid, "/home/user/go", b"")

        breaker = threading.Thread(target=break_bwrap_while_it_runs)
        breaker.start()
        with pytest.raises(SandboxError, match=r"the sandbox ended while the program ran \(killed by SIGKILL.*a "
                                               r"known-good program failed in a fresh sandbox too \(exit code 1"):
            backend.run_program(sid, [sys.executable, "-I", "-c", waiting])
        breaker.join()
        with pytest.raises(SandboxError, match=r"the sandbox's jail did not run the program \(exit code 1"):
            backend.run_program(sid, [sys.executable, "-I", "-c", "print(1)"])  # never started: never a reward
    finally:
        backend.close()
    assert os.listdir(tmp_path / "sandboxes") == []
