"""The sandbox backends: the local one by running real (and hostile) code, E2B against a fake of
its SDK surface that returns the SDK's own result types."""

from __future__ import annotations

import http.server
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import JAIL
from e2b import CommandExitException, CommandResult, SandboxNotFoundException, TimeoutException
from e2b_code_interpreter import Execution, ExecutionError, Logs, Result

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes, config_from_env
from nanbeige.tools.sandbox.answers import TRUNCATED, format_command, format_execution, invalid_id
from nanbeige.tools.sandbox.e2b import E2BBackend
from nanbeige.tools.sandbox.manager import idle_seconds
from nanbeige.tools.sandbox.sandbox_config import PLACEHOLDER_IDS
from nanbeige.tools.sandbox.system import processes


def make_config(root: Path, **overrides: object) -> SandboxConfig:
    return replace(SandboxConfig(root=root / "sandboxes", upload_dirs=[root / "uploads"], jail=JAIL,
                                 download_dir=root / "downloads", timeout_s=10.0), **overrides)


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    boxes = Sandboxes(make_config(tmp_path_factory.mktemp("sbx")))
    yield boxes
    boxes.close()


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    """Tight limits, for hostile code."""
    config = make_config(tmp_path_factory.mktemp("strict"), timeout_s=2.0, memory_mb=512, file_size_mb=1,
                         max_processes=16, max_output_chars=5_000)
    boxes = Sandboxes(config)
    yield boxes
    boxes.close()


def new_id(boxes: Sandboxes) -> str:
    # the first line: where there is no jail, a second line says so
    return boxes.create().splitlines()[0].removeprefix("Sandbox created with sandbox_id: ")


# --- shapes and settings -----------------------------------------------------------------------


def test_results_have_e2b_text_shapes() -> None:
    error = ExecutionError(name="ValueError", value="bad 'x'", traceback="Traceback ...\nValueError: bad 'x'\n")
    real = Execution(results=[Result(text="42", is_main_result=True)], logs=Logs(stdout=["1\n"], stderr=[]),
                     error=error)
    ours = format_execution(["42"], "1\n", "", {"name": error.name, "value": error.value, "traceback": error.traceback})
    assert ours == str(real)
    assert format_execution([], "1\n", "", None) == str(Execution(results=[], logs=Logs(stdout=["1\n"], stderr=[])))
    assert format_command("hi\n", "", 0, None) == str(CommandResult(stderr="", stdout="hi\n", exit_code=0, error=None))


def test_config_from_env_reads_every_setting() -> None:
    config = config_from_env({"E2B_API_KEY": "k-123", "NANBEIGE_SANDBOX_TIMEOUT": "7.5",
                              "NANBEIGE_SANDBOX_MEMORY_MB": "300", "NANBEIGE_SANDBOX_NETWORK": "yes",
                              "NANBEIGE_SANDBOX_DIR": "/x/y", "NANBEIGE_SANDBOX_UPLOAD_DIRS": f"/a{os.pathsep}/b"})
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
    assert sandboxes.run_python("x = 41\nprint('set')", sid) == \
        "Execution(Results: [], Logs: Logs(stdout: ['set\\n'], stderr: []), Error: None)"
    assert sandboxes.run_python("import os\nos.system('echo from-shell')\nx + 1", sid) == \
        "Execution(Results: [Result(42)], Logs: Logs(stdout: ['from-shell\\n'], stderr: []), Error: None)"
    assert "Results: [Result('/home/user')]" in sandboxes.run_python("os.getcwd()", sid)
    assert "Result([1, 2])" in sandboxes.run_python("display([1, 2])", sid)


