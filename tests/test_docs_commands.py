"""Every `nanbeige ...` command the README (and any docs/*.md) shows is one the CLI takes: its
subcommands exist, its options are the command's own, each option has its value, and it has as many
positional arguments as the command reads. The commands are parsed against the real command tree,
never run: nothing starts, nothing is read.

What counts as a shown command: each line of a shell code block (```bash, or a block without a
language; a diagram says ```text) and each inline code span, wherever `nanbeige` starts an
invocation in it (after `$(`, a pipe, `&&`, `torchrun ... --no-python`, environment assignments).
A bare `...` stands for arguments left out: what comes before it is checked in full, what comes after
it only for option names. An inline span such as `nanbeige resume` names a command in prose, so it
may leave out what the command requires; a code block's line is a whole command."""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from nanbeige.agent.cli.help_screen import MAIN_OPTIONS
from nanbeige.agent.cli.program import app

ROOT = Path(__file__).parent.parent
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
ELIDED = {"...", "…"}
OPERATORS = set("();<>|&")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_-]*$")  # COMMAND, where a subcommand's name would be


@dataclass(frozen=True)
class Shown:
    """One `nanbeige` invocation as a document shows it."""

    where: str
    """File and line: README.md:1330."""
    text: str
    """The line or span it was read from, as written."""
    args: tuple[str, ...]
    """What follows `nanbeige`."""
    whole: bool
    """A code block's command (it must have all it needs), not a mention in prose."""


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def shell_lines(text: str) -> list[tuple[int, str]]:
    """The lines of the shell code blocks, backslash-continued ones joined, each with its first line's number."""
    lines, language, pending, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            language = fence.group(1) if language is None else None
            continue
        if language not in SHELL_BLOCKS:
            continue
        start = start if pending else number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def inline_spans(text: str) -> list[tuple[int, str]]:
    """The inline code spans outside code blocks, each with its line's number (a span may wrap a line)."""
    prose, inside = [], False
    for line in text.splitlines():
        if re.match(r"\s*```", line):
            inside = not inside
            line = ""
        prose.append("" if inside else line)
    joined = "\n".join(prose)
    return [
        (joined.count("\n", 0, match.start()) + 1, match.group(1).replace("\n", " "))
        for match in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", joined)
    ]


def without_comment(line: str) -> str:
    """The line up to a shell comment: a `#` that starts a word, outside quotes (a URL's `#` is no comment)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def invocations(line: str) -> list[list[str]]:
    """The arguments of each `nanbeige` invocation in a shell line, one list each."""
    line = re.sub(r"([\"'])(\.\.\.|…)\1", r"\1TEXT\1", without_comment(line))  # "..." is some question
    line = re.sub(r"(?<=\s)\d+(?=[<>])", "", line)  # 2>&1: the descriptor is no argument
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: prose, not a command
        return []
    segments: list[list[str]] = [[]]
    redirected = False
    for token in tokens:
        if set(token) <= OPERATORS:
            redirected = token[0] in "<>"  # the command goes on after the redirect's file
            if not redirected:
                segments.append([])
        elif redirected:
            redirected = False
        else:
            segments[-1].append(token)
    found = []
    for segment in segments:
        starts = [i for i, token in enumerate(segment) if token == "nanbeige" or token.endswith("/nanbeige")]
        if starts and segment[starts[0] + 1 :]:  # a bare `nanbeige` (`--model nanbeige`) names no command
            found.append(segment[starts[0] + 1 :])
    return found


def shown_commands() -> list[Shown]:
    shown = []
    for path in documents():
        text, name = path.read_text(), path.relative_to(ROOT).as_posix()
        for whole, lines in ((True, shell_lines(text)), (False, inline_spans(text))):
            for number, line in lines:
                shown += [Shown(f"{name}:{number}", line.strip(), tuple(args), whole) for args in invocations(line)]
    return shown


def is_help(command: Any, name: str) -> bool:
    """--help, which every command has, or --help-all, which the main ones have: neither is among a command's
    params (so that no settings key names them)."""
    return name == "--help" or (name == "--help-all" and command.name in MAIN_OPTIONS)


def option_named(command: Any, name: str) -> Any:
    """The command's option that `name` (--flag, --no-flag, -k) is a spelling of, or None."""
    return next(
        (
            param
            for param in command.params
            if param.param_type_name == "option" and name in (*param.opts, *param.secondary_opts)
        ),
        None,
    )


