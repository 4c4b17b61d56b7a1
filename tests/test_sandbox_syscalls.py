"""The system calls a jailed sandbox may not make: the seccomp filter read instruction by instruction
here (for each machine it has numbers for), then tried for real from inside both kinds of jail,
as a uid of its own (a root server) and in a user namespace (any other server), where ordinary
Python work must go on as before."""

from __future__ import annotations

import ast
import os
import re
import struct
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import JAIL

from nanbeige.tools.sandbox import SandboxConfig, Sandboxes
from nanbeige.tools.sandbox.seccomp import (
    ALLOW,
    BLOCKED_SYSCALLS,
    ENOSYS,
    EPERM,
    ERRNO,
    FILTER,
    KILL_PROCESS,
    NATIVE,
    NEW_NAMESPACES,
    X32_BIT,
    assemble,
)

JAILED = pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and JAIL), reason="needs root and a bwrap that works here"
)
I386 = 0x40000003
CLONE_THREAD_FLAGS = 0x3D0F00  # what pthread_create asks of clone: shared memory, files, signals, thread group


def verdict(arch: int, number: int, arg0: int = 0, program: bytes = FILTER) -> int:
    """What the filter answers a system call, found by running its classic BPF as the kernel would."""
    data = struct.pack("<iI8xQ", number, arch, arg0)
    accumulator, pc = 0, 0
    while True:
        code, true, false, k = struct.unpack_from("<HBBI", program, 8 * pc)
        pc += 1
        if code == 0x20:  # ld [k]
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret #k
            return k
        else:
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[code]
            pc += true if taken else false


@pytest.mark.parametrize("machine", sorted(NATIVE))
def test_every_blocked_call_fails_with_eperm_and_everyday_calls_pass(machine: str) -> None:
    arch, unshare, clone, clone3 = NATIVE[machine]
    column = list(NATIVE).index(machine)  # the order of BLOCKED_SYSCALLS' numbers
    blocked = {name: numbers[column] for name, numbers in BLOCKED_SYSCALLS.items() if numbers[column] is not None}
    assert {"io_uring_setup", "keyctl", "bpf", "userfaultfd", "perf_event_open", "ptrace"} <= set(blocked)
    assert {name: verdict(arch, number) for name, number in blocked.items()} == dict.fromkeys(blocked, ERRNO | EPERM)
    everyday = {"x86_64": (0, 1, 39, 59, 257), "aarch64": (63, 64, 172, 221, 56)}[machine]  # read write getpid...
    assert [verdict(arch, number) for number in everyday] == [ALLOW] * 5


@pytest.mark.parametrize("machine", sorted(NATIVE))
def test_new_namespaces_are_refused_and_threads_and_forks_are_not(machine: str) -> None:
    arch, unshare, clone, clone3 = NATIVE[machine]
    assert verdict(arch, unshare, 0x10000000) == verdict(arch, clone, 0x40000000 | 17) == ERRNO | EPERM
    assert all(verdict(arch, unshare, 1 << bit) == ERRNO | EPERM for bit in range(32) if NEW_NAMESPACES >> bit & 1)
    assert verdict(arch, clone, CLONE_THREAD_FLAGS) == verdict(arch, clone, 17) == ALLOW  # threads, fork
    assert verdict(arch, clone3) == ERRNO | ENOSYS  # its flags are out of a filter's sight: the C library falls back


def test_calls_through_another_abi_kill_the_process() -> None:
    """The blocklist holds native numbers only: i386's io_uring_setup is 425 too, and its keyctl 288."""
    assert verdict(I386, 425) == verdict(I386, 288) == verdict(0x40000028, 0) == KILL_PROCESS
    assert verdict(NATIVE["x86_64"][0], X32_BIT | 425) == ERRNO | ENOSYS  # x32, as on kernels built without it


def test_a_filter_whose_jumps_overflow_a_byte_is_refused() -> None:
    far = [("far",), *[(0x06, 0, 0, ALLOW)] * 300]
    with pytest.raises(ValueError, match="does not fit in a byte"):
        assemble([(0x15, "far", 0, 1), *far[1:], far[0], (0x06, 0, 0, ALLOW)])


