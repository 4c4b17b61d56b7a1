"""The local sandbox's budgets where the kernel cannot hold them (no cgroup this server may make, no
file system of its own: a user's machine without root or delegation): a watch sums the sandbox's
memory and disk four times a second and stops its processes past the budget. Here the server is
made to believe it has neither, and real hostile code runs against the watch."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import JAIL

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes
from nanbeige.tools.sandbox import local as local_backend


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandboxes]:
    monkeypatch.setattr(local_backend, "cgroup_parents", lambda: None)
    monkeypatch.setattr(local_backend, "can_make_disks", lambda: False)
    # a timeout far past what a call takes on a busy machine, so that only the watch stops what it should
    boxes = Sandboxes(
        SandboxConfig(
            root=tmp_path / "sandboxes", upload_dirs=[tmp_path], timeout_s=120.0, jail=JAIL, memory_mb=512, disk_mb=64
        )
    )
    assert boxes.backend.isolation and boxes.backend._cgroups is None and not boxes.backend._disks
    yield boxes
    boxes.close()


def new_id(boxes: Sandboxes) -> str:
    return re.search(r"sandbox_id: ([0-9a-f]+)", boxes.create())[1]  # type: ignore[index]


def test_the_server_says_which_budgets_only_a_watch_holds(watched: Sandboxes, caplog: pytest.LogCaptureFixture) -> None:
    assert any("memory is held by a watch" in line for line in watched.backend._watched())
    assert any("disk use is held by a watch" in line for line in watched.backend._watched())


def test_processes_that_together_pass_the_memory_budget_are_stopped(watched: Sandboxes) -> None:
    """Four processes of 200 MB each stay under the per-process address-space limit (512 MB) but
    not under the sandbox's 512 MB together."""
    sid = new_id(watched)
    started = time.monotonic()
    with pytest.raises(SandboxError) as stopped:
        watched.run_command(
            'for i in 1 2 3 4; do python3 -c \'b = b"1" * (200 * 1024 * 1024); import time; '
            "time.sleep(600)' & done; wait; exit 3",
            sid,
        )
    assert time.monotonic() - started < 60  # the watch, not the 600 s sleep or the 120 s timeout
    assert "ran out of memory (its processes together may use 512 MB)" in str(stopped.value)
    assert "Result(2)" in watched.run_python("1 + 1", sid)  # the sandbox goes on


def test_a_cell_that_grows_past_the_disk_budget_is_stopped_and_says_why(watched: Sandboxes) -> None:
    sid = new_id(watched)
    watched.run_python("kept = 1", sid)
    with pytest.raises(SandboxError, match="files took more than its 64 MB of disk.*delete files"):
        watched.run_python(
            "import time\nwith open('big', 'wb') as f:\n    for _ in range(90):\n"
            "        f.write(b'0' * 1024 * 1024)\n        f.flush()\n        time.sleep(0.02)\n"
            "time.sleep(20)",
            sid,
        )
    # deleting the files is possible and lets the sandbox go on
    watched.run_command("rm -f big", sid)
    assert "Result(2)" in watched.run_python("1 + 1", sid)
