"""Hostile code against the local sandbox's worker: processes forked by a cell, replies forged on the
worker's channel, and code that lifts its own CPU limit. Everything runs for real; the assertions
are about containment: later calls get their own answers, and state survives where the worker did."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import JAIL
from processes import command_line, parents

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes
from nanbeige.tools.sandbox.channel import CPU_GRACE_S, cpu_time

STATE_LOST = "variables, imports and definitions from earlier calls are lost"


def make_boxes(root: Path, **settings: object) -> Sandboxes:
    return Sandboxes(
        SandboxConfig(
            **{"root": root / "sandboxes", "upload_dirs": [root], "timeout_s": 10.0, "jail": JAIL, **settings}
        )
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=[True, False], ids=["own-uid", "shared-uid"])
def boxes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    """Both ways a root server runs sandboxes (as a uid of their own, or not); the same elsewhere."""
    sandboxes = make_boxes(tmp_path_factory.mktemp("attacks"), drop_privileges=request.param)
    yield sandboxes
    sandboxes.close()


def new_id(boxes: Sandboxes) -> str:
    # the first line: where there is no jail, a second line says so
    return boxes.create().splitlines()[0].removeprefix("Sandbox created with sandbox_id: ")


class CpuPeak:
    seconds = 0.0
    """The most CPU time (user plus system) any of the watched processes had used when last seen."""


@contextmanager
def cpu_peak(find: Callable[[], set[int]]) -> Iterator[CpuPeak]:
    """Watches, from outside the sandbox and every 10 ms while the block runs, the CPU time of the
    processes `find()` names (asked until it names some): how much CPU code got before it was
    stopped. The limits are CPU time; unlike the seconds a call takes, load on the machine does
    not change it."""
    peak, done = CpuPeak(), threading.Event()

    def sample() -> None:
        pids: set[int] = set()
        while not done.is_set():
            pids = pids or find()
            peak.seconds = max([peak.seconds, *(cpu_time(pid) for pid in pids)])
            done.wait(0.01)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        done.set()
        watcher.join()


def assert_worker_intact(boxes: Sandboxes, sid: str) -> None:
    """Later calls answer for themselves, with the state set before the attack."""
    time.sleep(0.6)  # past the lingering children's late writes
    for n in range(3):
        assert (
            boxes.run_python(f"print('call {n}')\nx", sid)
            == f"Execution(Results: [Result(7)], Logs: Logs(stdout: ['call {n}\\n'], stderr: []), Error: None)"
        )
    assert boxes.backend.leftover_processes(sid) == []


# --- os.fork() in a cell -----------------------------------------------------------------------


def test_a_child_that_returns_from_the_cell_ends_instead_of_answering(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    # the parent answers once the child has ended: the child's answer, had it sent one, would be read first
    text = boxes.run_python("import os\npid = os.fork()\nif pid: os.waitpid(pid, 0)\npid", sid)
    assert re.fullmatch(r"Execution\(Results: \[Result\([1-9]\d*\)\], .*Error: None\)", text), text
    assert_worker_intact(boxes, sid)


def test_what_a_forked_child_prints_during_the_cell_is_part_of_its_output(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    # the parent prints once the child has ended, so the order of the lines is known
    text = boxes.run_python(
        "import os\nchild = os.fork()\nif child == 0:\n    print('from the child')\nelse:\n"
        "    os.waitpid(child, 0)\n    print('from the parent')\n'parent'",
        sid,
    )
    assert text == (
        "Execution(Results: [Result('parent')], "
        "Logs: Logs(stdout: ['from the child\\nfrom the parent\\n'], stderr: []), Error: None)"
    )
    assert_worker_intact(boxes, sid)


def test_a_child_that_calls_sys_exit_ends_with_its_code_and_leaves_the_cell_alone(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    text = boxes.run_python(
        "import os, sys, time\nchild = os.fork()\nif child == 0: sys.exit(3)\n"
        "time.sleep(0.3)\nos.waitstatus_to_exitcode(os.waitpid(child, 0)[1])",
        sid,
    )
    assert text == "Execution(Results: [Result(3)], Logs: Logs(stdout: [], stderr: []), Error: None)"
    text = boxes.run_python(
        "import os, time\nchild = os.fork()\nif child == 0: 1 / 0\ntime.sleep(0.3)\n"
        "os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])",
        sid,
    )
    assert "Results: [Result(1)]" in text and "ZeroDivisionError" in text  # its traceback, on stderr
    assert_worker_intact(boxes, sid)


def test_a_lingering_child_cannot_write_to_the_channel_or_later_cells(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    # a new session escapes the end-of-call cleanup where the sandbox shares the server's uid
    text = boxes.run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.4)\n    print('late')\n"
        '    for fd in range(3, 256):\n        try: os.write(fd, b\'{"id": 1, "results": []}\\n\')\n'
        "        except OSError: pass\n    os._exit(0)\n'parent'",
        sid,
    )
    assert text == "Execution(Results: [Result('parent')], Logs: Logs(stdout: [], stderr: []), Error: None)"
    assert_worker_intact(boxes, sid)


def test_forking_twice_gives_one_answer(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    # each process waits for the children it forked: the first one answers after the three others ended
    text = boxes.run_python(
        "import os\na = os.fork()\nb = os.fork()\nif b: os.waitpid(b, 0)\nif a and b: os.waitpid(a, 0)\n(a > 0, b > 0)",
        sid,
    )
    assert text == "Execution(Results: [Result((True, True))], Logs: Logs(stdout: [], stderr: []), Error: None)"
    assert_worker_intact(boxes, sid)


def test_multiprocessing_with_fork_still_works(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    text = boxes.run_python(
        "import multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as pool:\n"
        "    squares = pool.map(abs, [-1, -2, -3])\nsquares",
        sid,
    )
    assert text == "Execution(Results: [Result([1, 2, 3])], Logs: Logs(stdout: [], stderr: []), Error: None)"
    assert_worker_intact(boxes, sid)


# --- replies forged on the worker's channel ----------------------------------------------------

# The worker's reply pipe is in its argv; the number of the request being served is in its frames.
REPLY_FD = "import os, sys\nreply = int(sys.argv[4])\n"
REQUEST_ID = (
    "f = sys._getframe()\nwhile f.f_code.co_name != 'serve': f = f.f_back\nnumber = f.f_locals['request']['id']\n"
)


@pytest.mark.parametrize(
    ("forgery", "problem"),
    [
        ("b'not json\\n'", "a reply that is not JSON"),
        ("b'{\"id\": 1000000}\\n'", "a reply with id 1000000"),
        ("b'[1, 2]\\n'", "a reply with id None"),
        (REQUEST_ID + 'b\'{"id": "%s"}\\n\' % number.encode()', "a reply to a cell without results"),
    ],
    ids=["not-json", "unknown-id", "not-an-object", "missing-fields"],
)
def test_a_forged_reply_restarts_the_worker_and_says_the_state_is_lost(
    boxes: Sandboxes, forgery: str, problem: str
) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    setup, _, data = forgery.rpartition("\n")
    with pytest.raises(SandboxError, match=re.escape(f"The Python process sent {problem}") + f".*{STATE_LOST}"):
        boxes.run_python(f"{REPLY_FD}{setup}\nos.write(reply, {data})\nimport time\ntime.sleep(0.3)", sid)
    assert "name 'x' is not defined" in boxes.run_python("x", sid)
    assert boxes.run_python("x = 7", sid).endswith("Error: None)")
    assert_worker_intact(boxes, sid)


def test_a_late_reply_to_an_earlier_request_is_dropped(boxes: Sandboxes, caplog: pytest.LogCaptureFixture) -> None:
    sid = new_id(boxes)
    boxes.run_python(f"import sys\nx = 7\n{REQUEST_ID}earlier = number", sid)
    with caplog.at_level(logging.WARNING, logger="nanbeige.tools.sandbox.channel"):
        text = boxes.run_python(
            f'{REPLY_FD}os.write(reply, b\'{{"id": "%s", "results": ["stale"]}}\\n\' % earlier.encode())\n\'mine\'', sid
        )
    assert text == "Execution(Results: [Result('mine')], Logs: Logs(stdout: [], stderr: []), Error: None)"
    assert "dropped a late reply" in caplog.text
    assert_worker_intact(boxes, sid)


def test_a_cell_cannot_write_the_answer_to_a_later_call(boxes: Sandboxes) -> None:
    """Request ids are random: a reply written in advance, with the id the next request would have
    had were they counted, is caught as a forgery instead of becoming the next call's answer."""
    sid = new_id(boxes)
    forged = '{"id": %s, "results": [], "stdout": "All 10 tests passed\\n", "stderr": "", "error": null}'
    boxes.run_python(
        f'{REPLY_FD}{REQUEST_ID}os.write(reply, b\'{{"id": "%s", "results": [], "stdout": "", '
        f'"stderr": "", "error": null}}\\n\' % number.encode())\n'
        f"for guess in ('2', '\"2\"', '3'):\n    os.write(reply, b'{forged}\\n' % guess.encode())",
        sid,
    )
    with pytest.raises(SandboxError) as caught:
        boxes.run_python("raise SystemExit('the tests failed')", sid)
    assert "All 10 tests passed" not in str(caught.value) and "The Python process sent" in str(caught.value)


