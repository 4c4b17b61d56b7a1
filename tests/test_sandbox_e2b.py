"""The E2B sandbox backend against a fake of its SDK surface that returns the SDK's own result types."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2b import CommandExitException, CommandResult, SandboxNotFoundException, TimeoutException
from e2b_code_interpreter import Execution, ExecutionError, Logs, Result
from test_sandbox import make_config

from nanbeige.tools.sandbox import SandboxError, Sandboxes
from nanbeige.tools.sandbox.answers import invalid_id
from nanbeige.tools.sandbox.e2b import E2BBackend


class FakeE2BSandbox:
    """The part of `e2b_code_interpreter.Sandbox` the backend uses, answering with the SDK's own
    types: code runs in a local namespace, commands understand `echo`, `false` and `sleep`."""

    created: list[FakeE2BSandbox] = []
    connected: list[tuple[str, int | None, dict]] = []

    def __init__(self, **options: object) -> None:
        self.sandbox_id = f"e2b{len(self.created)}"
        self.options, self.timeouts, self.files_data, self.killed = options, [], {}, False
        self.namespace: dict = {}
        self.commands, self.files = self, self

    @classmethod
    def create(cls, template: str | None = None, timeout: int | None = None, api_key: str | None = None) -> object:
        sandbox = cls(template=template, timeout=timeout, api_key=api_key)
        cls.created.append(sandbox)
        return sandbox

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        timeout: int | None = None,
        logger: object = None,
        *,
        on_resume: str = "restore",
        **opts: object,
    ) -> FakeE2BSandbox:
        """The SDK's class-level `connect`: any sandbox still running, whoever created it."""
        cls.connected.append((sandbox_id, timeout, opts))
        for sandbox in cls.created:
            if sandbox.sandbox_id == sandbox_id and not sandbox.killed:
                return sandbox
        raise SandboxNotFoundException(f"Paused sandbox {sandbox_id} not found")

    def set_timeout(self, timeout: int) -> None:
        self.timeouts.append(timeout)

    def run_code(self, code: str, timeout: float | None = None) -> Execution:
        if self.killed:
            raise SandboxNotFoundException("sandbox not found")
        if "while True" in code:
            raise TimeoutException("execution timed out")
        try:
            return Execution(
                results=[Result(text=repr(eval(code, self.namespace)), is_main_result=True)],
                logs=Logs(stdout=[], stderr=[]),
            )
        except Exception as exc:  # noqa: BLE001
            return Execution(error=ExecutionError(type(exc).__name__, str(exc), "Traceback"), logs=Logs())

    def run(self, cmd: str, timeout: float | None = 60) -> CommandResult:
        if cmd.startswith("false"):
            raise CommandExitException(stderr="no such thing\n", stdout="", exit_code=1, error="exit status 1")
        return CommandResult(stderr="", stdout=cmd.removeprefix("echo ") + "\n", exit_code=0, error=None)

    def write(self, path: str, data: bytes) -> None:
        self.files_data[path] = data

    def read(self, path: str, format: str = "text") -> bytearray:
        return bytearray(self.files_data[path])

    def kill(self) -> None:
        self.killed = True


def test_e2b_backend_against_a_fake_of_its_sdk(tmp_path: Path) -> None:
    FakeE2BSandbox.created = []
    config = make_config(tmp_path, backend="e2b", e2b_api_key="key", e2b_template="tpl", timeout_s=30.0)
    boxes = Sandboxes(config, backend=E2BBackend(config, sandbox_class=FakeE2BSandbox))
    with pytest.raises(SandboxError, match="from 1 to 600, not 900"):
        boxes.create(timeout=900)
    assert boxes.create(timeout=600) == "Sandbox created with sandbox_id: e2b0"
    fake = FakeE2BSandbox.created[0]
    assert fake.options == {"template": "tpl", "timeout": 600, "api_key": "key"}
    assert (
        boxes.run_python("6 * 7", "e2b0")
        == "Execution(Results: [Result(42)], Logs: Logs(stdout: [], stderr: []), Error: None)"
    )
    assert "ExecutionError(name='ZeroDivisionError'" in boxes.run_python("1/0", "e2b0")
    assert boxes.run_command("echo hi", "e2b0") == "CommandResult(stderr='', stdout='hi\\n', exit_code=0, error=None)"
    with pytest.raises(SandboxError) as failed:
        boxes.run_command("false", "e2b0")
    assert str(failed.value).endswith(
        "CommandExitException\nDetails: "
        + str(CommandExitException(stderr="no such thing\n", stdout="", exit_code=1, error="exit status 1"))
    )
    with pytest.raises(SandboxError, match="Timed out after 30 s"):
        boxes.run_python("while True: pass", "e2b0")
    (tmp_path / "uploads").mkdir()
    (tmp_path / "uploads" / "in.txt").write_text("data")
    assert boxes.upload("e2b0", str(tmp_path / "uploads" / "in.txt")) == "File uploaded to /home/user/in.txt"
    assert fake.files_data == {"/home/user/in.txt": b"data"}
    assert boxes.download_to_local("e2b0", "/home/user/in.txt", "copy.txt").endswith("/downloads/copy.txt")
    assert fake.timeouts and set(fake.timeouts) == {600}
    with pytest.raises(SandboxError, match="'default' is not a valid sandbox_id"):
        boxes.run_python("2", "default")
    assert len(FakeE2BSandbox.created) == 1  # no sandbox was made for the placeholder
    fake.killed = True
    with pytest.raises(SandboxError, match="no longer exists"):
        boxes.run_python("1", "e2b0")
    boxes.create()
    boxes.close()
    assert all(s.killed for s in FakeE2BSandbox.created)


def test_e2b_backend_connects_to_sandboxes_it_did_not_create(tmp_path: Path) -> None:
    FakeE2BSandbox.created, FakeE2BSandbox.connected = [], []
    earlier = FakeE2BSandbox.create(timeout=600, api_key="key")  # made before the server restarted
    earlier.namespace["answer"] = 42
    config = make_config(tmp_path, backend="e2b", e2b_api_key="key")
    boxes = Sandboxes(config, backend=E2BBackend(config, sandbox_class=FakeE2BSandbox))
    assert "Result(42)" in boxes.run_python("answer", "e2b0")
    assert (
        boxes.run_command("echo again", "e2b0")
        == "CommandResult(stderr='', stdout='again\\n', exit_code=0, error=None)"
    )
    assert FakeE2BSandbox.connected == [("e2b0", 600, {"api_key": "key"})]  # connected once, then held
    assert earlier.timeouts == [600, 600]
    with pytest.raises(SandboxError, match=re.escape(invalid_id("e2b-unknown"))):
        boxes.run_python("1", "e2b-unknown")
    with pytest.raises(SandboxError, match=re.escape(invalid_id("e2b-unknown"))):
        boxes.download_to_local("e2b-unknown", "/home/user/x.txt")
    with pytest.raises(SandboxError, match="'default' is not a valid sandbox_id"):
        boxes.download_to_local("default", "/home/user/x.txt")  # a placeholder is never looked up
    with pytest.raises(SandboxError, match="'None' is not a valid sandbox_id"):
        boxes.run_command("true", "None")  # compared case and all, as the reference did: looked up, not found
    assert [c[0] for c in FakeE2BSandbox.connected] == ["e2b0", "e2b-unknown", "e2b-unknown", "None"]
    boxes.close()