def test_an_exception_is_a_normal_result_with_the_error(sandboxes: Sandboxes) -> None:
    sid = new_id(sandboxes)
    text = sandboxes.run_python("print('before')\n{}['missing']", sid)
    assert text.startswith("Execution(Results: [], Logs: Logs(stdout: ['before\\n'], stderr: []), "
                           "Error: ExecutionError(name='KeyError', value=\"'missing'\"")
    assert "File \"<cell 1>\", line 2" in text and "sandbox/worker.py" not in text
    assert "name='SyntaxError'" in sandboxes.run_python("def (", sid)
    assert "name='SystemExit'" in sandboxes.run_python("raise SystemExit(3)", sid)
    assert "Result(3)" in sandboxes.run_python("1 + 2", sid)  # the worker survived all of it


# The ids MiroThinker v1.0's server refused (python_mcp_server.py, INVALID_SANDBOX_IDS).
REFERENCE_PLACEHOLDERS = {
    "default", "sandbox1", "sandbox", "some_id", "new_sandbox", "python", "create_sandbox", "sandbox123", "temp",
    "sandbox-0", "sandbox-1", "sandbox_0", "sandbox_1", "new", "0", "auto", "default_sandbox", "none",
    "sandbox_12345", "dummy", "sandbox_01"}


def test_placeholder_ids_are_the_reference_servers() -> None:
    assert PLACEHOLDER_IDS == REFERENCE_PLACEHOLDERS


@pytest.mark.parametrize("placeholder", sorted(REFERENCE_PLACEHOLDERS) + [""])
def test_a_placeholder_id_is_refused_by_every_tool_and_nothing_runs(sandboxes: Sandboxes, tmp_path: Path,
                                                                     placeholder: str) -> None:
    """As in the reference server: no throwaway sandbox, the model is told to create a real one."""
    before = set(os.listdir(sandboxes.config.root))
    message = re.escape(f"'{placeholder}' is not a valid sandbox_id. Please create a real sandbox first using "
                        "the create_sandbox tool.")
    for call in (lambda: sandboxes.run_python("1 + 1", placeholder),
                 lambda: sandboxes.run_command("echo hi", placeholder),
                 lambda: sandboxes.upload(placeholder, str(tmp_path / "missing.txt")),  # the id is checked first
                 lambda: sandboxes.download_url(placeholder, "https://example.com/x.txt"),
                 lambda: sandboxes.download_to_local(placeholder, "/home/user/x.txt")):
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
    assert sandboxes.run_command("pwd", sid) == \
        "CommandResult(stderr='', stdout='/home/user\\n', exit_code=0, error=None)"
    # a non-zero exit fails as E2B's CommandExitException did in the reference server: stderr only
    with pytest.raises(SandboxError) as failed:
        sandboxes.run_command("pwd; echo oops >&2; exit 3", sid)
    assert str(failed.value) == ("Failed to run command.\n\nException type: CommandExitException\n"
                                 "Details: Command exited with code 3 and error:\noops\n")
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


@pytest.mark.parametrize("timeout", [0, -5, 601, 1e12, 0.5, True, "30.5", "-3", "soon", None, float("nan"),
                                     float("inf"), [30]])
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


# --- the local sandbox: hostile code -----------------------------------------------------------


def test_an_infinite_loop_times_out_and_the_worker_restarts_fresh(strict: Sandboxes) -> None:
    sid = new_id(strict)
    strict.run_python("kept = 1\nopen('kept.txt', 'w').write('x')", sid)
    started = time.monotonic()
    with pytest.raises(SandboxError, match="timed out after 2 s.*restarted.*lost"):
        strict.run_python("import subprocess\nsubprocess.Popen(['sleep', '60'])\nwhile True: pass", sid)
    # back at the 2 s timeout (and a stop of the worker, slower on a busy machine), not when the `sleep 60` ends
    assert time.monotonic() - started < 30
    assert strict.backend.leftover_processes(sid) == []
    assert "name 'kept' is not defined" in strict.run_python("kept", sid)
    assert "stdout='kept.txt\\n'" in strict.run_command("ls", sid)


