"""The script that starts a judged program inside an E2B sandbox (`E2BBackend.run_program` passes it with
`python3 -c`, so no file of it lies where the program could rewrite it for the next run). Standard library
only: it runs in the sandbox's interpreter.

    python3 -I -B -c SOURCE TIMEOUT_S CPU_SECONDS MEMORY_MB MAX_BYTES PROGRAM ARGS...

It plays the local worker's part: the first line of its stdin is a nonce; the rest is the program's stdin.
It makes itself non-dumpable and sets no_new_privs (inherited: the program cannot gain privileges through
sudo or any setuid program, so it cannot read the judge's side's memory), starts the program in a session of
its own under RLIMIT_CPU and RLIMIT_AS, relays at most MAX_BYTES of its stdout and stderr, kills its
session at TIMEOUT_S by this sandbox's own clock (the network's delays are no part of a program's time),
and then writes one last stderr line, `{"launched": nonce, "exit": N, "seconds": S, "timed_out": B}`
(N: the exit status, minus the signal's number when a signal ended it). The program never holds this
process's stdout or stderr, so it cannot write after that line; a run without it ended with this process.
"""

import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time

PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
GRACE_S = 0.2  # how long output is still read after the program ended (its strays are killed first)


def read_nonce():
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows is the program's
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    return line.decode().strip()


def relay(process, deadline, max_bytes):
    """Copy the program's output to this process's own until both pipes close (or, once the program ended,
    GRACE_S more); True when the deadline came first."""
    pipes = {process.stdout.fileno(): 1, process.stderr.fileno(): 2}
    left = {1: max_bytes, 2: max_bytes}
    ended_at = None
    while pipes:
        now = time.monotonic()
        if now >= deadline:
            return True
        if ended_at is None and process.poll() is not None:
            ended_at = now
            kill_session(process)
        wait = min(deadline, ended_at + GRACE_S if ended_at is not None else deadline) - now
        ready, _, _ = select.select(list(pipes), [], [], max(0.0, min(wait, 0.05)))
        if not ready and ended_at is not None and now >= ended_at + GRACE_S:
            return False
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                del pipes[fd]
                continue
            target = pipes[fd]
            os.write(target, chunk[: left[target]])
            left[target] -= min(len(chunk), left[target])
    return False


def kill_session(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass  # it ended with all it started


def main():
    timeout, cpu, memory_mb, max_bytes = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    nonce = read_nonce()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"the launcher could not drop its privileges (errno {ctypes.get_errno()})")

    def limits():
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))

    started = time.monotonic()
    process = subprocess.Popen(
        sys.argv[5:],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        start_new_session=True,
        preexec_fn=limits,
    )
    timed_out = relay(process, started + timeout, max_bytes)
    kill_session(process)
    code = process.wait()
    seconds = time.monotonic() - started
    report = {"launched": nonce, "exit": code, "seconds": round(seconds, 6), "timed_out": timed_out}
    os.write(2, ("\n" + json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
