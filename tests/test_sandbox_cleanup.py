"""What a deleted sandbox or a server killed outright leaves on the host, run for real under the jail:
nothing running at once, and the rest (places, mounts, cgroups, uid locks) swept by the next server."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jailed_sandboxes import JAILED, boxes, make_boxes, new_id, value  # noqa: F401 (boxes: the fixture)
from processes import alive, command_line, tree, wait_for
from sandbox_leftovers import Leftovers, leftovers

from nanbeige.tools.sandbox import Sandboxes
from nanbeige.tools.sandbox.budget import sweep
from nanbeige.tools.sandbox.local import LocalBackend
from nanbeige.tools.sandbox.system import UID_LOCKS, processes


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
        return found + [
            f"process {p.pid} ({command_line(p.pid)})"
            for p in processes()
            if p.uid == self.uid and p.state not in b"ZX"
        ]


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
    assert (
        value(boxes, b, f"import os\n[f for f in os.listdir('/tmp') + os.listdir('/dev/shm') if '{marker}' in f]") == []
    )
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
    traces = Traces.of(boxes.backend, a)
    # a process that starts after the call's end-of-call cleanup, in a session of its own
    boxes.run_python(
        "import subprocess, threading\nthreading.Timer(0.3, lambda: subprocess.Popen("
        "['sleep', '300'], start_new_session=True)).start()",
        a,
    )
    assert wait_for(lambda: any(line.startswith("process") for line in traces.left()), 60)  # only against a hang
    assert {line.split()[0] for line in traces.left()} == {"place", "mount", "cgroup", "uid", "process"}
    boxes.backend.destroy(a)
    assert traces.left() == []
    assert value(boxes, b, "1 + 1") == 2  # the other sandbox is untouched


@JAILED
def test_a_deleted_sandboxs_loop_device_is_free_when_the_deletion_returns(boxes: Sandboxes, tmp_path: Path) -> None:
    """Something outside the sandbox holding its file system a moment longer (here, a mount namespace that
    binds it elsewhere for half a second): the kernel lets go of the loop device only when that hold goes,
    and the deletion waits for it rather than return with the device still attached to a deleted image."""
    sid = new_id(boxes)
    files = boxes.backend._box(sid).place / "files"
    assert leftovers(files.parent).loops  # it has a loop device to leave
    (tmp_path / "held").mkdir()
    hold = 'mount --bind "$0" "$1" && echo held && sleep 0.5'
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", hold, str(files), str(tmp_path / "held")],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        boxes.backend.destroy(sid)
        assert leftovers(files.parent) == Leftovers([], [], [], [])
    finally:
        holder.kill()
        holder.wait()


@JAILED
def test_links_and_locked_folders_left_by_code_do_not_harm_the_host_at_deletion(
    boxes: Sandboxes, tmp_path: Path
) -> None:
    """Symbolic links to host paths are not followed when the sandbox is removed, and folders the
    code locked (mode 000) are removed all the same."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    sid = new_id(boxes)
    traces = Traces.of(boxes.backend, sid)
    boxes.run_python(
        f"import os\nos.symlink({str(victim)!r}, 'to-host')\nos.symlink({str(victim)!r}, '/tmp/to-host')\n"
        "os.makedirs('locked/deeper')\nopen('locked/deeper/f', 'w').write('x')\n"
        "os.chmod('locked/deeper', 0)\nos.chmod('locked', 0)",
        sid,
    )
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
BLINDED = (
    "import os, subprocess, time\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    "r, w = os.pipe()\nfor fd in range(3, 64):\n    if fd not in (r, w):\n        try:\n"
    "            os.dup2(r, fd)\n        except OSError:\n            pass\ntime.sleep(50)"
)


def start_server(root: Path) -> subprocess.Popen:
    """A `python` MCP server of local sandboxes under root, spoken to over its stdin and stdout."""
    env = {
        "NANBEIGE_SANDBOX_BACKEND": "local",
        "NANBEIGE_SANDBOX_DIR": str(root),
        "NANBEIGE_SANDBOX_MEMORY_MB": "512",
        "NANBEIGE_SANDBOX_DISK_MB": "64",
        "NANBEIGE_SANDBOX_TIMEOUT": "60",
        "PATH": os.environ["PATH"],
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nanbeige.servers.python"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def create_two_sandboxes(proc: subprocess.Popen, root: Path) -> tuple[list[str], list[Traces]]:
    """The server initialized, and two sandboxes made through it: their ids and where they leave marks."""
    rpc(
        proc,
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
    )
    rpc(proc, {"method": "notifications/initialized"}, reply=False)
    ids = []
    for n in (2, 3):
        answer = rpc(proc, {"id": n, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}})
        ids.append(re.search(r"sandbox_id: ([0-9a-f]+)", answer["result"]["content"][0]["text"])[1])  # type: ignore
    owners = [json.loads((root / sid / "owner.json").read_text()) for sid in ids]
    return ids, [Traces(root / sid, tuple(Path(f) for f in o["cgroup"]), o["uid"]) for sid, o in zip(ids, owners)]


def assert_the_next_server_sweeps(tmp_path: Path, root: Path, traces: list[Traces]) -> None:
    after = make_boxes(tmp_path)
    try:
        assert after.config.root == root
        assert after.backend.isolation.jail  # its first use sweeps
        for t in traces:
            assert t.left() == []
        assert os.listdir(root) == []
    finally:
        after.close()


@JAILED
def test_a_server_killed_outright_leaves_no_process_and_the_next_one_sweeps_the_rest(tmp_path: Path) -> None:
    """SIGKILL while a cell and a command run, each having started a process in a session of its own
    (the cell has also blinded the worker's own watch on the server):
    at once nothing of the sandboxes runs; their places, mounts, cgroups and uid locks stay until
    the next server on the same root sweeps them at its start."""
    root = tmp_path / "sandboxes"
    proc = start_server(root)
    started: set[int] = set()
    try:
        ids, traces = create_two_sandboxes(proc, root)
        uids = {t.uid for t in traces}
        # two calls left running: a cell and a command, each with a process in a session of its own
        rpc(
            proc,
            {
                "id": 4,
                "method": "tools/call",
                "params": {"name": "run_python_code", "arguments": {"sandbox_id": ids[0], "code_block": BLINDED}},
            },
            reply=False,
        )
        rpc(
            proc,
            {
                "id": 5,
                "method": "tools/call",
                "params": {
                    "name": "run_command",
                    "arguments": {"sandbox_id": ids[1], "command": "setsid sleep 301 & sleep 50"},
                },
            },
            reply=False,
        )

        def sleepers() -> set[str]:
            return {command_line(p.pid) for p in processes() if p.uid in uids and p.state not in b"ZX"}

        assert wait_for(lambda: {"sleep 300", "sleep 301"} <= sleepers(), 30), sleepers()
        started = tree(proc.pid) - {proc.pid}
        proc.kill()
        proc.wait()
        # gone long before the shortest of them (50 s) would end by itself, however busy the machine
        assert wait_for(lambda: not sleepers() and not alive(started), 20), (
            sleepers(),
            [command_line(pid) for pid in alive(started)],
        )
        for t in traces:  # the rest stays for the next server
            assert {line.split()[0] for line in t.left()} == {"place", "mount", "cgroup", "uid"}, t.left()
        assert_the_next_server_sweeps(tmp_path, root, traces)
    finally:  # whatever survived a failure
        proc.kill()
        proc.wait()
        for pid in alive(started):
            os.kill(pid, signal.SIGKILL)
        if root.exists():
            sweep(root)
