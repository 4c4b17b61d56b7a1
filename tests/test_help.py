"""Help that fits a screen, as a user reads it: `nanbeige COMMAND --help` at 80 columns shows the main
options and says where the rest are, `--help-all` shows every option, each command shows its own
defaults, and an option left out of the short page still works from the command line and from
`nanbeige.toml`. Real processes; words are checked, not punctuation (typer versions draw help differently)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from nanbeige.agent.cli import settings_file
from nanbeige.agent.cli.help_screen import MAIN_OPTIONS
from nanbeige.agent.cli.program import app

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
MAIN_COMMANDS = ("ask", "research", "eval", "collect", "judge", "train", "loop", "serve")
SCREEN_LINES = 60
BOX = str.maketrans("", "", "│╭╮╰╯─…")


def nanbeige(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns), **(env or {})},
    )


def words(text: str) -> str:
    """The page's words in one line: no box drawing, no line breaks, no escapes of brackets."""
    return " ".join(text.translate(BOX).replace("\\[", "[").split())


def rows(text: str) -> set[str]:
    """The options the page has a row for: the name a row starts with (not one a help text wraps onto a line),
    in the boxed page or, below 110 columns, the plain one (`  -G, --group-size INTEGER`)."""
    found = re.findall(r"^│[ *]{1,6}(-[\w-]+)", text, re.MULTILINE)
    found += re.findall(r"^│ +(-\w) ", text, re.MULTILINE)  # an option with only a short name: -k
    found += re.findall(r"^  (?:-\w+, )?(--?[\w-]+)", text, re.MULTILINE)
    return set(found)


def row(page: str, name: str) -> str:
    """The words of the option's row: its line, and the lines its help text wraps onto."""
    found: list[str] = []
    for line in page.splitlines():
        starts = re.match(r"^│[ *]{1,6}(-[\w-]+)", line)
        if found and (starts or not line.startswith("│")):
            break
        if found or (starts and starts.group(1) == name):
            found.append(line)
    return words("\n".join(found))


def command(*path: str) -> Any:
    found = typer.main.get_command(app)
    for name in path:
        found = found.commands[name]  # type: ignore[attr-defined]
    return found


def long_name(param: Any) -> str:
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])


def options(*path: str) -> list[Any]:
    return [param for param in command(*path).params if param.param_type_name == "option"]


@pytest.mark.parametrize("name", MAIN_COMMANDS)
def test_a_main_commands_help_fits_a_screen_and_says_where_the_rest_are(name: str) -> None:
    result = nanbeige(name, "--help")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) <= SCREEN_LINES, result.stdout
    text = words(result.stdout)
    assert f"nanbeige {name} --help-all shows all {len(options(name))}" in text
    assert "docs/configuration.md" in text
    shown = {param.name for param in options(name) if long_name(param) in rows(result.stdout)}
    assert shown == set(MAIN_OPTIONS[name]), "the page shows its main options, and only those"
    assert len(MAIN_OPTIONS[name]) <= 15


@pytest.mark.parametrize("name", MAIN_COMMANDS)
def test_help_all_shows_every_option(name: str) -> None:
    result = nanbeige(name, "--help-all", columns=300)  # wide: long option names are not cut short
    assert result.returncode == 0, result.stderr
    text = words(result.stdout)
    missing = [long_name(param) for param in options(name) if long_name(param) not in rows(result.stdout)]
    assert missing == []
    assert {"--help", "--help-all"} <= rows(result.stdout) and "docs/configuration.md" in text
    assert "These are the main options" not in text


