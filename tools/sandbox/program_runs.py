"""Programs run in a sandbox for judges that run code against tests and read its exit and output
themselves, not the model's text: `ProgramRun`, how a run ended (what both backends return), and the
local backend's running of a program in its jail, the model's shell commands included (`ProgramRunner`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace

from nanbeige.tools.sandbox.box import LocalSandbox, command_line, sandbox_env
from nanbeige.tools.sandbox.sandbox_config import SandboxConfig, SandboxError
from nanbeige.tools.sandbox.system import collect, exit_text


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


class ProgramRunner:
    """The part of `LocalBackend` (local.py) that runs programs in its sandboxes; it uses the backend's
    settings, sandboxes and cleanup (`config`, `isolation`, `create`, `destroy`, `_box`, `_reap`,
    `_kill_strays`, `_budget_spent`)."""

    def run_program(
        self,
        sandbox_id: str,
        args: list[str],
        stdin: bytes = b"",
        timeout_s: float | None = None,
        cpu_seconds: int | None = None,
        memory_mb: int | None = None,
    ) -> ProgramRun:
        """Runs a program (args, in the sandbox's home) with `stdin` as its input, under the sandbox's limits
        or tighter ones for this run, and returns how it ended: for judges that run code against tests,
        who read its exit and output themselves rather than the model's text."""
        c = self.config
        limits = replace(
            c,
            timeout_s=timeout_s or c.timeout_s,
            cpu_seconds=cpu_seconds or c.cpu_seconds,
            memory_mb=memory_mb or c.memory_mb,
        )
        box = self._box(sandbox_id)
        run = self._execute(box, args, stdin, limits)
        if run.reported or run.timed_out or run.budget_spent:
            return run
        said = f"{exit_text(run.exit_code)}: {run.stderr.decode(errors='replace').strip()[-300:]}"
        if not run.started:  # the program never ran: the jail failed, and a failure is never a reward
            raise SandboxError(f"the sandbox's jail did not run the program ({said})")
        # Only a kill ends the worker (in a jail, the jail's init) without a word once the program runs:
        # one the program sent (kill(-1), its process group, its parent), or a machine that failed. A
        # known-good program in a fresh sandbox tells them apart: a program must not pass its failure off
        # as a broken machine, which stops a judge.
        if broken := self._known_good_fails():
            raise SandboxError(
                f"the sandbox ended while the program ran ({said}), and a known-good program "
                f"failed in a fresh sandbox too ({broken})"
            )
        return replace(run, killed_sandbox=True)

    def _known_good_fails(self) -> str:
        """How a known-good program failed in a fresh sandbox, under the sandbox's own limits; empty when it
        ran as it should."""
        try:
            sandbox = self.create(int(self.config.idle_timeout_s))
        except (SandboxError, OSError) as exc:
            return f"it could not be made: {exc}"
        try:
            run = self._execute(
                self._box(sandbox), [self.config.python, "-I", "-S", "-c", "print(6 * 7)"], None, self.config
            )
        except (SandboxError, OSError) as exc:
            return f"it could not start: {exc}"
        finally:
            self.destroy(sandbox)
        if run.reported and run.exit_code == 0 and run.stdout == b"42\n":
            return ""
        return f"{exit_text(run.exit_code)}: {run.stderr.decode(errors='replace').strip()[-300:]}"

    def _execute(self, box: LocalSandbox, args: list[str], stdin: bytes | None, limits: SandboxConfig) -> ProgramRun:
        """Runs args in the sandbox (its processes under `limits`' rlimits and wall-clock timeout) and
        collects its output and exit: the exit status the worker reports, or how the jail ended."""
        status_read, status_write = os.pipe()
        # the input from an unnamed file outside the sandbox: nothing of it is left where code could look
        with box.lock, open(status_read, "rb") as status, tempfile.TemporaryFile() as written:
            written.write(stdin or b"")
            written.flush()
            # the program reads it on a descriptor of its own, read-only: it cannot grow the file
            given = open(f"/proc/self/fd/{written.fileno()}", "rb")
            argv, fds = command_line(box, limits, self.isolation, ["exec", str(status_write), *args], python=False)
            box.oom_kills = box.cgroup.oom_kills() if box.cgroup else 0  # what this call's kills add to
            try:
                box.wait_for_kills()
                started = time.monotonic()
                proc = subprocess.Popen(
                    argv,
                    stdin=given if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=box.folder,
                    env=sandbox_env(box, self.config),
                    start_new_session=True,
                    pass_fds=(status_write, *fds),
                )
            finally:
                given.close()
                for fd in (status_write, *fds):
                    os.close(fd)
            box.sessions.add(proc.pid)
            try:
                out, err, finished = collect(
                    proc,
                    started + limits.timeout_s,
                    4 * self.config.max_output_chars,
                    cleanup=lambda: self._kill_strays(box),
                )
            finally:
                box.sessions.discard(proc.pid)
            seconds = time.monotonic() - started
            if box.jailed:
                self._reap()
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
            budget_spent=self._budget_spent(box),
            reported=bool(how),
            started=said.startswith("run\n"),
        )