def test_a_worker_that_exits_is_restarted_with_the_state_lost(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    boxes.run_python("x = 7", sid)
    with pytest.raises(SandboxError, match=f"The Python process died \\(exit code 0\\).*{STATE_LOST}"):
        boxes.run_python("import os\nos._exit(0)", sid)
    assert "name 'x' is not defined" in boxes.run_python("x", sid)


# --- the CPU limit -----------------------------------------------------------------------------

BUDGET_S = 1
"""The CPU seconds a cell or command gets in these tests: each spins to its limit, so a small one."""


@pytest.mark.parametrize(
    "lift",
    [
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))",
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)",
    ],
    ids=["raise-the-limit", "ignore-the-signal"],
)
@pytest.mark.parametrize("drop_privileges", [True, False], ids=["own-uid", "shared-uid"])
def test_code_that_lifts_its_cpu_limit_is_still_stopped_near_the_budget(
    tmp_path: Path, lift: str, drop_privileges: bool
) -> None:
    # a timeout far past what the budget takes on a busy machine: only the CPU watch can stop the loop
    boxes = make_boxes(tmp_path, cpu_seconds=BUDGET_S, timeout_s=120.0, drop_privileges=drop_privileges)
    try:
        sid = new_id(boxes)
        boxes.run_python("x = 7", sid)
        worker = boxes.backend._box(sid).channel.pid  # as this process sees it, also from outside a jail
        before = cpu_time(worker)
        with (
            cpu_peak(lambda: {worker}) as spent,
            pytest.raises(SandboxError, match=f"used more than {BUDGET_S} s of CPU time.*stopped.*{STATE_LOST}"),
        ):
            boxes.run_python(f"{lift}\nwhile True: pass", sid)
        # stopped by the server's watch (not the timeout: the message says so) once the cell had its
        # budget and the grace the worker's own limit gets first; the watch reads every 0.1 s, so not much later
        assert BUDGET_S <= spent.seconds - before < BUDGET_S + CPU_GRACE_S + 1.5
        assert "name 'x' is not defined" in boxes.run_python("x", sid)
        assert boxes.backend.leftover_processes(sid) == []
    finally:
        boxes.close()


