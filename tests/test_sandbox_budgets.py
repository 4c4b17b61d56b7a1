"""The local sandbox's budgets against hostile code, run for real: memory and disk hold for all of a
sandbox's processes together, and the sandbox works on once they were hit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jailed_sandboxes import JAILED, MB, boxes, new_id, run_hostile, value  # noqa: F401 (boxes: the fixture)
from processes import wait_for

from nanbeige.tools.sandbox import SandboxError, Sandboxes

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
    hog = (
        "import os, time\nopen(f'started.{os.getpid()}', 'w').close()\n"
        "while sum(name.startswith('started.') for name in os.listdir('.')) < 4:\n    time.sleep(0.01)\n"
        "b = b'1' * (300 * 1024 * 1024)\ntime.sleep(2)\nprint('survived')\n"
    )
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
    boxes.run_python(
        "import subprocess, threading\ndef spawn():\n"
        "    subprocess.Popen(['python3', '-c', 'import resource; "
        "resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\\nwhile True: pass'], start_new_session=True)\n"
        "    open('spawned', 'w').close()\n"
        "threading.Timer(0.5, spawn).start()",
        sid,
    )
    # The thread leaves a file once the process exists (half a second after the call); the process spins
    # forever unless it is stopped: the watch, which reads every second, stops it. The file, not a sighting of
    # the process, shows it was started, since under load the watch may stop it before a look at the process
    # list (or the process itself) gets to run. The waits are only against a hang.
    spawned = boxes.backend._box(sid).folder / "spawned"
    assert wait_for(spawned.exists, 60)
    assert wait_for(lambda: boxes.backend.leftover_processes(sid) == [], 60)


@JAILED
def test_a_worker_killed_for_the_sandboxs_memory_says_so_and_the_sandbox_goes_on(boxes: Sandboxes) -> None:
    """A cell holds 350 MB and starts a child that takes 250 MB more: the kernel kills the biggest
    process, the worker itself; the call says why, and the next call gets a fresh worker."""
    sid = new_id(boxes)
    boxes.run_python("kept = 1\nopen('kept.txt', 'w').write('x')", sid)
    with pytest.raises(
        SandboxError,
        match=r"died \(killed by SIGKILL\): the sandbox ran out of memory \(its "
        r"processes together may use 512 MB\).*restarted",
    ):
        boxes.run_python(
            "hog = b'1' * (350 * 1024 * 1024)\nimport subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', \"b = b'1' * (250 * 1024 * 1024)\"])",
            sid,
        )
    assert "name 'kept' is not defined" in boxes.run_python("kept", sid)
    assert value(boxes, sid, "open('kept.txt').read()") == "x"
    assert boxes.backend.leftover_processes(sid) == []


@JAILED
def test_threads_grabbing_memory_together_are_stopped_and_the_sandbox_stays_usable(boxes: Sandboxes) -> None:
    """Four threads holding 200 MB each: the address-space limit answers MemoryError (or, were the
    kernel first, the worker is killed); either way 800 MB are never held, and the sandbox goes on."""
    sid = new_id(boxes)
    code = (
        "import threading\nheld, refused = [], []\n"
        "def grab():\n    try:\n        held.append(b'1' * (200 * 1024 * 1024))\n"
        "    except MemoryError:\n        refused.append('MemoryError')\n"
        "threads = []\nfor _ in range(4):\n    t = threading.Thread(target=grab)\n"
        "    try:\n        t.start()\n        threads.append(t)\n"
        "    except RuntimeError:  # no address space left for its stack\n        refused.append('no thread')\n"
        "for t in threads: t.join()\n(len(held), len(refused))"
    )
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
    assert "stdout='written\\n'" in boxes.run_command("head -c 10000000 /dev/zero > /tmp/again && echo written", sid)
    assert host_bytes(place) < 70 * MB


def host_bytes(folder: Path) -> int:
    """Host disk taken under folder, not counting file systems mounted below it (they are in their image)."""
    total = 0
    for path, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(path, d))]
        total += sum(os.lstat(os.path.join(path, name)).st_blocks * 512 for name in dirs + files)
    return total