# --- from inside the jail ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=[True, False], ids=["own-uid", "user-namespace"])
def boxes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    root = tmp_path_factory.mktemp("syscalls")
    sandboxes = Sandboxes(
        SandboxConfig(root=root / "sandboxes", upload_dirs=[root], timeout_s=15.0, drop_privileges=request.param)
    )
    jail = sandboxes.backend.isolation.jail
    assert jail is not None and jail.as_root is request.param
    yield sandboxes
    sandboxes.close()


def new_id(boxes: Sandboxes) -> str:
    return re.search(r"sandbox_id: ([0-9a-f]+)", boxes.create())[1]  # type: ignore[index]


def value(boxes: Sandboxes, sid: str, code: str) -> Any:
    """The value of the cell's last expression (a Python literal), which must run without error."""
    text = boxes.run_python(code, sid)
    found = re.fullmatch(r"Execution\(Results: \[Result\((.*)\)\], Logs: .*, Error: None\)", text, re.S)
    assert found, text
    return ast.literal_eval(found[1])


# Each call well formed, so that without the filter the kernel would do it: io_uring_setup(4 entries),
# the session keyring's id, a key added to it, a user-mode-only userfaultfd, a task-clock counter of
# this process's user time, PTRACE_TRACEME. bpf needs capabilities anyway: its EPERM is the filter's
# or the kernel's.
CALLS = r"""
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
counter = ctypes.create_string_buffer(struct.pack('<IIQQQQQ', 1, 64, 1, 0, 0, 0, 0x60).ljust(64, b'\0'))
calls = {'io_uring_setup': (425, 4, params), 'keyctl': (250, 0, -3, 0), 'add_key': (248, b'user', b'k', b'v', 1, -3),
         'userfaultfd': (323, 1), 'perf_event_open': (298, counter, 0, -1, -1, 0), 'ptrace': (101, 0, 0, 0, 0),
         'bpf': (321, 0, params, 72)}
out = {}
for name, (number, *args) in calls.items():
    out[name] = 'done' if libc.syscall(number, *args) >= 0 else os.strerror(ctypes.get_errno())
out
"""


@JAILED
def test_io_uring_keyrings_bpf_userfaultfd_perf_events_and_ptrace_fail_with_eperm(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    refused = value(boxes, sid, CALLS)
    assert refused == dict.fromkeys(
        ["io_uring_setup", "keyctl", "add_key", "userfaultfd", "perf_event_open", "ptrace", "bpf"],
        "Operation not permitted",
    )


@JAILED
def test_threads_processes_sockets_files_and_event_loops_still_work(boxes: Sandboxes) -> None:
    sid = new_id(boxes)
    work = value(
        boxes,
        sid,
        r"""
import asyncio, concurrent.futures, errno, multiprocessing, os, socket, subprocess, tempfile, threading
out = {}
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    out['threads'] = sum(pool.map(lambda n: n * n, range(10)))
out['subprocess'] = subprocess.run(['sh', '-c', 'echo $((6 * 7))'], capture_output=True, text=True).stdout.strip()
with multiprocessing.get_context('fork').Pool(2) as pool:
    out['fork pool'] = pool.map(abs, [-1, -2])
with multiprocessing.get_context('spawn').Pool(1) as pool:
    out['spawn pool'] = pool.map(abs, [-3])
a, b = socket.socketpair()
a.sendall(b'ping')
out['socketpair'] = b.recv(4).decode()
try:
    socket.create_connection(('127.0.0.1', 9), timeout=2)
except OSError as e:
    out['connect to nothing'] = errno.errorcode[e.errno]
with tempfile.NamedTemporaryFile('w+', dir='/tmp') as f:
    f.write('kept')
    f.flush()
    out['file'] = open(f.name).read()
async def main():
    await asyncio.sleep(0.01)
    return 'ran'
out['asyncio'] = asyncio.run(main())
out""",
    )
    # a network of its own in the jail: a loopback interface with nothing listening
    assert work == {
        "threads": 285,
        "subprocess": "42",
        "fork pool": [1, 2],
        "spawn pool": [3],
        "socketpair": "ping",
        "connect to nothing": "ECONNREFUSED",
        "file": "kept",
        "asyncio": "ran",
    }
    assert boxes.run_command("ls /home/user && echo done", sid).count("done") == 1