def test_fork_bombs_are_bounded_and_killed(strict: Sandboxes) -> None:
    isolation = strict.backend.isolation
    if not isolation.process_limit:
        pytest.skip("root without a uid of its own: RLIMIT_NPROC does not apply")
    # without a uid of its own the limit counts the user's other tasks too, so it is set that much higher
    budget = 16 + (0 if isolation.own_uid else sum(p.threads for p in processes() if p.uid == os.getuid()))
    sid = new_id(strict)
    counted = strict.run_python(
        "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, type(e).__name__)",
        sid)
    forked = int(re.search(r"stdout: \['(\d+) BlockingIOError", counted)[1])  # type: ignore[index]
    assert 0 < forked < budget
    assert strict.backend.leftover_processes(sid) == []
    assert "Cannot fork" in strict.run_command("bomb() { bomb | bomb & }; bomb; sleep 0.5", sid)
    with pytest.raises(SandboxError, match="timed out"):
        strict.run_python("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", sid)
    assert strict.backend.leftover_processes(sid) == []
    assert "stdout='ok\\n'" in strict.run_command("sh -c 'echo ok'", sid)  # forking works again


def test_memory_bombs_raise_memory_error(strict: Sandboxes) -> None:
    sid = new_id(strict)
    assert "name='MemoryError'" in strict.run_python("x = bytearray(8 * 1024**3)", sid)
    assert "name='MemoryError'" in strict.run_python("a = []\nwhile True: a.append(bytearray(10**7))", sid)
    assert "Result(3)" in strict.run_python("del a\n1 + 2", sid)


def test_a_cpu_signal_the_cell_did_not_earn_is_ignored(sandboxes: Sandboxes) -> None:
    # The kernel counts CPU time by ticks and a signal can reach Python after the cell that earned it;
    # neither a stray SIGXCPU between calls nor one early in a cell may end a cell or the worker.
    sid = new_id(sandboxes)
    sandboxes.run_python("kept = 5", sid)
    worker = sandboxes.backend._box(sid).channel.pid
    os.kill(worker, signal.SIGXCPU)
    time.sleep(0.2)
    assert "Result(5)" in sandboxes.run_python("kept", sid)
    threading.Timer(0.3, os.kill, (worker, signal.SIGXCPU)).start()
    assert "Result(5)" in sandboxes.run_python("import time\ntime.sleep(1)\nkept", sid)


def test_cpu_time_is_limited_per_call(tmp_path: Path) -> None:
    boxes = Sandboxes(make_config(tmp_path, cpu_seconds=1, timeout_s=5.0))
    try:
        sid = new_id(boxes)
        boxes.run_python("kept = 5", sid)
        assert "Error: ExecutionError(name='TimeoutError', value='CPU time limit for this call exceeded'" in \
            boxes.run_python("while True: pass", sid)
        assert "Result(5)" in boxes.run_python("kept", sid)  # a CPU limit, unlike a timeout, keeps the state
        with pytest.raises(SandboxError, match=re.escape("code -1 (signal: SIGXCPU)")):
            boxes.run_command("while :; do :; done", sid)
    finally:
        boxes.close()


def test_huge_output_is_capped(strict: Sandboxes) -> None:
    sid = new_id(strict)
    for text in (strict.run_python("print('x' * 1_000_000)", sid),
                 strict.run_python("for i in range(200_000): print(i)", sid),
                 strict.run_command("yes | head -c 50000000", sid)):
        assert len(text) == 5_000 + len(TRUNCATED) and text.endswith(TRUNCATED)
    with pytest.raises(SandboxError, match="Command timed out after 2 s.*Output so far"):
        strict.run_command("yes", sid)
    assert "Result(1)" in strict.run_python("1", sid)


