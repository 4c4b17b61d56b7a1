"""The shell blocks of the README and the docs run as written. A block that cannot run on this machine (it needs
the network, a GPU, a model server, a key, the model's weights, your own files) says so just above its fence,
`<!-- needs: ... -->`, which the page does not show; every other block is run here, in an empty folder,
offline, line by line as a person pastes it, and must end well. `tests/test_docs_commands.py` checks every
command of every block against the command line; this file runs the ones that can run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SHELL = {"", "bash", "sh", "shell", "console"}
NEEDS = re.compile(r"^\s*<!-- needs: (\S.*?) -->\s*$")
FENCE = re.compile(r"^\s*```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced shell block of a page."""

    where: str
    """The page and the fence's line: docs/index.md:75."""
    text: str
    """What is between the fences."""
    needs: str | None
    """What it needs that this machine does not have, as the comment above its fence says; None: it runs here."""


def shell_blocks(path: Path) -> list[Block]:
    lines, found, number = path.read_text().splitlines(), [], 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        end = next((i for i in range(number + 1, len(lines)) if FENCE.match(lines[i])), len(lines))
        if opening.group(1) in SHELL:
            above = NEEDS.match(lines[number - 1]) if number else None
            where = f"{path.relative_to(ROOT)}:{number + 1}"
            found.append(Block(where, "\n".join(lines[number + 1 : end]), above and above.group(1)))
        number = end + 1
    return found


BLOCKS = [block for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] for block in shell_blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.needs is None]


def test_every_block_either_runs_here_or_says_what_it_needs() -> None:
    """The reasons are a reader's: what to have before pasting the block."""
    assert len(BLOCKS) >= 30 and len(RUNNABLE) >= 2  # the pages were read: a parse that found nothing fails
    for block in BLOCKS:
        assert block.needs is None or len(block.needs.split()) >= 2, block.where
    # a marker inside a block is shown to the reader and marks nothing
    assert [block.where for block in BLOCKS if "<!-- needs:" in block.text] == []


# The first session's block trains the small model twice (train, then loop): about 3 minutes on two idle cores,
# and several times that beside the rest of the suite.
BLOCK_TIMEOUT_S = 1140


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_the_block_runs_as_written_offline_in_an_empty_folder(block: Block, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("NANBEIGE_")}
    # offline as a newcomer's laptop on a train; the commands the block names are this environment's
    env |= {"HF_HUB_OFFLINE": "1", "NANBEIGE_RUNS_DIR": str(tmp_path / "runs")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    try:
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired as late:  # which command was slow is what a reader of the failure needs
        stderr = (late.stderr or b"").decode(errors="replace") if isinstance(late.stderr, bytes) else late.stderr
        pytest.fail(f"{block.where} ran over {BLOCK_TIMEOUT_S} s; its stderr ends:\n{(stderr or '')[-3000:]}")
    assert result.returncode == 0, f"{block.where}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr and "\nerror:" not in "\n" + result.stderr, result.stderr[-3000:]