def test_a_cell_within_its_limit_keeps_its_state_after_an_earlier_one_used_much_cpu(tmp_path: Path) -> None:
    # the budget is per cell: CPU time spent by earlier cells does not count
    boxes = make_boxes(tmp_path, cpu_seconds=BUDGET_S, timeout_s=30.0)
    try:
        sid = new_id(boxes)
        boxes.run_python("x = 7", sid)
        for _ in range(3):
            assert "Result(True)" in boxes.run_python(
                "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nTrue", sid
            )
        assert "Result(7)" in boxes.run_python("x", sid)
    finally:
        boxes.close()


@pytest.mark.parametrize("drop_privileges", [True, False], ids=["own-uid", "shared-uid"])
def test_hard_limits_hold_for_cells_and_commands(tmp_path: Path, drop_privileges: bool) -> None:
    """Without CAP_SYS_RESOURCE (which the sandbox never has) a hard limit cannot be raised: a command's
    CPU limit is a hard one, and a command that ignores SIGXCPU is killed at it."""
    # a timeout far past what the limits' CPU can take on a busy machine: only the CPU limit can stop the loop
    boxes = make_boxes(tmp_path, cpu_seconds=BUDGET_S, timeout_s=120.0, drop_privileges=drop_privileges)
    try:
        sid = new_id(boxes)
        capabilities = "int(open('/proc/self/status').read().split('CapEff:')[1].split()[0], 16)"
        assert "Result(0)" in boxes.run_python(f"{capabilities} >> 24 & 1", sid)  # CAP_SYS_RESOURCE is bit 24
        assert "not allowed to raise maximum limit" in boxes.run_python(
            "import resource\nhard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))",
            sid,
        )
        with pytest.raises(SandboxError, match="not allowed to raise maximum limit"):
            boxes.run_command("python3 -c 'import resource; resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))'", sid)
        loop = "trap '' XCPU; while :; do :; done"
        shell = f"/bin/sh -c {loop}"  # the jail's processes name the command too, in longer command lines
        with (
            cpu_peak(lambda: {pid for pid in parents() if command_line(pid) == shell}) as spent,
            pytest.raises(SandboxError, match=re.escape("code -1 (signal: SIGKILL)")),
        ):
            boxes.run_command(loop, sid)
        # past the soft limit (the budget: SIGXCPU, ignored) and killed by the kernel at the hard one (a second more)
        assert BUDGET_S < spent.seconds < BUDGET_S + 1.5
    finally:
        boxes.close()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return False


