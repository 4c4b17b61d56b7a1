"""Programs run in a sandbox for judges that run code against tests and read its exit and output
themselves, not the model's text: `ProgramRun`, how a run ended (what both backends return), and the
running of a program in a local sandbox's jail, the model's shell commands included (`execute`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanbeige.tools.sandbox.box import LocalSandbox, command_line, sandbox_env
from nanbeige.tools.sandbox.probe import Isolation
from nanbeige.tools.sandbox.sandbox_config import SandboxConfig
from nanbeige.tools.sandbox.system import collect


@dataclass
class ProgramRun:
    """How one program run in a sandbox ended (`LocalBackend.run_program`)."""

    exit_code: int
    """Its exit status; minus the signal's number when a signal ended it (a kill at the time-out too)."""
    stdout: bytes
    """What it wrote, up to 4 x `max_output_chars` bytes of each stream."""
    stderr: bytes
    seconds: float
    """Wall-clock time from the start of its jail to its end."""
    timed_out: bool
    """It ran past its wall-clock limit and was killed with everything it started."""
    budget_spent: str = ""
    """Why the sandbox's processes were stopped, when a budget of the whole sandbox (memory, disk) did it."""
    reported: bool = True
    """The sandbox's worker reported how the program ended (it did not, when it was killed itself)."""
    started: bool = True
    """The worker, in its jail, got as far as starting the program (a jail that fails never does)."""
    killed_sandbox: bool = False
    """The worker was killed without a word, and then a known-good program ran in a fresh sandbox: the
    program killed its own sandbox (its jail, its worker, its process group, or all it could signal)."""


def execute(
    box: LocalSandbox,
    args: list[str],
    stdin: bytes | None,
    limits: SandboxConfig,
    isolation: Isolation,
    reap: Callable[[], None],
) -> ProgramRun:
    """Runs args in the sandbox (its processes under `limits`, the sandbox's settings or tighter ones for this
    run: rlimits and wall-clock timeout) and collects its output and exit: the exit status the worker reports,
    or how the jail ended. `reap` waits for the orphans a jail leaves to the server."""
    status_read, status_write = os.pipe()
    # the input from an unnamed file outside the sandbox: nothing of it is left where code could look
    with box.lock, open(status_read, "rb") as status, tempfile.TemporaryFile() as written:
        written.write(stdin or b"")
        written.flush()
        # the program reads it on a descriptor of its own, read-only: it cannot grow the file
        given = open(f"/proc/self/fd/{written.fileno()}", "rb")
        argv, fds = command_line(box, limits, isolation, ["exec", str(status_write), *args], python=False)
        box.oom_kills = box.cgroup.oom_kills() if box.cgroup else 0  # what this call's kills add to
        try:
            box.wait_for_kills()
            started = time.monotonic()
            proc = spawn(box, argv, given if stdin is not None else subprocess.DEVNULL, (status_write, *fds), limits)
        finally:
            given.close()
            for fd in (status_write, *fds):
                os.close(fd)
        box.sessions.add(proc.pid)
        try:
            out, err, finished = collect(
                proc,
                started + limits.timeout_s,
                4 * limits.max_output_chars,
                cleanup=box.kill_strays,
            )
        finally:
            box.sessions.discard(proc.pid)
        seconds = time.monotonic() - started
        if box.jailed:
            reap()
        said = status.read().decode()
        how, _, number = said.removeprefix("run\n").partition(" ")  # empty when the worker itself was killed
    code = int(number) if how == "exit" else -int(number) if how == "signal" else box.status(proc.returncode)
    # also when a process other than the first one was killed
    return ProgramRun(
        exit_code=code,
        stdout=out,
        stderr=err,
        seconds=seconds,
        timed_out=not finished,
        budget_spent=box.budget_spent(),
        reported=bool(how),
        started=said.startswith("run\n"),
    )


def spawn(box: LocalSandbox, argv: list[str], stdin: Any, fds: tuple[int, ...], limits: SandboxConfig) -> Any:
    """Starts argv in the sandbox's home, in a session of its own, with the sandbox's environment, its output
    piped back and `fds` passed on."""
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=box.folder,
        env=sandbox_env(box, limits),
        start_new_session=True,
        pass_fds=fds,
    )
