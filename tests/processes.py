"""Process trees from /proc, for tests of what outlives what."""

from __future__ import annotations

import os
import time
from pathlib import Path


def parents() -> dict[int, int]:
    """Every live process's parent."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                # another test's process may bear a name that is not UTF-8 (a byte 0xe9 was seen): a watcher
                # thread that raised on it would stop watching, and its test would see no process at all
                status = Path(f"/proc/{name}/status").read_bytes().decode(errors="replace")
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields["State"].split()[0] not in ("Z", "X"):
                found[int(name)] = int(fields["PPid"])
    return found


def tree(root: int) -> set[int]:
    """`root` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pids: set[int]) -> set[int]:
    return pids & set(parents())


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
