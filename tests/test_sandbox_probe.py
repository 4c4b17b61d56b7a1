"""How a server decides whether it can jail sandboxed code, when that decision is hard to make: a probe
that runs out of time on a loaded machine, a jail that works here but cannot be set up, a bwrap that
fails for a moment or is not installed, a bwrap that fails at call time. No code runs without a jail:
the server answers an error instead, and tries again at the next call. Only the operator's
NANBEIGE_SANDBOX_JAIL=0 gives an unjailed sandbox, and then the create answer says so."""

from __future__ import annotations

import json
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
from conftest import JAIL
from processes import wait_for

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes
from nanbeige.tools.sandbox.jail import JAIL_WORKER
from nanbeige.tools.sandbox.probe import BWRAP_TRIES

JAILED = pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and JAIL), reason="needs root and a bwrap that works here"
)
NO_JAIL = "no filesystem jail"


def make_boxes(root: Path, **settings: object) -> Sandboxes:
    return Sandboxes(
        SandboxConfig(**{"root": root / "sandboxes", "upload_dirs": [root], "timeout_s": 15.0, **settings})
    )  # type: ignore[arg-type]


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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap makes its namespaces here, but the jail around the interpreter fails: that is a fault
    to report, with bwrap's own words, and a hint for the operator, never a reason to run unjailed."""
    failing_jail_runs(monkeypatch, lambda args: JAIL_WORKER in args)
    boxes = make_boxes(tmp_path)
    try:
        with pytest.raises(
            SandboxError,
            match=r"bwrap works on this machine, but the jail could not run the "
            r"interpreter .*Out of memory.*NANBEIGE_SANDBOX_JAIL=0",
        ):
            boxes.create()
    finally:
        boxes.close()


@JAILED
def test_a_bwrap_that_cannot_make_namespaces_is_an_error_at_every_call_never_an_unjailed_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap that fails every try, before any jail is set up, may be failing for a moment (memory or
    processes short) or for good: either way no code runs, the error quotes bwrap and says how to fix
    it, and the verdict is not kept: the next call tries bwrap again, and once it works gets its jail."""
    tries: list[list[str]] = []
    failing_jail_runs(monkeypatch, lambda args: "bwrap" in args[0] and not tries.append(args))
    boxes = make_boxes(tmp_path)
    try:
        for call in (1, 2):
            with pytest.raises(
                SandboxError,
                match=r"bwrap could not make the jail.*Out of memory.*No code was run.*"
                r"NANBEIGE_SANDBOX_JAIL=0",
            ) as refused:
                boxes.create()
            assert "\n" not in str(refused.value)
            assert len(tries) == 3 * call and all(JAIL_WORKER not in args for args in tries)
        monkeypatch.undo()
        answer = boxes.create()
        assert NO_JAIL not in answer and boxes.backend.isolation.jail is not None, answer
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


# --- the real server, with a bwrap that fails or is missing ---------------------------------------


def flaky_bwrap(folder: Path, failures: int) -> Path:
    """A `bwrap` to put first on PATH: its first `failures` calls fail as bwrap does when memory or
    processes run short for a moment, later ones are the real bwrap. It counts its calls in
    `folder/calls`."""
    folder.mkdir()
    calls = folder / "calls"
    calls.write_text("0")
    script = folder / "bwrap"
    script.write_text(f"""#!/bin/sh
n=$(cat {calls}); echo $((n + 1)) > {calls}
if [ "$n" -lt {failures} ]; then
  echo "bwrap: Creating new namespace failed: Resource temporarily unavailable" >&2
  exit 1