def test_writes_are_held_to_the_file_size_limit_and_the_sandbox_folder(strict: Sandboxes) -> None:
    sid = new_id(strict)
    assert "File too large" in strict.run_python("open('big', 'wb').write(b'0' * 2_000_000)", sid)
    with pytest.raises(SandboxError, match="File size limit exceeded"):
        strict.run_command("head -c 2000000 /dev/zero > big2", sid)
    if not strict.backend.isolation.own_uid:
        pytest.skip("no uid of its own: the OS lets the code write wherever the server's user can")
    # the sandbox root above its folder and the repository both belong to root (and in a jail the
    # repository is not there at all)
    for target in ("../escape.txt", "/home/user/../escape.txt", str(Path(__file__).with_name("escape.txt"))):
        assert re.search("PermissionError|FileNotFoundError", strict.run_python(f"open({target!r}, 'w')", sid)), target
    assert not Path(__file__).with_name("escape.txt").exists()
    assert "ValueError" in strict.run_python(
        "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)", sid)


def test_network_is_off_exactly_when_the_probe_says_so(strict: Sandboxes) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        sid = new_id(strict)
        text = strict.run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                                 "'connected'", sid)
    assert ("Result('connected')" not in text) == strict.backend.isolation.network_off
    if strict.backend.isolation.network_off:  # a jail has a loopback of its own, where nothing listens
        assert re.search("Network is unreachable|Connection refused", text)


def test_code_cannot_signal_the_server(strict: Sandboxes) -> None:
    isolation = strict.backend.isolation
    if not (isolation.own_uid or isolation.own_pids):
        pytest.skip("neither a uid nor a pid namespace of its own: the code could kill this test")
    sid = new_id(strict)
    text = strict.run_python(f"import os\nos.kill({os.getpid()}, 9)", sid)
    assert "name='PermissionError'" in text or "name='ProcessLookupError'" in text
    strict.run_python("import os, signal\nos.kill(-1, signal.SIGKILL)", sid)  # everything it may signal
    assert "Result(1)" in strict.run_python("1", sid)


def test_children_do_not_outlive_the_call(tmp_path: Path) -> None:
    # A timeout far past what a call takes on a busy machine: a call that waited for the children (whose
    # `sleep 600` holds the output pipes open) would run until it, and still answer.
    boxes = Sandboxes(make_config(tmp_path, timeout_s=120.0))
    try:
        # Processes that start a session of their own are only found when the sandbox has its own uid.
        new_session = boxes.backend.isolation.own_uid
        sid = new_id(boxes)
        text = boxes.run_python("import subprocess\n"
                                f"p = subprocess.Popen(['sleep', '600'], start_new_session={new_session})\np.pid", sid)
        assert "Result(" in text and boxes.backend.leftover_processes(sid) == []
        started = time.monotonic()
        assert "stdout='started\\n'" in boxes.run_command(f"{'setsid ' * new_session}sleep 600 & echo started", sid)
        assert time.monotonic() - started < 60  # answered when the shell exited, not at the 120 s timeout
        assert boxes.backend.leftover_processes(sid) == []
    finally:
        boxes.close()


# --- files in and out --------------------------------------------------------------------------


