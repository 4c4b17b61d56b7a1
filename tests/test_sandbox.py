"""The sandbox tools' answers and settings, and the local sandbox in ordinary use, run for real: state kept
between cells, ids checked, idle sandboxes closed, timeouts bounded. Hostile code, files in and out, and the
E2B backend have files of their own (tests/test_sandbox_hostile.py, test_sandbox_files.py, test_sandbox_e2b.py)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import JAIL
from e2b import CommandResult
from e2b_code_interpreter import Execution, ExecutionError, Logs, Result

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes, config_from_env
from nanbeige.tools.sandbox.answers import format_command, format_execution, invalid_id
from nanbeige.tools.sandbox.manager import idle_seconds
from nanbeige.tools.sandbox.sandbox_config import PLACEHOLDER_IDS
from nanbeige.tools.sandbox.system import processes


def make_config(root: Path, **overrides: object) -> SandboxConfig:
    return replace(
        SandboxConfig(
            root=root / "sandboxes",
            upload_dirs=[root / "uploads"],
            jail=JAIL,
            download_dir=root / "downloads",
            timeout_s=10.0,
        ),
        **overrides,
    )


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    boxes = Sandboxes(make_config(tmp_path_factory.mktemp("sbx")))
    yield boxes
    boxes.close()


def new_id(boxes: Sandboxes) -> str:
    # the first line: where there is no jail, a second line says so
    return boxes.create().splitlines()[0].removeprefix("Sandbox created with sandbox_id: ")


# --- shapes and settings -----------------------------------------------------------------------


def test_results_have_e2b_text_shapes() -> None:
    error = ExecutionError(name="ValueError", value="bad 'x'", traceback="Traceback ...\nValueError: bad 'x'\n")
    real = Execution(
        results=[Result(text="42", is_main_result=True)], logs=Logs(stdout=["1\n"], stderr=[]), error=error
    )
    ours = format_execution(["42"], "1\n", "", {"name": error.name, "value": error.value, "traceback": error.traceback})
    assert ours == str(real)
    assert format_execution([], "1\n", "", None) == str(Execution(results=[], logs=Logs(stdout=["1\n"], stderr=[])))
    assert format_command("hi\n", "", 0, None) == str(CommandResult(stderr="", stdout="hi\n", exit_code=0, error=None))


def test_config_from_env_reads_every_setting() -> None:
    config = config_from_env(
        {
            "E2B_API_KEY": "k-123",
            "NANBEIGE_SANDBOX_TIMEOUT": "7.5",
            "NANBEIGE_SANDBOX_MEMORY_MB": "300",
            "NANBEIGE_SANDBOX_NETWORK": "yes",
            "NANBEIGE_SANDBOX_DIR": "/x/y",
            "NANBEIGE_SANDBOX_UPLOAD_DIRS": f"/a{os.pathsep}/b",
        }
    )
    assert (config.backend, config.timeout_s, config.memory_mb, config.network) == ("e2b", 7.5, 300, True)
    assert config.root == Path("/x/y") and config.upload_dirs == [Path("/a"), Path("/b")]
    assert "k-123" not in repr(config)
    assert config_from_env({"E2B_API_KEY": "k", "NANBEIGE_SANDBOX_BACKEND": "local"}).backend == "local"
    assert config_from_env({}).backend == "local"
    with pytest.raises(ValueError, match="NANBEIGE_SANDBOX_TIMOUT"):
        config_from_env({"NANBEIGE_SANDBOX_TIMOUT": "1"})


# --- the local sandbox: ordinary use -----------------------------------------------------------


def test_python_state_persists_and_the_last_expression_is_a_result(sandboxes: Sandboxes) -> None:
    sid = new_id(sandboxes)
    assert (
        sandboxes.run_python("x = 41\nprint('set')", sid)
        == "Execution(Results: [], Logs: Logs(stdout: ['set\\n'], stderr: []), Error: None)"
    )
    assert (
        sandboxes.run_python("import os\nos.system('echo from-shell')\nx + 1", sid)
        == "Execution(Results: [Result(42)], Logs: Logs(stdout: ['from-shell\\n'], stderr: []), Error: None)"
    )
    assert "Results: [Result('/home/user')]" in sandboxes.run_python("os.getcwd()", sid)
    assert "Result([1, 2])" in sandboxes.run_python("display([1, 2])", sid)


def test_an_exception_is_a_normal_result_with_the_error(sandboxes: Sandboxes) -> None:
    sid = new_id(sandboxes)
    text = sandboxes.run_python("print('before')\n{}['missing']", sid)
    assert text.startswith(
        "Execution(Results: [], Logs: Logs(stdout: ['before\\n'], stderr: []), "
        "Error: ExecutionError(name='KeyError', value=\"'missing'\""
    )
    assert 'File "<cell 1>", line 2' in text and "sandbox/worker.py" not in text
    assert "name='SyntaxError'" in sandboxes.run_python("def (", sid)
    assert "name='SystemExit'" in sandboxes.run_python("raise SystemExit(3)", sid)
    assert "Result(3)" in sandboxes.run_python("1 + 2", sid)  # the worker survived all of it


# The ids MiroThinker v1.0's server refused (python_mcp_server.py, INVALID_SANDBOX_IDS).
REFERENCE_PLACEHOLDERS = {
    "default",
    "sandbox1",
    "sandbox",
    "some_id",
    "new_sandbox",
    "python",
    "create_sandbox",
    "sandbox123",
    "temp",
    "sandbox-0",
    "sandbox-1",
    "sandbox_0",
    "sandbox_1",
    "new",
    "0",
    "auto",
    "default_sandbox",
    "none",
    "sandbox_12345",
    "dummy",
    "sandbox_01",
}


def test_placeholder_ids_are_the_reference_servers() -> None:
    assert PLACEHOLDER_IDS == REFERENCE_PLACEHOLDERS


@pytest.mark.parametrize("placeholder", sorted(REFERENCE_PLACEHOLDERS) + [""])
def test_a_placeholder_id_is_refused_by_every_tool_and_nothing_runs(
    sandboxes: Sandboxes, tmp_path: Path, placeholder: str
) -> None:
    """As in the reference server: no throwaway sandbox, the model is told to create a real one."""
    before = set(os.listdir(sandboxes.config.root))
    message = re.escape(
        f"'{placeholder}' is not a valid sandbox_id. Please create a real sandbox first using the create_sandbox tool."
    )
    for call in (
        lambda: sandboxes.run_python("1 + 1", placeholder),
        lambda: sandboxes.run_command("echo hi", placeholder),
        lambda: sandboxes.upload(placeholder, str(tmp_path / "missing.txt")),  # the id is checked first
        lambda: sandboxes.download_url(placeholder, "https://example.com/x.txt"),
        lambda: sandboxes.download_to_local(placeholder, "/home/user/x.txt"),
    ):
        with pytest.raises(SandboxError, match=f"^{message}$"):
            call()
    assert set(os.listdir(sandboxes.config.root)) == before


def test_unknown_ids_are_errors_for_every_tool(sandboxes: Sandboxes, tmp_path: Path) -> None:
    message = "'sbx-42' is not a valid sandbox_id. Please create a real sandbox first using the create_sandbox tool."
    assert invalid_id("sbx-42") == message
    with pytest.raises(SandboxError, match=re.escape(message)):
        sandboxes.run_python("1", "sbx-42")
    with pytest.raises(SandboxError, match=re.escape(message)):
        sandboxes.run_command("true", "sbx-42")
    with pytest.raises(SandboxError, match="'default' is not a valid sandbox_id"):
        sandboxes.download_to_local("default", "/home/user/x.txt")


def test_commands_run_in_the_sandbox_folder(sandboxes: Sandboxes) -> None:
    sid = new_id(sandboxes)
    assert (
        sandboxes.run_command("pwd", sid) == "CommandResult(stderr='', stdout='/home/user\\n', exit_code=0, error=None)"
    )
    # a non-zero exit fails as E2B's CommandExitException did in the reference server: stderr only
    with pytest.raises(SandboxError) as failed:
        sandboxes.run_command("pwd; echo oops >&2; exit 3", sid)
    assert str(failed.value) == (
        "Failed to run command.\n\nException type: CommandExitException\n"
        "Details: Command exited with code 3 and error:\noops\n"
    )
    sandboxes.run_python("open('/home/user/made.txt', 'w').write('from python')", sid)
    assert "stdout='from python'" in sandboxes.run_command("cat made.txt", sid)
    if not sandboxes.backend.isolation.own_pids:  # as the first process of a pid namespace it would be immune
        with pytest.raises(SandboxError, match=re.escape("code -1 (signal: SIGKILL) and error:")):
            sandboxes.run_command("kill -9 $$", sid)


def test_no_server_secrets_reach_the_sandbox(sandboxes: Sandboxes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERPER_API_KEY", "secret-serper")
    monkeypatch.setenv("E2B_API_KEY", "secret-e2b")
    sid = new_id(sandboxes)
    assert "secret" not in sandboxes.run_python("import os; dict(os.environ)", sid)
    assert "secret" not in sandboxes.run_command("env", sid)
    if sandboxes.backend.isolation.own_uid:
        # in a jail the server's process is not even in the sandbox's /proc
        error = "FileNotFoundError" if sandboxes.backend.isolation.jail else "PermissionError"
        assert error in sandboxes.run_python(f"open('/proc/{os.getpid()}/environ').read()", sid)


def test_idle_sandboxes_close_and_too_many_evict_the_oldest(tmp_path: Path) -> None:
    boxes = Sandboxes(make_config(tmp_path, max_sandboxes=2))
    try:
        short = boxes.create(timeout=1).splitlines()[0].split(": ")[1]
        time.sleep(1.1)
        with pytest.raises(SandboxError, match="shut down after 1 s without use"):
            boxes.run_python("1", short)
        first, second, _ = new_id(boxes), new_id(boxes), new_id(boxes)
        with pytest.raises(SandboxError, match="more than 2 sandboxes"):
            boxes.run_python("1", first)
        assert "Result(1)" in boxes.run_python("1", second)
    finally:
        boxes.close()
    assert os.listdir(tmp_path / "sandboxes") == []


def running(pid: int) -> bool:
    return any(p.pid == pid and p.state not in b"ZX" for p in processes())


def test_an_idle_sandbox_is_closed_on_time_without_another_call(tmp_path: Path) -> None:
    boxes = Sandboxes(make_config(tmp_path))
    try:
        sid = boxes.create(timeout=1).splitlines()[0].split(": ")[1]
        assert "Result(2)" in boxes.run_python("1 + 1", sid)  # starts its Python process
        worker, place = boxes.backend._box(sid).channel.pid, tmp_path / "sandboxes" / sid
        left = time.monotonic()
        assert running(worker) and place.is_dir()
        while (running(worker) or place.exists()) and time.monotonic() - left < 5:
            time.sleep(0.05)
        gone_after = time.monotonic() - left
        assert not running(worker) and not place.exists()
        assert gone_after < 3.0  # its 1 s, the timer's tick of at most 1 s, and the removal
        with pytest.raises(SandboxError, match="shut down after 1 s without use"):
            boxes.run_python("1", sid)
    finally:
        boxes.close()


def test_a_call_longer_than_the_idle_timeout_is_not_cut_short(tmp_path: Path) -> None:
    boxes = Sandboxes(make_config(tmp_path))
    try:
        sid = boxes.create(timeout=1).splitlines()[0].split(": ")[1]
        assert "Result(5)" in boxes.run_python("import time\ntime.sleep(2.5)\n5", sid)  # busy, not idle
        assert "Result(6)" in boxes.run_python("6", sid)  # its 1 s counts from the end of the last call
    finally:
        boxes.close()


@pytest.mark.parametrize(
    "timeout", [0, -5, 601, 1e12, 0.5, True, "30.5", "-3", "soon", None, float("nan"), float("inf"), [30]]
)
def test_a_timeout_outside_whole_seconds_from_1_to_the_limit_is_refused_naming_both(timeout: object) -> None:
    boxes = Sandboxes(SandboxConfig(), backend=object())  # refused before the backend is asked for anything
    with pytest.raises(SandboxError) as refused:
        boxes.create(timeout=timeout)
    assert str(refused.value) == f"timeout must be a whole number of seconds from 1 to 600, not {timeout!r}."


def test_timeouts_within_the_limit_are_whole_seconds_and_the_default_fits_any_limit() -> None:
    assert [idle_seconds(t, 600) for t in (1, 30, 30.0, 30.9, 600, "45", " 60 ")] == [1, 30, 30, 30, 600, 45, 60]
    assert idle_seconds(600, 60) == 60  # the tool's default on a server that allows less
    assert idle_seconds(3600, 7200) == 3600
    with pytest.raises(SandboxError, match="from 1 to 60, not 61"):
        idle_seconds(61, 60)


def test_a_close_while_another_is_under_way_returns_only_when_that_one_is_over() -> None:
    """A server stopped by a signal while it closes its sandboxes after a hangup must not exit halfway."""

    class SlowBackend:
        """Like the local backend: the first close takes every sandbox, a second finds none left to remove."""

        taken, finished = False, 0.0

        def close(self) -> None:
            if self.taken:
                return
            self.taken = True
            time.sleep(0.5)
            self.finished = time.monotonic()

    backend = SlowBackend()
    boxes = Sandboxes(SandboxConfig(), backend=backend)
    first = threading.Thread(target=boxes.close)
    first.start()
    time.sleep(0.1)
    boxes.close()
    returned = time.monotonic()
    first.join()
    assert backend.finished and returned >= backend.finished
