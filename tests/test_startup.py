"""The first moments of a command, as a person meets them: stopped while it starts, asked its version."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (the kernel's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_sigterm_is_answered_before_the_command_line_code_is_even_imported(tmp_path: Path) -> None:
    # A hook the interpreter runs at start-up (sitecustomize) notes what SIGTERM would do at the moment
    # the program first imports its command-line library: the slow part of starting, where a SIGTERM
    # used to kill the process outright.
    (tmp_path / "sitecustomize.py").write_text(f"""
import signal, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            sys.meta_path.remove(self)
            handled = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            open({str(tmp_path / "seen")!r}, "w").write("handled" if handled else "default")
        return None
sys.meta_path.insert(0, Watch())
""")
    result = subprocess.run([NANBEIGE, "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "seen").read_text() == "handled"


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
def test_sigterm_at_any_moment_of_start_up_exits_143_with_the_trajectory_closed_or_never_made(
        tmp_path: Path, after_s: float) -> None:
    path = tmp_path / "t.jsonl"
    with socket.socket() as silent:  # takes connections, never answers: start-up waits on the model probe
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        process = subprocess.Popen([NANBEIGE, "ask", "q", "--base-url", url, "--trajectory", str(path)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # From the moment the program runs its own first line (before that the interpreter itself is
        # starting, and nothing but the kernel's default can answer a signal), at any moment after.
        deadline = time.monotonic() + 60
        while not catches_sigterm(process.pid) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(after_s)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    if path.exists():  # made before the signal came: closed, as an interrupted run
        assert json.loads(path.read_text().splitlines()[-1])["stop_reason"] == "interrupted"