def takes_value(option: Any) -> bool:
    return not (option.is_flag or option.count)


def read_option(command: Any, token: str, rest: list[str]) -> str | None:
    """Consume one option (and its value, from `rest`); what is wrong with it, or None."""
    name, equals, _ = token.partition("=") if token.startswith("--") else (token, "", "")
    option = option_named(command, name)
    if option is None and not token.startswith("--") and len(token) > 2:  # -G8: a short option and its value
        option, equals = option_named(command, token[:2]), "="
    if option is None:
        return None if is_help(command, name) else f"{command.name} has no option {name}"
    if not takes_value(option):
        return f"{name} takes no value" if equals else None
    if not equals:
        if len(rest) < option.nargs:
            return f"{name} needs a value"
        del rest[: option.nargs]
    return None


def argument_counts(command: Any) -> tuple[int, float]:
    """The fewest and most positional arguments the command reads."""
    arguments = [param for param in command.params if param.param_type_name == "argument"]
    fewest = sum(max(param.nargs, 1) for param in arguments if param.required)
    most = float("inf") if any(param.nargs < 0 for param in arguments) else sum(param.nargs for param in arguments)
    return fewest, most


def problem(args: list[str] | tuple[str, ...], whole: bool = True) -> str | None:
    """What the CLI would refuse in `nanbeige ARGS`, or None; parsed here, so that nothing runs (no
    callback: `--version` would exit, some options check their value against the file system)."""
    command, rest, elided = typer.main.get_command(app), list(args), False
    positionals: list[str] = []
    path = "nanbeige"
    while rest:
        token = rest.pop(0)
        if token == "--" and not elided:
            positionals += rest
            break
        if token.startswith("-") and token != "-":
            option = option_named(command, token.partition("=")[0])
            if is_help(command, token) or (option is not None and option.is_eager):
                whole = False  # it answers before anything else is needed: --version, --help
            wrong = read_option(command, token, rest)
            if wrong and wrong.endswith("needs a value") and not whole:
                return None  # prose names the option: `nanbeige serve --max-model-len` defaults to it
            if wrong and not (command.context_settings.get("ignore_unknown_options") and "no option" in wrong):
                return wrong.replace(f"{command.name} has", f"{path} has", 1)
            continue
        if token in ELIDED:
            elided = True
            if not getattr(command, "invoke_without_command", True):
                return None  # the subcommand itself is left out: nothing after it can be checked
            continue
        subcommands = getattr(command, "commands", None)
        if subcommands is not None and not elided:
            if PLACEHOLDER.match(token):
                return None  # COMMAND: any of them
            if token not in subcommands:
                return f"{path} has no command {token!r} (it has {', '.join(sorted(subcommands))})"
            command, path, positionals = subcommands[token], f"{path} {token}", []
            continue
        positionals.append(token)
    return None if elided else counted(command, path, positionals, whole)


def counted(command: Any, path: str, positionals: list[str], whole: bool) -> str | None:
    """What is wrong with the positional arguments, and with a code block's command left unfinished."""
    fewest, most = argument_counts(command)
    if len(positionals) > most and not command.context_settings.get("allow_extra_args"):
        return f"{path} takes at most {most} argument{'s' * (most != 1)}, given {len(positionals)}: {positionals}"
    if not whole:
        return None
    if getattr(command, "commands", None) and not getattr(command, "invoke_without_command", False):
        return f"{path} needs a command ({', '.join(sorted(command.commands))})"
    if len(positionals) < fewest:
        return f"{path} needs {fewest} argument{'s' * (fewest != 1)}, given {len(positionals)}"
    return None


SHOWN = shown_commands()


@pytest.mark.parametrize("shown", SHOWN, ids=[f"{s.where} nanbeige {' '.join(s.args)}"[:90] for s in SHOWN])
def test_a_command_the_docs_show_is_one_the_cli_takes(shown: Shown) -> None:
    wrong = problem(shown.args, shown.whole)
    assert wrong is None, f"{shown.where}: `{shown.text}`: {wrong}"