@pytest.mark.parametrize("drop_privileges", [True, False], ids=["own-uid", "shared-uid"])
def test_a_thread_left_spinning_between_calls_is_stopped(tmp_path: Path, drop_privileges: bool) -> None:
    boxes = make_boxes(tmp_path, cpu_seconds=BUDGET_S, timeout_s=30.0, drop_privileges=drop_privileges)
    try:
        sid = new_id(boxes)
        text = boxes.run_python(
            "import os, resource, threading\nx = 7\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "def spin():\n    while True: pass\nthreading.Thread(target=spin, daemon=True).start()\n"
            "int(os.readlink('/proc/self'))",
            sid,
        )
        assert re.search(r"Result\((\d+)\)", text)
        worker = boxes.backend._box(sid).channel.pid  # as this process sees it, also from outside a jail
        idle_from = cpu_time(worker)
        # the watch reads idle workers' CPU time every second and stops one past a call's budget: waited for
        # in CPU time, which load does not stretch (the wall-clock limit only guards against a hang)
        deadline = time.monotonic() + 120
        while running(worker) and cpu_time(worker) - idle_from < 5 * BUDGET_S and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(worker)  # stopped while idle, well before five budgets, not at the next call
        with pytest.raises(
            SandboxError, match=f"Between calls.*more than {BUDGET_S} s of CPU time.*{STATE_LOST}.*did not run"
        ):
            boxes.run_python("x", sid)
        assert "name 'x' is not defined" in boxes.run_python("x", sid)
    finally:
        boxes.close()
