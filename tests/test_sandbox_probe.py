"""How a server decides, once, whether it can jail sandboxed code, when that decision is hard to make:
a probe that runs out of time on a loaded machine, a jail that works here but cannot be set up,
a bwrap that fails at call time. A server that can jail never runs code without one: it answers an
error instead. Only a bwrap that cannot run here at all, or a jail turned off, gives an unjailed
sandbox, and then the create answer says so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes
from nanbeige.tools.sandbox.jail import JAIL_WORKER

JAILED = pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and shutil.which("bwrap")), reason="needs root and bwrap")
NO_JAIL = "no filesystem jail"


def make_boxes(root: Path, **settings: object) -> Sandboxes:
    return Sandboxes(SandboxConfig(**{"root": root / "sandboxes", "upload_dirs": [root], "timeout_s": 15.0,
                                      **settings}))  # type: ignore[arg-type]


def host_secret(tmp_path: Path) -> Path:
    """A file only the server's user may read, outside any sandbox: what a jail hides."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    secret = folder / "secret.txt"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    return secret


def slow_jail_runs(monkeypatch: pytest.MonkeyPatch, slow_tries: int) -> list[float]:
    """The first `slow_tries` runs of the jail's test program run out of time, as on a loaded machine;
    returns the timeouts each run of it was given."""
    real_run, timeouts = subprocess.run, []

    def run(args: list[str], *rest: object, **kwargs: object) -> subprocess.CompletedProcess:
        if JAIL_WORKER in args:
            timeouts.append(kwargs["timeout"])
            if len(timeouts) <= slow_tries:
                raise subprocess.TimeoutExpired(args, kwargs["timeout"])  # type: ignore[arg-type]
        return real_run(args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", run)
    return timeouts


def failing_jail_runs(monkeypatch: pytest.MonkeyPatch, why: Callable[[list[str]], bool]) -> None:
    """Runs of bwrap that `why` picks exit with 1 and bwrap's message on stderr."""
    real_run = subprocess.run

    def run(args: list[str], *rest: object, **kwargs: object) -> subprocess.CompletedProcess:
        if why(args):
            return subprocess.CompletedProcess(args, 1, b"", b"bwrap: Creating new namespace failed: Out of memory")
        return real_run(args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", run)


@JAILED
def test_a_jail_probe_that_runs_out_of_time_once_is_tried_again_and_the_code_stays_jailed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timeout says the machine was slow, not that the jail cannot work: the probe is tried again
    with more time, and the sandbox is jailed. Read as "no jail", the code would run unjailed and,
    here, read the host's private file."""
    secret = host_secret(tmp_path)
    timeouts = slow_jail_runs(monkeypatch, slow_tries=1)
    boxes = make_boxes(tmp_path)
    try:
        answer = boxes.create()
        assert NO_JAIL not in answer and boxes.backend.isolation.jail is not None, answer
        sid = re.search(r"sandbox_id: ([0-9a-f]+)", answer)[1]  # type: ignore[index]
        assert "FileNotFoundError" in boxes.run_python(f"open({str(secret)!r}).read()", sid)
        assert len(timeouts) == 2 and timeouts[1] > timeouts[0]
    finally:
        boxes.close()


@JAILED
def test_a_jail_probe_that_never_finishes_is_an_error_and_a_later_call_tries_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While it is unknown whether the jail works, no sandbox is made: the model is told why, and
    the next call, on a machine no longer overloaded, gets its jail."""
    slow_jail_runs(monkeypatch, slow_tries=100)
    boxes = make_boxes(tmp_path)
    try:
        with pytest.raises(SandboxError, match=r"did not finish within .* No code was run") as refused:
            boxes.create()
        assert "\n" not in str(refused.value)
        monkeypatch.undo()
        answer = boxes.create()
        assert NO_JAIL not in answer and boxes.backend.isolation.jail is not None
    finally:
        boxes.close()


@JAILED
def test_a_jail_that_works_here_but_cannot_be_set_up_is_an_error_not_an_unjailed_sandbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap makes its namespaces here, but the jail around the interpreter fails: that is a fault
    to report, with bwrap's own words, and a hint for the operator, never a reason to run unjailed."""
    failing_jail_runs(monkeypatch, lambda args: JAIL_WORKER in args)
    boxes = make_boxes(tmp_path)
    try:
        with pytest.raises(SandboxError, match=r"bwrap works on this machine, but the jail could not run the "
                                               r"interpreter .*Out of memory.*NANBEIGE_SANDBOX_JAIL=0"):
            boxes.create()
    finally:
        boxes.close()


@JAILED
def test_a_bwrap_that_cannot_make_namespaces_here_falls_back_with_the_notice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a bwrap that fails every time, before any jail is set up, means no jail can be made
    here: the sandbox then runs without one, and says so."""
    tries: list[list[str]] = []
    failing_jail_runs(monkeypatch, lambda args: "bwrap" in args[0] and not tries.append(args))
    boxes = make_boxes(tmp_path)
    try:
        answer = boxes.create()
        assert NO_JAIL in answer and "bwrap is missing or cannot run" in answer
        assert len(tries) == 3 and all(JAIL_WORKER not in args for args in tries)
    finally:
        boxes.close()


@JAILED
def test_a_jail_that_fails_at_call_time_is_an_error_and_the_code_does_not_run(tmp_path: Path) -> None:
    """The decision, once made, holds for every call: a bwrap that fails when a call starts its
    jail gives an error, and the code runs nowhere."""
    boxes = make_boxes(tmp_path)
    try:
        sid = re.search(r"sandbox_id: ([0-9a-f]+)", boxes.create())[1]  # type: ignore[index]
        isolation = boxes.backend.isolation
        boxes.backend._isolation = replace(isolation, jail=replace(isolation.jail, bwrap="/bin/false"))
        marker = tmp_path / "ran"
        with pytest.raises(SandboxError, match="could not start"):
            boxes.run_python(f"open({str(marker)!r}, 'w').close()", sid)
        with pytest.raises(SandboxError, match="exited with code 1"):
            boxes.run_command(f"touch {marker}", sid)
        assert not marker.exists()
    finally:
        boxes.close()


@JAILED
def test_a_call_that_comes_while_the_probe_runs_waits_for_it_and_is_jailed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server starts probing in the background; a create that comes first waits for the answer
    instead of taking the unjailed road."""
    real_run = subprocess.run

    def slow_run(args: list[str], *rest: object, **kwargs: object) -> subprocess.CompletedProcess:
        if JAIL_WORKER in args:
            time.sleep(0.5)
        return real_run(args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", slow_run)
    boxes = make_boxes(tmp_path)
    try:
        boxes.start()
        answer = boxes.create()
        assert NO_JAIL not in answer and boxes.backend.isolation.jail is not None, answer
    finally:
        boxes.close()
