"""The persistent Python process of a local sandbox (`worker.py`) as its server handles it: started in
the sandbox's jail from the server's spawner thread, stopped with everything the sandbox started, and
what the model is told when it broke (a timeout, its CPU time, a broken protocol, its death).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

from nanbeige.tools.sandbox.box import LocalSandbox, command_line, sandbox_env
from nanbeige.tools.sandbox.channel import Channel, ChannelError, read_line
from nanbeige.tools.sandbox.probe import Isolation
from nanbeige.tools.sandbox.sandbox_config import SandboxConfig, SandboxError
from nanbeige.tools.sandbox.system import descendant_chain, exit_text, kill_processes

log = logging.getLogger(__name__)

STATE_LOST = (
    "The Python process was restarted, so variables, imports and definitions from earlier calls are "
    "lost; files in /home/user are kept."
)


class Workers:
    """Starts and stops the Python workers of a backend's sandboxes (`LocalBackend`, local.py), from one
    spawner thread that lives as long as the server: a jail dies with the thread that started it, also when
    the server is killed outright and code in the jail has blinded the worker's own watch on the server."""

    def __init__(self, config: SandboxConfig, reap: Callable[[], None]) -> None:
        self.config = config
        self._reap = reap  # waits for the orphans a jail leaves to the server (of every sandbox of the backend)
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")

    def start(self, box: LocalSandbox, isolation: Isolation) -> None:
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        mode = [
            "python",
            str(request_read),
            str(reply_write),
            str(self.config.cpu_seconds),
            str(4 * self.config.max_output_chars),
            str(int(box.uid is not None)),
        ]
        args, fds = command_line(box, self.config, isolation, mode, python=True)
        try:
            box.wait_for_kills()
            box.worker = self._spawner.submit(
                subprocess.Popen,
                args,
                pass_fds=(request_read, reply_write, *fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=box.folder,
                env=sandbox_env(box, self.config),
                start_new_session=True,
            ).result()
        except OSError:
            for fd in (request_write, reply_read):
                os.close(fd)
            raise
        finally:
            for fd in (request_read, reply_write, *fds):
                os.close(fd)
        box.channel = Channel(request_write, reply_read)
        box.sessions.add(box.worker.pid)
        # the worker's first line is its pid, which differs from Popen's when unshare forks it, and
        # in a jail is the pid in its own namespace
        try:
            pid = int(json.loads(read_line(box.channel, time.monotonic() + max(self.config.timeout_s, 30.0)))["pid"])
            chain = descendant_chain(box.worker.pid, pid) if box.jailed else [box.worker.pid, pid]
            if not chain:
                raise ValueError("the jailed worker was not found")
        except (ChannelError, ValueError, KeyError, TypeError):
            status = self.stop(box)
            raise SandboxError(f"The Python process could not start ({exit_text(status)}).") from None
        box.channel.pid, box.keep = chain[-1], set(chain)

    def stop(self, box: LocalSandbox) -> int | None:
        """Kills the worker and everything the sandbox started; returns the worker's exit status."""
        worker, box.worker = box.worker, None
        if worker is None:
            return None
        kill_processes(box.owns(), keep=set(), waited=set(box.sessions))
        with suppress(OSError):
            os.killpg(worker.pid, signal.SIGKILL)
        code = box.status(worker.wait())
        box.sessions.discard(worker.pid)
        box.keep = set()
        if box.jailed:
            self._reap()
        for fd in (box.channel.requests, box.channel.replies):
            with suppress(OSError):
                os.close(fd)
        return code

    def broken(self, box: LocalSandbox, exc: ChannelError) -> str:
        """Stops a worker that timed out, overran its CPU time or broke the protocol; says what happened."""
        if exc.kind == "eof" and box.worker:  # it ended: let the jail around it end too, with its status
            with suppress(subprocess.TimeoutExpired):
                box.worker.wait(timeout=1.0)
        status = self.stop(box)
        if exc.kind == "timeout":
            return f"Execution timed out after {self.config.timeout_s:g} s and was stopped"
        if exc.kind == "cpu":
            return (
                f"Execution used more than {self.config.cpu_seconds} s of CPU time without stopping at its limit, "
                "so it was stopped"
            )
        if exc.kind == "protocol":
            log.warning("local sandbox %s: the Python process sent %s; restarting it", box.id, exc)
            return f"The Python process sent {exc} instead of its reply, so it was stopped"
        reason = box.budget_spent() if status == -signal.SIGKILL or box.jailed else ""
        return f"The Python process died ({exit_text(status)}){': ' + reason if reason else ''}"
