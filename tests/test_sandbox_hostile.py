"""The local sandbox against hostile code: endless loops, fork and memory bombs, signals, huge output and
writes, the network, and children left behind, each held to its limits with the worker fresh afterwards."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sandbox import make_config, new_id, sandboxes  # noqa: F401 (sandboxes: the fixture)

from nanbeige.tools.sandbox import SandboxError, Sandboxes
from nanbeige.tools.sandbox.answers import TRUNCATED
from nanbeige.tools.sandbox.system import processes


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    """Tight limits, for hostile code."""
    config = make_config(
        tmp_path_factory.mktemp("strict"),
        timeout_s=2.0,
        memory_mb=512,
        file_size_mb=1,
        max_processes=16,
        max_output_chars=5_000,
    )
    boxes = Sandboxes(config)
    yield boxes
    boxes.close()


def test_an_infinite_loop_times_out_and_the_worker_restarts_fresh(strict: Sandboxes) -> None:
    sid = new_id(strict)
    strict.run_python("kept = 1\nopen('kept.txt', 'w').write('x')", sid)
    started = time.monotonic()
    with pytest.raises(SandboxError, match="timed out after 2 s.*restarted.*lost"):
        strict.run_python("import subprocess\nsubprocess.Popen(['sleep', '60'])\nwhile True: pass", sid)
    # back at the 2 s timeout (and a stop of the worker, slower on a busy machine), not when the `sleep 60` ends
    assert time.monotonic() - started < 30
    assert strict.backend.leftover_processes(sid) == []
    assert "name 'kept' is not defined" in strict.run_python("kept", sid)
    assert "stdout='kept.txt\\n'" in strict.run_command("ls", sid)


def test_fork_bombs_are_bounded_and_killed(strict: Sandboxes) -> None:
    isolation = strict.backend.isolation
    if not isolation.process_limit:
        pytest.skip("root without a uid of its own: RLIMIT_NPROC does not apply")
    # without a uid of its own the limit counts the user's other tasks too, so it is set that much higher
    budget = 16 + (0 if isolation.own_uid else sum(p.threads for p in processes() if p.uid == os.getuid()))
    sid = new_id(strict)
    counted = strict.run_python(
        "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, type(e).__name__)",
        sid,
    )
    forked = int(re.search(r"stdout: \['(\d+) BlockingIOError", counted)[1])  # type: ignore[index]
    assert 0 < forked < budget
    assert strict.backend.leftover_processes(sid) == []
    # the bomb hits the limit; the shell's own last command may too, while the bomb's processes still hold it
    # (on a loaded machine), and then the command fails: either way the limit is what the model reads
    try:
        said = strict.run_command("bomb() { bomb | bomb & }; bomb; sleep 0.5", sid)
    except SandboxError as failed:
        said = str(failed)
    assert "Cannot fork" in said
    with pytest.raises(SandboxError, match="timed out"):
        strict.run_python("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", sid)
    assert strict.backend.leftover_processes(sid) == []
    assert "stdout='ok\\n'" in strict.run_command("sh -c 'echo ok'", sid)  # forking works again


def test_memory_bombs_raise_memory_error(tmp_path: Path) -> None:
    # strict's memory limit with a timeout that is not the limit under test: filling 512 MB a page at a time
    # took over 2 s on a busy two-core machine, and the cell then timed out instead of running out of memory
    boxes = Sandboxes(make_config(tmp_path, timeout_s=60.0, memory_mb=512, max_processes=16))
    try:
        sid = new_id(boxes)
        assert "name='MemoryError'" in boxes.run_python("x = bytearray(8 * 1024**3)", sid)
        assert "name='MemoryError'" in boxes.run_python("a = []\nwhile True: a.append(bytearray(10**7))", sid)
        assert "Result(3)" in boxes.run_python("del a\n1 + 2", sid)
    finally:
        boxes.close()


def test_a_cpu_signal_the_cell_did_not_earn_is_ignored(sandboxes: Sandboxes) -> None:
    # The kernel counts CPU time by ticks and a signal can reach Python after the cell that earned it;
    # neither a stray SIGXCPU between calls nor one early in a cell may end a cell or the worker.
    sid = new_id(sandboxes)
    sandboxes.run_python("kept = 5", sid)
    worker = sandboxes.backend._box(sid).channel.pid
    os.kill(worker, signal.SIGXCPU)
    time.sleep(0.2)
    assert "Result(5)" in sandboxes.run_python("kept", sid)
    threading.Timer(0.3, os.kill, (worker, signal.SIGXCPU)).start()
    assert "Result(5)" in sandboxes.run_python("import time\ntime.sleep(1)\nkept", sid)


def test_cpu_time_is_limited_per_call(tmp_path: Path) -> None:
    boxes = Sandboxes(make_config(tmp_path, cpu_seconds=1, timeout_s=5.0))
    try:
        sid = new_id(boxes)
        boxes.run_python("kept = 5", sid)
        assert (
            "Error: ExecutionError(name='TimeoutError', value='CPU time limit for this call exceeded'"
            in boxes.run_python("while True: pass", sid)
        )
        assert "Result(5)" in boxes.run_python("kept", sid)  # a CPU limit, unlike a timeout, keeps the state
        with pytest.raises(SandboxError, match=re.escape("code -1 (signal: SIGXCPU)")):
            boxes.run_command("while :; do :; done", sid)
    finally:
        boxes.close()


def test_huge_output_is_capped(strict: Sandboxes) -> None:
    sid = new_id(strict)
    for text in (
        strict.run_python("print('x' * 1_000_000)", sid),
        strict.run_python("for i in range(200_000): print(i)", sid),
        strict.run_command("yes | head -c 50000000", sid),
    ):
        assert len(text) == 5_000 + len(TRUNCATED) and text.endswith(TRUNCATED)
    with pytest.raises(SandboxError, match="Command timed out after 2 s.*Output so far"):
        strict.run_command("yes", sid)
    assert "Result(1)" in strict.run_python("1", sid)


def test_writes_are_held_to_the_file_size_limit_and_the_sandbox_folder(strict: Sandboxes) -> None:
    sid = new_id(strict)
    assert "File too large" in strict.run_python("open('big', 'wb').write(b'0' * 2_000_000)", sid)
    with pytest.raises(SandboxError, match="File size limit exceeded"):
        strict.run_command("head -c 2000000 /dev/zero > big2", sid)
    if not strict.backend.isolation.own_uid:
        pytest.skip("no uid of its own: the OS lets the code write wherever the server's user can")
    # the sandbox root above its folder and the repository both belong to root (and in a jail the
    # repository is not there at all)
    for target in ("../escape.txt", "/home/user/../escape.txt", str(Path(__file__).with_name("escape.txt"))):
        assert re.search("PermissionError|FileNotFoundError", strict.run_python(f"open({target!r}, 'w')", sid)), target
    assert not Path(__file__).with_name("escape.txt").exists()
    assert "ValueError" in strict.run_python(
        "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)", sid
    )


def test_network_is_off_exactly_when_the_probe_says_so(strict: Sandboxes) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        sid = new_id(strict)
        text = strict.run_python(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n'connected'", sid
        )
    assert ("Result('connected')" not in text) == strict.backend.isolation.network_off
    if strict.backend.isolation.network_off:  # a jail has a loopback of its own, where nothing listens
        assert re.search("Network is unreachable|Connection refused", text)


def test_code_cannot_signal_the_server(strict: Sandboxes) -> None:
    isolation = strict.backend.isolation
    if not (isolation.own_uid or isolation.own_pids):
        pytest.skip("neither a uid nor a pid namespace of its own: the code could kill this test")
    sid = new_id(strict)
    text = strict.run_python(f"import os\nos.kill({os.getpid()}, 9)", sid)
    assert "name='PermissionError'" in text or "name='ProcessLookupError'" in text
    strict.run_python("import os, signal\nos.kill(-1, signal.SIGKILL)", sid)  # everything it may signal
    assert "Result(1)" in strict.run_python("1", sid)


def test_children_do_not_outlive_the_call(tmp_path: Path) -> None:
    # A timeout far past what a call takes on a busy machine: a call that waited for the children (whose
    # `sleep 600` holds the output pipes open) would run until it, and still answer.
    boxes = Sandboxes(make_config(tmp_path, timeout_s=120.0))
    try:
        # Processes that start a session of their own are only found when the sandbox has its own uid.
        new_session = boxes.backend.isolation.own_uid
        sid = new_id(boxes)
        text = boxes.run_python(
            f"import subprocess\np = subprocess.Popen(['sleep', '600'], start_new_session={new_session})\np.pid", sid
        )
        assert "Result(" in text and boxes.backend.leftover_processes(sid) == []
        started = time.monotonic()
        assert "stdout='started\\n'" in boxes.run_command(f"{'setsid ' * new_session}sleep 600 & echo started", sid)
        assert time.monotonic() - started < 60  # answered when the shell exited, not at the 120 s timeout
        assert boxes.backend.leftover_processes(sid) == []
    finally:
        boxes.close()
