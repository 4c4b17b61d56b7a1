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
from pathlib import Path

from nanbeige.tools.sandbox.answers import command_failed, format_command, format_execution, invalid_id, truncate
from nanbeige.tools.sandbox.box import WORKER, LocalSandbox, kill_all, make_sandbox, remove_sandbox
from nanbeige.tools.sandbox.budget import can_make_disks, cgroup_parents, folder_bytes, rss_bytes, sweep, sweep_cgroups
from nanbeige.tools.sandbox.channel import ChannelError, check_cell_reply, cpu_time, exchange
from nanbeige.tools.sandbox.files import host_path, read_file, write_file
from nanbeige.tools.sandbox.probe import Isolation, probe_isolation, unjailed_notice
from nanbeige.tools.sandbox.program_runs import ProgramRunner
from nanbeige.tools.sandbox.sandbox_config import MB, SandboxConfig, SandboxError
from nanbeige.tools.sandbox.system import become_subreaper, kill_processes, processes, reap_orphans, signal_name
from nanbeige.tools.sandbox.worker_lifecycle import STATE_LOST, WorkerLifecycle

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0  # how often idle workers' CPU time is read
CLOSE_THREADS = 16  # sandboxes taken apart at once when the server closes
BUDGET_CHECK_S = 0.25  # how often memory and disk are summed, where no cgroup or file system holds them


# --- the backend -------------------------------------------------------------------------------