fi
exec {shutil.which("bwrap")} "$@"
""")
    script.chmod(0o755)
    return folder


class Server:
    """`python -m nanbeige.servers.python` over stdio, as an MCP client starts it; its stderr (the
    operator's view) goes to a file."""

    def __init__(self, tmp_path: Path, path: str, **env: str) -> None:
        self.log = tmp_path / "server-stderr.txt"
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nanbeige.servers.python"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={"NANBEIGE_SANDBOX_DIR": str(tmp_path / "sandboxes"), "PATH": path, **env},
            )
        self.ids = iter(range(1, 1000))
        self.rpc(
            {
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            }
        )
        self.rpc({"method": "notifications/initialized"}, answered=False)

    def rpc(self, message: dict, answered: bool = True) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        message = {"jsonrpc": "2.0", **message, **({"id": next(self.ids)} if answered else {})}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline()) if answered else {}

    def call(self, tool: str, **arguments: object) -> tuple[str, bool]:
        """The tool's text and whether the result is marked as an error."""
        result = self.rpc({"method": "tools/call", "params": {"name": tool, "arguments": arguments}})["result"]
        return "\n".join(block["text"] for block in result["content"]), result["isError"]

    def stderr(self) -> str:
        return self.log.read_text()

    def close(self) -> None:
        """As an MCP client ends it: stdin closed, then the server removes its sandboxes and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        finally:
            self.proc.kill()
            self.proc.wait()


@JAILED
def test_a_bwrap_that_fails_for_a_moment_is_an_error_for_that_call_and_the_next_call_is_jailed(tmp_path: Path) -> None:
    """The attack: bwrap fails its first calls (a moment of memory or process shortage). The server used
    to decide "no jail" for its whole life and run code unjailed, without seccomp, able to read every
    file. Now the probe at start and the first call fail, each told to the operator on stderr and the
    first to the model as an error with its fix; the next call probes again and is jailed."""
    secret = host_secret(tmp_path)
    bwrap = flaky_bwrap(tmp_path / "bin", failures=2 * BWRAP_TRIES)  # the probe at start's tries, the call's
    server = Server(tmp_path, f"{bwrap}:{os.environ['PATH']}")
    try:
        refused, is_error = server.call("create_sandbox")
        assert is_error and "\n" not in refused
        assert re.fullmatch(
            r"\[ERROR\]: The sandbox could not be made: bwrap could not make the jail.*Resource "
            r"temporarily unavailable.*No code was run; .*NANBEIGE_SANDBOX_JAIL=0.*",
            refused,
        ), refused
        assert wait_for(lambda: server.stderr().count("The sandbox could not be made") == 2, 10), server.stderr()
        created, is_error = server.call("create_sandbox")
        assert not is_error and NO_JAIL not in created, created
        sid = created.removeprefix("Sandbox created with sandbox_id: ")
        text, _ = server.call(
            "run_python_code",
            sandbox_id=sid,
            code_block=(
                f"try:\n    open({str(secret)!r}).read()\nexcept OSError as e:\n    print(type(e).__name__)\n"
                "print([line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')])"
            ),
        )
        assert "FileNotFoundError" in text and "['2']" in text, text  # jailed, and under its seccomp filter
        assert int((bwrap / "calls").read_text()) > 2 * BWRAP_TRIES
    finally:
        server.close()
    assert os.listdir(tmp_path / "sandboxes") == []


@pytest.mark.skipif(sys.platform != "linux", reason="the local sandbox is Linux's")
def test_without_bwrap_no_code_runs_unless_the_operator_turns_the_jail_off(tmp_path: Path) -> None:
    """A machine without bwrap used to get, silently, a sandbox whose code can read every file the
    server's user can. Now every call is an error saying how to install it, the operator sees it on
    stderr, and only NANBEIGE_SANDBOX_JAIL=0 runs code unjailed, with the create answer saying so."""
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    server = Server(tmp_path, str(empty))
    try:
        for _ in range(2):
            refused, is_error = server.call("create_sandbox")
            assert is_error and "\n" not in refused and refused.startswith("[ERROR]: The sandbox could not be made: ")
            assert "bwrap" in refused and "not installed" in refused and "apt-get install bubblewrap" in refused
            assert "NANBEIGE_SANDBOX_JAIL=0" in refused
        assert wait_for(lambda: "not installed" in server.stderr(), 10), server.stderr()
        assert os.listdir(tmp_path / "sandboxes") == []  # no sandbox was made
    finally:
        server.close()
    server = Server(tmp_path, str(empty), NANBEIGE_SANDBOX_JAIL="0")
    try:
        created, is_error = server.call("create_sandbox")
        assert not is_error and NO_JAIL in created and "NANBEIGE_SANDBOX_JAIL=0" in created, created
    finally:
        server.close()


def test_doctor_says_a_sandbox_without_bwrap_runs_no_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nanbeige.agent.cli.doctor import check_sandbox

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    refused = check_sandbox({})
    assert not refused.ok and "runs no code" in refused.found and "NANBEIGE_SANDBOX_JAIL=0" in (refused.fix or "")
    chosen = check_sandbox({"NANBEIGE_SANDBOX_JAIL": "0"})
    assert chosen.ok and "without a jail" in chosen.found
