"""The first-hour benchmark (tests/benchmarks/first_hour.py) measures what it says: the README's own
quick start, commands the CLI takes, and each command's real exit code and wall time in a terminal."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

import first_hour  # noqa: E402
from test_docs_commands import problem  # noqa: E402


def test_the_quick_start_is_read_from_the_readme_as_two_commands() -> None:
    install, tests = first_hour.quick_start((ROOT / "README.md").read_text())
    assert install.startswith("python3 -m venv .venv") and "pip install -e" in install
    assert "nanbeige ask" in install
    assert tests.startswith("pytest")


def test_the_first_commands_are_ones_the_cli_takes() -> None:
    for command in first_hour.FIRST_COMMANDS:
        args = command.split(" ", 1)[1] if " " in command else ""
        assert problem(shlex.split(args)) is None, command


def test_a_command_in_the_terminal_has_its_exit_code_time_and_last_line(tmp_path: Path) -> None:
    step = first_hour.run_in_terminal(
        "sleep 0.3; echo one; echo last words; exit 3",
        tmp_path,
        {},
        30,
        tmp_path / "screen.txt",
        unset=("HOME_NOT_SET",),
    )
    assert step.exit_code == 3
    assert step.last_line == "last words"
    assert 0.3 <= step.seconds < 20
    assert "one" in (tmp_path / "screen.txt").read_text()


def test_a_command_past_its_limit_is_stopped_and_said_so(tmp_path: Path) -> None:
    step = first_hour.run_in_terminal("echo started; sleep 60", tmp_path, {}, 1, tmp_path / "screen.txt")
    assert step.exit_code is None
    assert step.seconds < 15
    assert "stopped" in first_hour.table([step])
