"""The watch over a local backend's sandboxes between and during calls: a thread that stops workers whose code
left something running on the CPU after their call, kills what a call left running, and holds memory and disk
to their budgets where no cgroup or file system of the sandbox's own does."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nanbeige.tools.sandbox.box import LocalSandbox
from nanbeige.tools.sandbox.budget import folder_bytes, rss_bytes
from nanbeige.tools.sandbox.channel import cpu_time
from nanbeige.tools.sandbox.sandbox_config import MB, SandboxConfig
from nanbeige.tools.sandbox.system import kill_processes, processes
from nanbeige.tools.sandbox.worker_lifecycle import STATE_LOST, Workers

IDLE_CHECK_S = 1.0  # how often idle workers' CPU time is read
BUDGET_CHECK_S = 0.25  # how often memory and disk are summed, where no cgroup or file system holds them


class Watch:
    """One thread watching the sandboxes `boxes` gives, until `stop`."""

    def __init__(
        self,
        config: SandboxConfig,
        boxes: Callable[[], list[LocalSandbox]],
        workers: Workers,
        cgroups: bool,
        disks: bool,
    ) -> None:
        self.config = config
        self._boxes = boxes
        self._workers = workers
        self._cgroups = cgroups
        """Each sandbox has a cgroup, which holds its memory (else this watch sums it)."""
        self._disks = disks
        """Each sandbox has a file system of its own, which holds its disk use (else this watch sums it)."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sandbox-watch", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        """Between calls, stops workers that used more than a call's CPU time since their last call
        ended: code may leave a thread running, and then no limit inside the process holds. At any
        time, stops sandboxes past their memory or disk budget where no cgroup or file system of
        their own holds it."""
        summing = not self._cgroups or not self._disks
        ticks = 0
        while not self._stopped.wait(BUDGET_CHECK_S if summing else IDLE_CHECK_S):
            ticks += 1
            for box in self._boxes():
                if reason := self._over_budget(box):
                    box.over_budget = reason  # before the kill: the call that sees its process die says why
                    with box.killing:  # no process of the next call starts until the kill is over
                        if not kill_processes(box.owns(), keep=set(), waited=set(box.sessions)):
                            box.over_budget = ""  # nothing was running: files past the budget wait for the model
                        if not self._disks:  # what the killed processes wrote last is not growth of the next call
                            box.disk_used = self._disk_bytes(box)
                if summing and ticks % round(IDLE_CHECK_S / BUDGET_CHECK_S):
                    continue
                if not box.lock.acquire(blocking=False):
                    continue  # in a call, which watches its own CPU time
                try:
                    self._idle(box)
                finally:
                    box.lock.release()

    def _idle(self, box: LocalSandbox) -> None:
        """Stops a worker whose code used more than a call's CPU time since its call ended; kills strays."""
        used = cpu_time(box.channel.pid) if box.worker else 0.0
        if box.idle_cpu is None:
            box.idle_cpu = used
        elif box.worker and used - box.idle_cpu > self.config.cpu_seconds:
            self._workers.stop(box)
            box.stopped_idle = (
                f"Between calls, code left running in the Python process used more "
                f"than {self.config.cpu_seconds} s of CPU time, so it was stopped. "
                f"{STATE_LOST} The code of this call did not run; send it again."
            )
        # a thread left running may start processes after its call: none may outlive a call
        if box.worker and box.may_have_strays():
            box.kill_strays()

    def _over_budget(self, box: LocalSandbox) -> str:
        c = self.config
        if not self._cgroups:
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