def every_command_path(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    for name, sub in getattr(group, "commands", {}).items():
        paths += every_command_path(sub, (*path, name))
    return paths


def test_every_command_and_group_takes_help_all_and_names_values_in_words() -> None:
    """The README promises --help-all on every command: where --help shows every option already, it shows the
    same page. A value's placeholder is a word (`TEXT`, `INTEGER`, `PATH…` for one given more than once), never
    a Python type (`<str>`, `<list[Path]>`); choices list their values."""
    python_types = re.compile(r"<(str|int|float|path|bool|list\[[^]]*\])( range)?>")
    for path in every_command_path(typer.main.get_command(app)):
        result = nanbeige(*path, "--help-all", columns=200)
        assert result.returncode == 0, (path, result.stderr)
        assert {"--help", "--help-all"} <= rows(result.stdout), path
        assert not python_types.search(result.stdout), (path, python_types.findall(result.stdout))
        if not (len(path) == 1 and path[0] in MAIN_OPTIONS):
            assert result.stdout == nanbeige(*path, "--help", columns=200).stdout, path
        elif path == ("collect",):
            assert {"TEXT", "INTEGER", "NUMBER", "PATH", "TEXT…"} <= set(result.stdout.split())


def test_at_80_columns_every_option_name_is_whole_and_the_help_wraps_beside_it() -> None:
    """typer's boxed table cut names at 80 columns (`--repetition-pen…`: 15 in collect); below 110 columns the
    page is click's plain one, each name whole at the start of its row."""
    for name in MAIN_COMMANDS:
        page = nanbeige(name, "--help-all", columns=80).stdout
        cut = [long_name(param) for param in options(name) if long_name(param) not in rows(page)]
        assert cut == [] and "…" not in page.replace("TEXT…", "").replace("PATH…", ""), (name, cut)
        assert max(len(line) for line in page.splitlines()) <= 80, name


def test_no_flag_shows_a_value_placeholder() -> None:
    """A flag takes no value, so its row shows none (typer 0.2x drew `<bool>` there, as if it took one). Every
    page with a flag of the command's own, and two whose only flag is --help."""
    paths = [
        path
        for path in every_command_path(typer.main.get_command(app))
        if any(getattr(param, "is_flag", False) for param in command(*path).params)
    ]
    for path in [*paths, ("doctor",), ("index", "build")]:
        page = "--help-all" if len(path) == 1 and path[0] in MAIN_OPTIONS else "--help"
        result = nanbeige(*path, page, columns=120)
        assert result.returncode == 0, (path, result.stderr)
        assert "<bool>" not in result.stdout and "BOOLEAN" not in result.stdout, (path, result.stdout)
        assert "--help" in rows(result.stdout), path


def test_collect_shows_its_own_sampling_defaults_the_ones_it_runs_with() -> None:
    """collect shares the run flags with ask but samples on-policy: no top-p cut, no penalty."""
    from nanbeige.agent.cli.options import run_settings
    from nanbeige.trainer.collect import on_policy

    page = nanbeige("collect", "--help-all", columns=200).stdout
    top_p, penalty = row(page, "--top-p"), row(page, "--repetition-penalty")
    assert "default: 1.0 (off)" in top_p and "0.95" not in top_p
    assert "default: 1.0 (off)" in penalty and "1.05" not in penalty
    settings = run_settings(
        {
            name: None
            for name in (
                "base_url",
                "api_key",
                "max_turns",
                "max_context",
                "temperature",
                "top_p",
                "repetition_penalty",
                "mcp",
                "timeout",
                "gguf_file",
                "chat_template",
                "summary_turn",
                "rollback",
                "system_prompt_file",
            )
        }
        | {
            "backend": "auto",
            "model": "m",
            "dialect": "mcp-xml",
            "keep_tool_results": 5,
            "max_tokens": 100,
            "no_default_servers": True,
            "tool_timeout": 60,
            "max_result_chars": 1000,
            "token_mode": False,
        }
    )
    sampled = on_policy(settings, lambda _: None).llm
    assert (sampled.top_p, sampled.repetition_penalty) == (1.0, 1.0)
    # ask answers questions with the dialect's settings, and says so
    page = nanbeige("ask", "--help-all", columns=200).stdout
    assert "default: 0.95" in row(page, "--top-p") and "1.05 for mcp-xml" in row(page, "--repetition-penalty")


def test_eval_judge_and_train_show_the_defaults_they_run_with() -> None:
    from nanbeige.evals import bfcl
    from nanbeige.evals.judges import JUDGE_ENDPOINT
    from nanbeige.trainer.critic import CRITIC_ENDPOINT

    page = nanbeige("eval", "--help-all", columns=200).stdout
    assert f"{bfcl.TEMPERATURE} for bfcl" in row(page, "--temperature")
    page = nanbeige("judge", "--help-all", columns=200).stdout
    assert f"{JUDGE_ENDPOINT.timeout_s:g} for the judge, {CRITIC_ENDPOINT.timeout_s:g} for the critic" in row(
        page, "--request-timeout"
    )
    assert f"{JUDGE_ENDPOINT.retries} for the judge, {CRITIC_ENDPOINT.retries} for the critic" in row(page, "--retries")
    for name in ("judge", "train", "loop"):  # the loop judges with the same critic
        page = nanbeige(name, "--help-all", columns=200).stdout
        assert f"default: {CRITIC_ENDPOINT.model}" in row(page, "--critic-model"), name
        assert f"default: {CRITIC_ENDPOINT.base_url}" in row(page, "--critic-base-url"), name


def test_an_option_left_out_of_the_short_page_works_from_the_command_line() -> None:
    assert "replay" not in MAIN_OPTIONS["ask"]
    result = nanbeige("ask", "q", "--replay")  # refused before anything starts: it was read, and meant
    assert result.returncode == 2 and "--replay needs --cache" in words(result.stderr)
    assert "top_p" not in MAIN_OPTIONS["collect"]
    result = nanbeige("collect", "--questions", "/nonexistent/questions.jsonl", "--top-p", "0.5")
    assert result.returncode == 2 and "no such file" in words(result.stderr)
    assert "No such option" not in result.stderr


def test_an_option_left_out_of_the_short_page_is_read_from_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("[ask]\nreplay = true\n")
    result = nanbeige("ask", "q", env={"NANBEIGE_CONFIG": str(path)})
    assert result.returncode == 2 and "--replay needs --cache" in words(result.stderr)
    path.write_text("help_all = true\n")  # --help-all is no setting: it would print the help on every run
    result = nanbeige("ask", "q", env={"NANBEIGE_CONFIG": str(path)})
    assert result.returncode == 2 and "no command has the setting 'help_all'" in words(result.stderr)


def test_the_settings_file_takes_every_option_the_short_page_leaves_out() -> None:
    for name in (*MAIN_COMMANDS, "resume"):
        keys = settings_file._option_names(command(name))
        assert {param.name for param in options(name)} <= set(keys.values())
        assert {param.name for param in options(name)} - set(MAIN_OPTIONS[name]) <= set(keys)
        assert "help_all" not in keys