class LocalBackend(ProgramRunner, WorkerLifecycle):
    """Sandboxes on this machine: a folder and a persistent Python worker each. Running programs for judges
    is `ProgramRunner`'s (program_runs.py), starting and stopping the workers `WorkerLifecycle`'s
    (worker_lifecycle.py)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._boxes: dict[str, LocalSandbox] = {}
        self._lock = threading.Lock()
        self._isolation: Isolation | None = None
        self._cgroups: tuple[int, tuple[Path, ...]] | None = None
        self._disks = False
        self._idle_watch: threading.Thread | None = None
        # Workers start from this one thread, which lives as long as the server: a jail dies with the
        # thread that started it, also when the server is killed outright and code in the jail has
        # blinded the worker's own watch on the server.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")
        self._closed = threading.Event()

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
            if self._idle_watch is None or not self._idle_watch.is_alive():
                self._closed = threading.Event()
                self._idle_watch = threading.Thread(
                    target=self._watch, args=(self._closed,), name="sandbox-watch", daemon=True
                )
                self._idle_watch.start()
        return box.id

    def attach(self, sandbox_id: str, timeout: int) -> None:
        raise SandboxError(invalid_id(sandbox_id))  # local sandboxes end with the server that made them

    def run_python(self, sandbox_id: str, code: str) -> str:
        box = self._box(sandbox_id)
        with box.lock:
            if box.stopped_idle:
                message, box.stopped_idle = box.stopped_idle, ""
                raise SandboxError(message)
            if box.worker is None:
                self._start_worker(box)
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
                raise SandboxError(f"{self._broken(box, exc)}. {STATE_LOST}") from None
            if box.may_have_strays() and self._kill_strays(box):
                # the worker reaps the zombies of its children now, not at the next cell: until then they
                # would count against the process limit of the sandbox's commands
                try:
                    exchange(box.channel, {"reap": True}, time.monotonic() + 5.0)
                except ChannelError as exc:
                    reply["stderr"] += f"\n[sandbox] After this cell: {self._broken(box, exc)}. {STATE_LOST}\n"
            if reason := self._budget_spent(box):  # a process the cell started, not the worker
                reply["stderr"] += f"\n[sandbox] {reason}\n"
            box.idle_cpu = None  # read by the idle watch, not here: a call costs one /proc read less
        return box.to_model(format_execution(reply["results"], reply["stdout"], reply["stderr"], reply["error"]))

    def run_command(self, sandbox_id: str, command: str) -> str:
        box = self._box(sandbox_id)
        run = self._execute(box, ["/bin/sh", "-c", box.to_host(command)], None, self.config)
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
        self._stop_worker(box)
        remove_sandbox(box)

    def close(self) -> None:
        """Removes every sandbox: all their processes killed at once, then each taken apart in a thread
        of its own (unmounts, deletes and rmdirs wait on the kernel, not on this process)."""
        self._closed.set()
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

    def _watch(self, closed: threading.Event) -> None:
        """Between calls, stops workers that used more than a call's CPU time since their last call
        ended: code may leave a thread running, and then no limit inside the process holds. At any
        time, stops sandboxes past their memory or disk budget where no cgroup or file system of
        their own holds it."""
        ticks = 0
        while not closed.wait(BUDGET_CHECK_S if self._cgroups is None or not self._disks else IDLE_CHECK_S):
            ticks += 1
            with self._lock:
                boxes = list(self._boxes.values())
            for box in boxes:
                if reason := self._over_budget(box):
                    box.over_budget = reason  # before the kill: the call that sees its process die says why
                    with box.killing:  # no process of the next call starts until the kill is over
                        if not kill_processes(box.owns(), keep=set(), waited=set(box.sessions)):
                            box.over_budget = ""  # nothing was running: files past the budget wait for the model
                        if not self._disks:  # what the killed processes wrote last is not growth of the next call
                            box.disk_used = self._disk_bytes(box)
                if (self._cgroups is None or not self._disks) and ticks % round(IDLE_CHECK_S / BUDGET_CHECK_S):
                    continue
                if not box.lock.acquire(blocking=False):
                    continue  # in a call, which watches its own CPU time
                try:
                    used = cpu_time(box.channel.pid) if box.worker else 0.0
                    if box.idle_cpu is None:
                        box.idle_cpu = used
                    elif box.worker and used - box.idle_cpu > self.config.cpu_seconds:
                        self._stop_worker(box)
                        box.stopped_idle = (
                            f"Between calls, code left running in the Python process used more "
                            f"than {self.config.cpu_seconds} s of CPU time, so it was stopped. "
                            f"{STATE_LOST} The code of this call did not run; send it again."
                        )
                    # a thread left running may start processes after its call: none may outlive a call
                    if box.worker and box.may_have_strays():
                        self._kill_strays(box)
                finally:
                    box.lock.release()

    def _over_budget(self, box: LocalSandbox) -> str:
        c = self.config
        if self._cgroups is None:
            owns = box.owns()
            pids = [p.pid for p in processes() if owns(p) and p.state not in b"ZX"]
            if rss_bytes(pids) > c.memory_mb * MB:
                return (
                    f"the sandbox ran out of memory (its processes together may use {c.memory_mb} MB), "
                    "so its processes were stopped"
                )
        if not self._disks:
            # only while they grow: the model must be able to run the command that deletes them
            used = self._disk_bytes(box)
            grew, box.disk_used = used > box.disk_used, used
            if grew and used > c.disk_mb * MB:
                return (
                    f"the sandbox's files took more than its {c.disk_mb} MB of disk, so its processes were "
                    "stopped; delete files to go on"
                )
        return ""

    def _disk_bytes(self, box: LocalSandbox) -> int:
        return folder_bytes(box.folder.parent, 4 * self.config.disk_mb * MB)

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

    def _budget_spent(self, box: LocalSandbox) -> str:
        """Why the sandbox's processes were killed, if a budget of the whole sandbox did it."""
        reason, box.over_budget = box.over_budget, ""
        if not reason and box.cgroup and (kills := box.cgroup.oom_kills()) > box.oom_kills:
            box.oom_kills = kills
            reason = (
                f"the sandbox ran out of memory (its processes together may use {self.config.memory_mb} MB), "
                "so the kernel killed a process"
            )
        return reason

    def _reap(self) -> None:
        with self._lock:
            waited = set().union(*(b.sessions for b in self._boxes.values()))
        reap_orphans(waited)

    def _kill_strays(self, box: LocalSandbox) -> int:
        """Kills what the last call left running (only the Python worker may outlive a call); returns how many."""
        return kill_processes(box.owns(), keep=box.keep, waited=set(box.sessions))