def test_the_docs_show_commands_of_every_kind() -> None:
    """The extraction finds them: code blocks, continued lines, inline spans, invocations inside others."""
    args = {shown.args[:2] for shown in SHOWN}
    assert len(SHOWN) >= 100
    assert {("ask", "-"), ("eval", "gaia"), ("train", "report"), ("trust", "--list")} <= args
    continued = [shown for shown in SHOWN if shown.args[:1] == ("collect",) and "--concurrency" in shown.args]
    assert any("--base-url" in shown.args for shown in continued)  # the part after the line's backslash
    assert any(shown.text.startswith("torchrun") for shown in SHOWN)


def test_the_checker_refuses_what_the_cli_refuses() -> None:
    assert problem(["eval", "--bench", "humaneval"]) == "nanbeige eval has no option --bench"
    assert problem(["eval", "humaneval", "--limit"]) == "--limit needs a value"
    assert problem(["ask", "--json=yes", "q"]) == "--json takes no value"
    assert problem(["show", "a.jsonl", "b.jsonl"]).startswith("nanbeige show takes at most 1 argument")
    assert problem(["resume"]) == "nanbeige resume needs 1 argument, given 0"
    assert problem(["index"]).startswith("nanbeige index needs a command")
    assert problem(["index", "find", "x"]).startswith("nanbeige index has no command 'find'")
    assert problem(["train", "...", "--bench", "x"]) == "nanbeige train has no option --bench"  # after `...` too


def test_the_checker_takes_what_the_cli_takes() -> None:
    assert problem(["eval", "humaneval", "-k", "1", "--limit=5"]) is None
    assert problem(["collect", "-G8", "--no-token-mode", "--out", "r.jsonl"]) is None
    assert problem(["serve", "--model", "m", "--", "--enforce-eager", "extra"]) is None  # vLLM's own arguments
    assert problem(["--config", "a.toml", "trust", "--list"]) is None
    assert problem(["--version"]) is None  # parsed only: its callback, which would print and exit, never runs
    assert problem(["--config", "PATH", "COMMAND", "..."]) is None
    assert problem(["resume"], whole=False) is None  # prose: `nanbeige resume` continues a run


# The commands the program itself suggests: its messages, hints and help name commands in backticks too.
SOURCES = ("agent", "evals", "trainer", "tools", "servers")


def source_texts(path: Path) -> list[tuple[int, str]]:
    """Each string literal of a module with its line; an f-string's fields read as X (`nanbeige trust X`)."""
    texts, nodes = [], list(ast.walk(ast.parse(path.read_text())))
    pieces = {id(part) for node in nodes if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in nodes:
        if id(node) in pieces:
            continue  # a piece of an f-string: read with the whole
        if isinstance(node, ast.JoinedStr):
            texts.append(
                (node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "X" for part in node.values))
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append((node.lineno, node.value))
    return texts


def suggested_commands() -> list[Shown]:
    suggested = []
    for path in sorted(path for folder in SOURCES for path in (ROOT / folder).rglob("*.py")):
        for line, text in source_texts(path):
            suggested += [
                Shown(f"{path.relative_to(ROOT).as_posix()}:{line}", span, tuple(args), False)
                for span in re.findall(r"`([^`]+)`", text)
                for args in invocations(span)
            ]
    return list({(shown.where, shown.args): shown for shown in suggested}.values())


SUGGESTED = suggested_commands()


@pytest.mark.parametrize("shown", SUGGESTED, ids=[f"{s.where} nanbeige {' '.join(s.args)}"[:90] for s in SUGGESTED])
def test_a_command_the_program_suggests_is_one_the_cli_takes(shown: Shown) -> None:
    wrong = problem(shown.args, shown.whole)
    assert wrong is None, f"{shown.where}: `{shown.text}`: {wrong}"


def test_the_program_suggests_commands_in_its_messages() -> None:
    assert len(SUGGESTED) >= 50
    assert any(shown.where.startswith("agent/cli/doctor.py") and shown.args[:1] == ("ask",) for shown in SUGGESTED)


def test_a_flag_doctor_suggests_on_its_own_is_one_doctor_takes() -> None:
    """A fix that names a bare flag (`pass --base-url`) reads as: run doctor again with it. A flag of
    another command belongs in a whole command in backticks (`nanbeige ask "..." --dialect tool-call`)."""
    doctor = typer.main.get_command(app).commands["doctor"]
    texts = [text for _, text in source_texts(ROOT / "agent/cli/doctor.py")]
    bare = {flag for text in texts for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", re.sub(r"`[^`]*`", "", text))}
    assert "--base-url" in bare
    assert {flag for flag in bare if option_named(doctor, flag) is None} == set()