def test_upload_and_download_stay_inside_their_folders(sandboxes: Sandboxes, tmp_path: Path) -> None:
    config = sandboxes.config
    config.upload_dirs[0].mkdir(exist_ok=True)
    source = config.upload_dirs[0] / "data.csv"
    source.write_text("a,b\n1,2\n")
    sid = new_id(sandboxes)
    assert sandboxes.upload(sid, str(source)) == "File uploaded to /home/user/data.csv"
    assert sandboxes.upload(sid, str(source), "/home/user/in/") == "File uploaded to /home/user/in/data.csv"
    assert "Result('a,b" in sandboxes.run_python("open('/home/user/in/data.csv').read()", sid)
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (config.upload_dirs[0] / "link.txt").unlink(missing_ok=True)
    (config.upload_dirs[0] / "link.txt").symlink_to(outside)
    for bad in (str(outside), str(config.upload_dirs[0] / "link.txt"), str(config.upload_dirs[0] / ".." / "x")):
        with pytest.raises(SandboxError, match="cannot be uploaded"):
            sandboxes.upload(sid, bad)
    for bad in ("/etc/data.csv", "/home/user/../../data.csv", "../data.csv"):
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sandboxes.upload(sid, str(source), bad)

    sandboxes.run_python("open('out.txt', 'w').write('result')\nimport os\nos.symlink('/etc/passwd', 'pw')\n"
                         "os.makedirs('d')\nos.symlink('/etc', 'd/etc')", sid)
    saved = sandboxes.download_to_local(sid, "/home/user/out.txt")
    assert saved == f"File downloaded successfully to: {os.path.realpath(config.download_dir)}/out.txt"
    assert (config.download_dir / "out.txt").read_text() == "result"
    with pytest.raises(SandboxError, match="not a file name inside the download folder"):
        sandboxes.download_to_local(sid, "/home/user/out.txt", "../../escaped.txt")
    with pytest.raises(SandboxError, match="Cannot read"):
        sandboxes.download_to_local(sid, "/home/user/pw")
    with pytest.raises(SandboxError, match="symbolic links are not followed"):
        sandboxes.download_to_local(sid, "/home/user/d/etc/passwd")
    with pytest.raises(SandboxError, match="outside the sandbox"):
        sandboxes.download_to_local(sid, "/etc/passwd")
    with pytest.raises(SandboxError, match="symbolic links are not followed"):
        sandboxes.upload(sid, str(source), "/home/user/d/etc/")


class FileHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/files/report%20v2.txt")
            self.end_headers()
            return
        body = b"x" * 3_000_000 if self.path == "/big.bin" else b"report body"
        self.send_response(200 if self.path.startswith(("/files/", "/big")) else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FileHandler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_from_the_internet(sandboxes: Sandboxes, file_server: str) -> None:
    local = Sandboxes(replace(sandboxes.config, allow_local_urls=True, max_download_mb=1), backend=sandboxes.backend)
    sid = new_id(local)
    assert local.download_url(sid, f"{file_server}/moved") == "File downloaded to /home/user/report v2.txt"
    assert local.download_url(sid, f"{file_server}/files/a.txt", "/home/user/b.txt") == \
        "File downloaded to /home/user/b.txt"
    assert "stdout='report body'" in local.run_command("cat b.txt", sid)
    with pytest.raises(SandboxError, match="larger than 1 MB"):
        local.download_url(sid, f"{file_server}/big.bin")
    with pytest.raises(SandboxError, match="HTTP 404"):
        local.download_url(sid, f"{file_server}/nothing")
    with pytest.raises(SandboxError, match="Only http and https"):
        local.download_url(sid, "file:///etc/passwd")
    sid = new_id(sandboxes)
    with pytest.raises(SandboxError, match="local or private address"):
        sandboxes.download_url(sid, f"{file_server}/files/a.txt")


# --- E2B ---------------------------------------------------------------------------------------


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
    def connect(cls, sandbox_id: str, timeout: int | None = None, logger: object = None, *,
                on_resume: str = "restore", **opts: object) -> FakeE2BSandbox:
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
            return Execution(results=[Result(text=repr(eval(code, self.namespace)), is_main_result=True)],
                             logs=Logs(stdout=[], stderr=[]))
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
    assert boxes.run_python("6 * 7", "e2b0") == \
        "Execution(Results: [Result(42)], Logs: Logs(stdout: [], stderr: []), Error: None)"
    assert "ExecutionError(name='ZeroDivisionError'" in boxes.run_python("1/0", "e2b0")
    assert boxes.run_command("echo hi", "e2b0") == "CommandResult(stderr='', stdout='hi\\n', exit_code=0, error=None)"
    with pytest.raises(SandboxError) as failed:
        boxes.run_command("false", "e2b0")
    assert str(failed.value).endswith("CommandExitException\nDetails: " + str(
        CommandExitException(stderr="no such thing\n", stdout="", exit_code=1, error="exit status 1")))
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
    assert boxes.run_command("echo again", "e2b0") == \
        "CommandResult(stderr='', stdout='again\\n', exit_code=0, error=None)"
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
