"""The local sandbox backend: a folder per sandbox under `SandboxConfig.root`, shown to the model as
`/home/user`, and a persistent Python process per sandbox (`worker.py`) so variables
survive between calls.

Where Bubblewrap works (`jail.py`), every process of a sandbox runs in a jail that shows it
only read-only system folders and the interpreter, its own home and /tmp, and a /dev and /proc of
its own, with no network and no host sockets; as root, under an unprivileged uid of its own with
no capabilities. Its processes together are held to a memory and process budget (a cgroup, or
else a watch that sums their memory), and its files to a disk budget (a file system of its own,
or else a watch that sums them): `budget.py`. Each process also runs with rlimits on CPU
time (a Python cell's also watched from outside, by `channel.py`, which carries the
worker's requests and replies), address space, file size and open files, a wall-clock timeout
after which everything it started is killed, and a minimal environment (no API keys).

Nothing runs unjailed unless the operator turned the jail off (NANBEIGE_SANDBOX_JAIL=0): where the
jail cannot be made (no bwrap, a bwrap that fails for a moment or for good, a probe that cannot
decide), the call is an error to the model, with the fix, and a warning on the server's stderr,
and the next call probes again. With the jail off the server says so and uses what the OS allows
(`probe.probe_isolation`): no network (`unshare --net`) and, as root, the uid of its own, which
leaves the host's world-readable files readable to the code.

Nothing is left behind: a sandbox's processes, cgroup, file system, folders and uid lock go when
it is deleted, times out or its server exits; a server killed outright leaves them to the next
one, which sweeps what no live server holds (each holds a lock on its sandboxes' folders).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from nanbeige.tools.sandbox.answers import command_failed, format_command, format_execution, invalid_id, truncate
from nanbeige.tools.sandbox.box import WORKER, LocalSandbox, kill_all, make_sandbox, remove_sandbox
from nanbeige.tools.sandbox.budget import can_make_disks, cgroup_parents, sweep, sweep_cgroups
from nanbeige.tools.sandbox.channel import ChannelError, check_cell_reply, exchange
from nanbeige.tools.sandbox.files import host_path, read_file, write_file
from nanbeige.tools.sandbox.probe import Isolation, probe_isolation, unjailed_notice
from nanbeige.tools.sandbox.program_runs import ProgramRun, execute
from nanbeige.tools.sandbox.sandbox_config import SandboxConfig, SandboxError
from nanbeige.tools.sandbox.system import become_subreaper, exit_text, processes, reap_orphans, signal_name
from nanbeige.tools.sandbox.watch import Watch
from nanbeige.tools.sandbox.worker_lifecycle import STATE_LOST, Workers

log = logging.getLogger(__name__)

CLOSE_THREADS = 16  # sandboxes taken apart at once when the server closes


# --- the backend -------------------------------------------------------------------------------


class LocalBackend:
    """Sandboxes on this machine: a folder and a persistent Python worker each. Its parts: the workers
    (`Workers`, worker_lifecycle.py), the watch between calls (`Watch`, watch.py) and the running of a program
    (`execute`, program_runs.py)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._boxes: dict[str, LocalSandbox] = {}
        self._lock = threading.Lock()
        self._isolation: Isolation | None = None
        self._cgroups: tuple[int, tuple[Path, ...]] | None = None
        self._disks = False
        self._watch: Watch | None = None
        self.workers = Workers(config, self._reap)

    @property
    def isolation(self) -> Isolation:
        """Found by the first call, while later ones wait, and kept; where it cannot be found now (the
        jail cannot be made), ProbeError (a SandboxError), logged for the operator, and the next call
        tries again."""
        with self._lock:
            if self._isolation is None:
                try:
                    self._isolation = self._probe()
                except SandboxError as exc:
                    log.warning("local sandbox: %s", exc)
                    raise
            return self._isolation

    def _probe(self) -> Isolation:
        """Sweeps what servers that are gone left, then finds what this machine can enforce."""
        self.config.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.config.root, 0o711)  # sandbox uids pass through, but cannot list
        become_subreaper()
        swept = sweep(self.config.root)
        if swept:
            log.info("local sandbox: removed %d sandboxes left by servers that are gone", swept)
        c = self.config
        isolation = probe_isolation(
            python=c.python,
            worker=WORKER,
            root=c.root,
            network=c.network,
            drop_privileges=c.drop_privileges,
            jail=c.jail,
        )
        self._cgroups = cgroup_parents()
        if self._cgroups and (swept := sweep_cgroups(self._cgroups)):
            log.info("local sandbox: removed %d cgroups left by servers that are gone", swept)
        self._disks = can_make_disks()
        for weaker in filter(None, (unjailed_notice(isolation), *self._watched())):
            log.warning("local sandbox: %s", weaker)
        return isolation

    def start(self) -> None:
        """Finds the isolation in the background, so that the server says at start what it lacks."""
        threading.Thread(target=self._probe_at_start, name="sandbox-probe", daemon=True).start()

    def _probe_at_start(self) -> None:
        with suppress(SandboxError):  # logged; the calls say it too
            self.isolation  # noqa: B018 - probes

    @property
    def notice(self) -> str:
        """What the model is told when its sandbox is not jailed (empty when it is): what code in it can do."""
        return unjailed_notice(self._isolation)

    def _watched(self) -> list[str]:
        return [
            *(
                [
                    "no cgroup can be made here: memory is held by a watch over the sandbox's processes, which "
                    "acts within a quarter second"
                ]
                if self._cgroups is None
                else []
            ),
            *(
                [
                    "no file system of its own can be made here (needs root and loop devices): disk use is held "
                    "by a watch over the folder, which acts within a quarter second"
                ]
                if not self._disks
                else []
            ),
        ]

    def create(self, timeout: int) -> str:
        isolation = self.isolation
        box = make_sandbox(
            self.config,
            own_uid=isolation.own_uid,
            jailed=isolation.jail is not None,
            cgroups=self._cgroups,
            disks=self._disks,
        )
        with self._lock:
            self._boxes[box.id] = box
            if self._watch is None or not self._watch.is_alive():
                self._watch = Watch(self.config, self._sandboxes, self.workers, self._cgroups is not None, self._disks)
        return box.id

    def _sandboxes(self) -> list[LocalSandbox]:
        with self._lock:
            return list(self._boxes.values())

    def attach(self, sandbox_id: str, timeout: int) -> None:
        raise SandboxError(invalid_id(sandbox_id))  # local sandboxes end with the server that made them

    def run_python(self, sandbox_id: str, code: str) -> str:
        box = self._box(sandbox_id)
        with box.lock:
            if box.stopped_idle:
                message, box.stopped_idle = box.stopped_idle, ""
                raise SandboxError(message)
            if box.worker is None:
                self.workers.start(box, self.isolation)
            box.oom_kills = box.cgroup.oom_kills() if box.cgroup else 0  # what this call's kills add to
            try:
                reply = check_cell_reply(
                    exchange(
                        box.channel,
                        {"code": box.to_host(code)},
                        time.monotonic() + self.config.timeout_s,
                        self.config.cpu_seconds,
                    )
                )
            except ChannelError as exc:
                raise SandboxError(f"{self.workers.broken(box, exc)}. {STATE_LOST}") from None
            if box.may_have_strays() and box.kill_strays():
                # the worker reaps the zombies of its children now, not at the next cell: until then they
                # would count against the process limit of the sandbox's commands
                try:
                    exchange(box.channel, {"reap": True}, time.monotonic() + 5.0)
                except ChannelError as exc:
                    reply["stderr"] += f"\n[sandbox] After this cell: {self.workers.broken(box, exc)}. {STATE_LOST}\n"
            if reason := box.budget_spent():  # a process the cell started, not the worker
                reply["stderr"] += f"\n[sandbox] {reason}\n"
            box.idle_cpu = None  # read by the idle watch, not here: a call costs one /proc read less
        return box.to_model(format_execution(reply["results"], reply["stdout"], reply["stderr"], reply["error"]))

    def run_command(self, sandbox_id: str, command: str) -> str:
        box = self._box(sandbox_id)
        run = execute(box, ["/bin/sh", "-c", box.to_host(command)], None, self.config, self.isolation, self._reap)
        stdout = box.to_model(run.stdout.decode(errors="replace"))
        stderr = box.to_model(run.stderr.decode(errors="replace"))
        if run.timed_out:
            partial = format_command(stdout, stderr, -1, "timeout")
            raise SandboxError(
                f"Command timed out after {self.config.timeout_s:g} s; it and every process it "
                f"started were killed. Output so far: {truncate(partial, 4000)}"
            )
        if run.budget_spent:
            stderr += f"\n[sandbox] {run.budget_spent}\n"
        if run.exit_code != 0:
            signal_text = f"signal: {signal_name(-run.exit_code)}" if run.exit_code < 0 else None
            raise SandboxError(command_failed(-1 if run.exit_code < 0 else run.exit_code, stderr, signal_text))
        return format_command(stdout, stderr, 0, None)

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
        run = execute(self._box(sandbox_id), args, stdin, limits, self.isolation, self._reap)
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
            known_good = [self.config.python, "-I", "-S", "-c", "print(6 * 7)"]
            run = execute(self._box(sandbox), known_good, None, self.config, self.isolation, self._reap)
        except (SandboxError, OSError) as exc:
            return f"it could not start: {exc}"
        finally:
            self.destroy(sandbox)
        if run.reported and run.exit_code == 0 and run.stdout == b"42\n":
            return ""
        return f"{exit_text(run.exit_code)}: {run.stderr.decode(errors='replace').strip()[-300:]}"

    def is_dir(self, sandbox_id: str, path: str) -> bool:
        full = host_path(self._box(sandbox_id).folder, path)
        return full.is_dir() and not full.is_symlink()

    def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        box = self._box(sandbox_id)
        write_file(box.folder, path, data, box.uid)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        return read_file(self._box(sandbox_id).folder, path, max_bytes)

    def destroy(self, sandbox_id: str) -> None:
        with self._lock:
            box = self._boxes.pop(sandbox_id, None)
        if box is None:
            return
        self.workers.stop(box)
        remove_sandbox(box)

    def close(self) -> None:
        """Removes every sandbox: all their processes killed at once, then each taken apart in a thread
        of its own (unmounts, deletes and rmdirs wait on the kernel, not on this process)."""
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            boxes = list(self._boxes.values())
            self._boxes.clear()
        if not boxes:
            return
        workers = [box.worker for box in boxes]
        for box in boxes:
            box.worker = None  # the calls in flight, failing now, leave the stopping to this thread
        kill_all(boxes)
        with ThreadPoolExecutor(min(CLOSE_THREADS, len(boxes)), thread_name_prefix="sandbox-close") as pool:
            list(pool.map(self._take_apart, boxes, workers))

    def _take_apart(self, box: LocalSandbox, worker: subprocess.Popen | None) -> None:
        if worker is not None:
            with suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=5.0)  # killed already: only the reaping is left
            for fd in (box.channel.requests, box.channel.replies):
                with suppress(OSError):
                    os.close(fd)
        remove_sandbox(box, killed=True)

    def leftover_processes(self, sandbox_id: str) -> list[int]:
        """Live processes of the sandbox other than its Python worker (between calls: none)."""
        box = self._box(sandbox_id)
        owns = box.owns()
        return [p.pid for p in processes() if p.state not in b"ZX" and owns(p) and p.pid not in box.keep]

    def _box(self, sandbox_id: str) -> LocalSandbox:
        with self._lock:
            box = self._boxes.get(sandbox_id)
        if box is None:
            raise SandboxError(invalid_id(sandbox_id))
        return box

    def _reap(self) -> None:
        with self._lock:
            waited = set().union(*(b.sessions for b in self._boxes.values()))
        reap_orphans(waited)
