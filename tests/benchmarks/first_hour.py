"""Benchmark: a newcomer's first hour, measured. The repository is cloned into a fresh folder, and the
README's quick start and first commands run there one after another, each in a real pseudo-terminal
(the command's stdin, stdout and stderr are the terminal, as when a person types it), with a HOME of
its own (no caches, no settings, no earlier runs: what a new machine has). For each command: its wall
time, its exit code and the last line the screen showed; each screen is kept under the work folder's
`screens/`.

The quick start's two commands are read from the clone's README (the first code block under
"## Quick start"), so what runs is exactly what a person copies; the commands after the first one run
with its virtual environment active, as the person's shell has it.

    python tests/benchmarks/first_hour.py [--repo .] [--skip-tests] [--keep DIR] [--json FILE]

`--skip-tests` leaves out the quick start's second command (the test suite: about 25 minutes on two
cores); `--repo` is what to clone (a path or URL; default: this checkout's committed HEAD).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the terminal

from terminal import Terminal  # noqa: E402

# What a newcomer runs after the install, in the order the README shows them.
FIRST_COMMANDS = [
    "nanbeige --version",
    "nanbeige doctor",
    'nanbeige ask "What is the capital of France?" --model smollm2 --dialect tool-call --trajectory first.jsonl',
    "nanbeige show first.jsonl",
    "nanbeige ask --help",
]


@dataclass
class Step:
    """One command of the first hour, as it went."""

    command: str
    """The command line, as typed."""
    seconds: float
    """Wall time from start to exit."""
    exit_code: int | None
    """Its exit status; None when it was stopped at the time limit."""
    last_line: str
    """The last non-blank line its screen showed."""


def quick_start(readme: str) -> list[str]:
    """The commands of the first code block under "## Quick start", one per line."""
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```\w*\n(.*?)```", section, re.S)
    if block is None:
        raise SystemExit("the README has no code block under its quick start")
    return [line for line in block.group(1).splitlines() if line.strip()]


def run_in_terminal(
    command: str, folder: Path, env: dict[str, str], limit_s: float, screen_file: Path, unset: tuple[str, ...] = ()
) -> Step:
    """`command` run by bash in `folder` under a pseudo-terminal, the venv active when there is one,
    the variables in `unset` removed from its environment."""
    activate = ". .venv/bin/activate; " if (folder / ".venv" / "bin" / "activate").exists() else ""
    args = ["env", *(f"--unset={name}" for name in unset), "bash", "-c", activate + command]
    started = time.monotonic()
    with Terminal(args, env=env, cols=120, rows=40, cwd=str(folder)) as term:
        try:
            code: int | None = term.process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(term.process.pid, signal.SIGKILL)  # bash and what it started
            term.process.wait()
            code = None
        seconds = time.monotonic() - started
        term.reader.join(timeout=5)
        screen = term.screen_text()
    screen_file.write_text(screen + "\n")
    lines = [line.strip() for line in screen.splitlines() if line.strip()]
    return Step(command, round(seconds, 1), code, lines[-1][:160] if lines else "")


def first_hour(repo: str, work: Path, skip_tests: bool) -> list[Step]:
    clone = work / "nanbeige"
    subprocess.run(["git", "clone", "--quiet", repo, str(clone)], check=True)
    home = work / "home"
    home.mkdir()
    # A new user's environment: their own HOME, none of this machine's nanbeige or model settings.
    env = {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_STATE_HOME": str(home / ".local/state"),
    }
    unset = tuple(
        name
        for name in os.environ
        if name.startswith(("NANBEIGE_", "HF_", "VIRTUAL_ENV", "PIP_")) or name.endswith("_API_KEY")
    )
    install, *rest = quick_start((clone / "README.md").read_text())
    commands = [install, *FIRST_COMMANDS, *([] if skip_tests else rest)]
    screens = work / "screens"
    screens.mkdir()
    steps = []
    for number, command in enumerate(commands, 1):
        limit = 3600.0 if command.startswith("pytest") else 1800.0
        step = run_in_terminal(command, clone, env, limit, screens / f"{number:02d}.txt", unset)
        print(f"{step.seconds:8.1f} s  exit {step.exit_code}  {shorten(command)}", file=sys.stderr, flush=True)
        steps.append(step)
    return steps


def shorten(command: str, width: int = 90) -> str:
    return command if len(command) <= width else command[: width - 3] + "..."


def table(steps: list[Step]) -> str:
    rows = ["| command | wall time | exit |", "|---|---:|---:|"]
    for step in steps:
        shown = shorten(step.command).replace("|", "\\|")
        code = step.exit_code if step.exit_code is not None else "stopped"
        rows.append(f"| `{shown}` | {step.seconds:.1f} s | {code} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]), help="what to clone")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the quick start's test command")
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    parser.add_argument("--json", type=Path, help="also write the steps here as JSON")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        work = args.keep
    else:
        work = Path(tempfile.mkdtemp(prefix="first-hour-"))
    print(f"working in {work} (cloning {shlex.quote(args.repo)})", file=sys.stderr)
    steps = first_hour(args.repo, work, args.skip_tests)
    print(table(steps))
    if args.json:
        args.json.write_text(json.dumps([asdict(step) for step in steps], indent=2) + "\n")


if __name__ == "__main__":
    main()
