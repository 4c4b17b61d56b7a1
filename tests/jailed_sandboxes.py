"""What the jail tests share: sandboxes under the jail (a module's worth, as a fixture), and ways to run
hostile code in them and read what it got."""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import JAIL

from nanbeige.tools.sandbox import SandboxConfig, SandboxError, Sandboxes

MB = 1024 * 1024
JAILED = pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and JAIL), reason="needs root and a bwrap that works here"
)


def make_boxes(root: Path, **settings: object) -> Sandboxes:
    return Sandboxes(
        SandboxConfig(
            **{
                "root": root / "sandboxes",
                "upload_dirs": [root],
                "timeout_s": 15.0,
                "memory_mb": 512,
                "disk_mb": 64,
                **settings,
            }
        )
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    sandboxes = make_boxes(tmp_path_factory.mktemp("jail"))
    assert sandboxes.backend.isolation.jail is not None, "root with bwrap, yet no jail"
    yield sandboxes
    sandboxes.close()


def new_id(boxes: Sandboxes) -> str:
    return re.search(r"sandbox_id: ([0-9a-f]+)", boxes.create())[1]  # type: ignore[index]


def outcomes(boxes: Sandboxes, sid: str, setup: str, calls: str, describe: str = "e.strerror") -> dict[str, str]:
    """Runs each `(name, lambda)` of `calls` (the source of a tuple) in the sandbox after `setup`: per
    name, 'done', or the error as `describe` (an expression of `e`) tells it."""
    return value(
        boxes,
        sid,
        f"{setup}\nout = {{}}\nfor name, call in {calls}:\n    try:\n        call()\n"
        f"        out[name] = 'done'\n    except (OSError, ValueError) as e:\n"
        f"        out[name] = {describe}\nout",
    )


def value(boxes: Sandboxes, sid: str, code: str) -> Any:
    """The value of the cell's last expression (a Python literal), which must run without error."""
    text = boxes.run_python(code, sid)
    found = re.fullmatch(r"Execution\(Results: \[Result\((.*)\)\], Logs: .*, Error: None\)", text, re.S)
    assert found, text
    return ast.literal_eval(found[1])


# unshare(CLONE_NEWUSER) as the i386 system call 310: push rbx; mov eax, 310; mov ebx, 0x10000000;


def run_hostile(boxes: Sandboxes, sid: str, command: str) -> str:
    """A command expected to fail: the error text."""
    try:
        text = boxes.run_command(command, sid)
    except SandboxError as failed:
        return str(failed)
    pytest.fail(f"{command!r} was not refused: {text}")
