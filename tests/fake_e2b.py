"""An imitation of `e2b_code_interpreter.Sandbox` that runs commands for real, in local subprocesses, for the
E2B backend of `code-tests`: the parts of the SDK the backend uses, with the SDK's own types and failures
(`CommandResult`, `CommandExitException`, `TimeoutException`, `SandboxException`). Each sandbox is a folder
standing for /home/user; a command runs as envd runs it, `/bin/bash -c CMD` in its cwd, its stdin a pipe fed
by `send_stdin` and closed by `close_stdin`, its output decoded as the SDK decodes it.

    python tests/fake_e2b.py ARGS...     `nanbeige ARGS...` with the imitation in place of E2B's SDK

Settings from the environment: FAKE_E2B_ROOT (the folder of the sandboxes' folders, and `created.jsonl`, one
line per sandbox made), FAKE_E2B_BROKEN=1 (no sandbox can be made: E2B refuses, and its message echoes the
key), FAKE_E2B_OLD_ENVD=1 (closing stdin fails as on an envd older than the SDK needs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from e2b import CommandExitException, CommandResult, SandboxException, TimeoutException

HOME = "/home/user"


class FakeCommand:
    """`CommandHandle`: a process started in the background with a stdin stream."""

    def __init__(self, cmd: str, cwd: Path, timeout: float | None) -> None:
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", cmd],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid, self.timeout, self.output = self.process.pid, timeout, {"stdout": b"", "stderr": b""}
        self.readers = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in self.output]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str) -> None:
        self.output[name] = getattr(self.process, name).read()

    def send_stdin(self, data: str | bytes, request_timeout: float | None = None) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data.encode() if isinstance(data, str) else data)
        self.process.stdin.flush()

    def close_stdin(self, request_timeout: float | None = None) -> None:
        if os.environ.get("FAKE_E2B_OLD_ENVD"):
            raise SandboxException(
                "Sandbox envd version 0.2.0 doesn't support closing stdin. Please rebuild "
                "your template to pick up the latest sandbox version."
            )
        assert self.process.stdin is not None
        self.process.stdin.close()

    def wait(self) -> CommandResult:
        try:
            self.process.wait(timeout=self.timeout or None)
        except subprocess.TimeoutExpired:
            raise TimeoutException("context deadline exceeded: the command's stream timed out") from None
        for reader in self.readers:
            reader.join()
        stdout, stderr = (self.output[name].decode(errors="replace") for name in ("stdout", "stderr"))
        code = self.process.returncode
        if code != 0:  # envd reports a signal as exit -1 and its name
            raise CommandExitException(
                stderr=stderr,
                stdout=stdout,
                exit_code=code if code > 0 else -1,
                error=f"exit status {code}" if code > 0 else "signal: killed",
            )
        return CommandResult(stderr=stderr, stdout=stdout, exit_code=0, error=None)

    def kill(self) -> bool:
        try:
            os.killpg(self.process.pid, 9)
        except OSError:
            return False
        return True


class FakeSandbox:
    """`Sandbox`: `create`, `kill`, `set_timeout`, `files.write`, `commands.run(..., background=True)`."""

    def __init__(self, folder: Path) -> None:
        self.sandbox_id, self.folder = folder.name, folder
        self.files, self.commands = self, self
        self.started: list[FakeCommand] = []

    @classmethod
    def create(
        cls, template: str | None = None, timeout: int | None = None, api_key: str | None = None, **options: object
    ) -> FakeSandbox:
        if os.environ.get("FAKE_E2B_BROKEN"):
            raise SandboxException(f"403: team of key {api_key} has no sandboxes left")
        root = Path(os.environ["FAKE_E2B_ROOT"])
        with (root / "created.jsonl").open("a", encoding="utf-8") as log:
            log.write(json.dumps({"template": template, "key_given": bool(api_key)}) + "\n")
        return cls(Path(tempfile.mkdtemp(prefix="sandbox-", dir=root)))  # made at once from judge's threads

    def set_timeout(self, timeout: int) -> None:
        pass

    def write(self, path: str, data: bytes | str, **options: object) -> None:
        target = self.folder / Path(path).relative_to(HOME)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    def run(
        self,
        cmd: str,
        background: bool | None = None,
        cwd: str | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        **options: object,
    ) -> FakeCommand:
        assert background and stdin, "the backend runs programs in the background, with a stdin stream"
        command = FakeCommand(cmd, self.folder / Path(cwd or HOME).relative_to(HOME), timeout)
        self.started.append(command)
        return command

    def kill(self) -> None:
        for command in self.started:
            command.kill()


if __name__ == "__main__":
    import e2b_code_interpreter

    e2b_code_interpreter.Sandbox = FakeSandbox  # type: ignore[misc]
    from nanbeige.agent.cli.entry import main

    sys.argv = ["nanbeige", *sys.argv[1:]]
    sys.exit(main())
