"""Help that fits a screen. A main command's `--help` shows the options most runs need (`MAIN_OPTIONS`) and a
closing line saying where the rest are; `--help-all` shows every option. The options left out of the page work
as ever, from the command line, the environment and `nanbeige.toml`: only the help page leaves them out.
A command gets this by being registered with `cls=ShortHelpCommand` (a group: `ShortHelpGroup`)."""

from __future__ import annotations

import shutil
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

# The options each main command's --help shows, by parameter name: those its README examples and most runs use.
MAIN_OPTIONS: dict[str, tuple[str, ...]] = {
    "ask": (
        "question_file",
        "json_output",
        "trajectory",
        "base_url",
        "model",
        "api_key",
        "dialect",
        "max_turns",
        "mcp",
        "no_default_servers",
    ),
    "research": (
        "question_file",
        "report",
        "open_report",
        "attempts",
        "max_turns",
        "json_output",
        "base_url",
        "model",
        "api_key",
        "mcp",
    ),
    "resume": ("trajectory_id", "base_url", "api_key", "mcp", "json_output", "cache"),
    "eval": ("data", "k", "concurrency", "limit", "out_dir", "grader", "judge_api_key", "base_url", "model"),
    "collect": (
        "questions",
        "bench",
        "data",
        "group_size",
        "out",
        "concurrency",
        "limit",
        "token_mode",
        "base_url",
        "model",
        "backend",
        "mcp",
    ),
    "judge": (
        "out",
        "no_critic",
        "critic_base_url",
        "critic_model",
        "critic_api_key",
        "judge_base_url",
        "judge_model",
        "judge_api_key",
    ),
    "train": (
        "model",
        "out",
        "data",
        "objective",
        "steps",
        "lr",
        "lora_rank",
        "base_url",
    ),
    "loop": (
        "iterations",
        "questions",
        "problems",
        "group_size",
        "model",
        "out",
        "sync",
        "lora_rank",
        "base_url",
        "no_critic",
        "critic_base_url",
    ),
    "serve": ("model", "host", "port", "api_key", "dialect", "max_model_len", "rl_logprobs"),
}

CONFIGURATION_PAGE = "docs/configuration.md"
EVERY_OPTION = "nanbeige.every_option"
"""Set in the context's `meta` by --help-all: the page being written shows every option."""


def show_every_option(ctx: typer.Context, value: bool) -> None:
    """--help-all: the help page with every option, then exit (as click's own --help does)."""
    if value and not ctx.resilient_parsing:
        ctx.meta[EVERY_OPTION] = True
        typer.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def every_option_flag() -> Any:
    """The --help-all option, made by typer from a declaration as it makes any option, so that it is of the kind
    the installed typer parses and renders (typer 0.2x carries its own copy of click)."""

    def declared(
        every: Annotated[
            bool,
            typer.Option(
                "--help-all",
                is_eager=True,
                expose_value=False,
                callback=show_every_option,
                metavar="",
                help="Show every option and exit.",
            ),
        ] = False,
    ) -> None:
        """Only the option's declaration."""

    holder = typer.Typer()
    holder.command()(declared)
    return typer.main.get_command(holder).params[0]


def closing_line(ctx: Any, shown_all: bool, option_count: int) -> str:
    if shown_all:
        return f"{CONFIGURATION_PAGE} describes each setting and how to keep it in nanbeige.toml."
    return (
        f"These are the main options. {ctx.command_path} --help-all shows all {option_count}; "
        f"{CONFIGURATION_PAGE} describes each and how to keep it in nanbeige.toml."
    )


class ShortHelp:
    """A command whose --help page shows its `MAIN_OPTIONS` and whose --help-all page shows every option. Only
    the page changes: parsing, the settings file and the environment see every option all the time."""

    name: str
    params: list[Any]
    epilog: str | None
    _every_option: Any = None

    def get_params(self, ctx: Any) -> list[Any]:
        # beside --help, as click adds that one: not among `params`, so no settings-file key names it
        if self._every_option is None:
            self._every_option = every_option_flag()
        return [*super().get_params(ctx), self._every_option]  # type: ignore[misc]

    def page_epilog(self, shown_all: bool) -> str | None:
        """What the page ends with before the closing line (a command may say less on the short page)."""
        return self.epilog

    def format_help(self, ctx: Any, formatter: Any) -> None:
        shown_all = bool(ctx.meta.get(EVERY_OPTION))
        options = [param for param in self.params if param.param_type_name == "option" and not param.hidden]
        left_out = [] if shown_all else [param for param in options if param.name not in MAIN_OPTIONS[self.name]]
        epilog, closing = self.epilog, closing_line(ctx, shown_all, len(options))
        self.epilog = "\n\n".join(filter(None, [self.page_epilog(shown_all), closing]))
        for param in left_out:  # hidden for this page alone, and shown again after it
            param.hidden = True
        try:
            super().format_help(ctx, formatter)  # type: ignore[misc]
        finally:
            for param in left_out:
                param.hidden = False
            self.epilog = epilog


class ShortHelpCommand(ShortHelp, TyperCommand):
    pass


class ShortHelpGroup(ShortHelp, TyperGroup):
    pass


RICH_HELP_COLUMNS = 110
"""Narrower than this, the help is click's plain page: typer's boxed table cuts option names short there (at 80
columns `--repetition-pen…`), while the plain page keeps each name whole and wraps the help beside it."""


def dress_help(command: Any) -> None:
    """The look of the help of the command and of every command under it (`placeholders`, `help_all`,
    `plain_when_narrow`). Their pages are made when first asked for, so each gets its look then."""
    placeholders(command)
    help_all(command)
    plain_when_narrow(command)
    for subcommand in getattr(command, "commands", {}).values():
        dress_help(subcommand)


def plain_when_narrow(command: Any) -> None:
    """The command's help as click's plain page on a terminal narrower than `RICH_HELP_COLUMNS`."""
    boxed = command.format_help

    def format_help(ctx: Any, formatter: Any) -> None:
        columns = ctx.terminal_width or shutil.get_terminal_size((RICH_HELP_COLUMNS, 40)).columns
        if columns >= RICH_HELP_COLUMNS:
            return boxed(ctx, formatter)
        mode, command.rich_markup_mode = command.rich_markup_mode, None
        start = len(formatter.buffer)
        try:
            boxed(ctx, formatter)
        finally:
            command.rich_markup_mode = mode
        # the help texts escape a bracket for rich's markup (`\\[default: ...]`): plain text shows it as it is
        formatter.buffer[start:] = [text.replace("\\[", "[") for text in formatter.buffer[start:]]

    command.format_help = format_help


def help_all(command: Any) -> None:
    """--help-all on the command, as the README promises for every command and group: where every option is on
    the --help page already, it shows that page. Beside --help, as `ShortHelp` adds it: among no command's
    `params`, so no settings-file key names it."""
    if not isinstance(command, ShortHelp):
        flag, own_params = every_option_flag(), command.get_params
        command.get_params = lambda ctx: [*own_params(ctx), flag]


def placeholders(command: Any) -> None:
    """Where an option's value goes: nothing for a flag (typer 0.2x shows a flag's type, `<bool>`, as if it took
    a value; click uses no metavar for a flag anywhere else), and a word for the rest (`_placeholder_in_words`)."""
    for param in command.params:
        _no_placeholder(param)
        _placeholder_in_words(param)
    help_option = command.get_help_option
    command.get_help_option = lambda ctx: _no_placeholder(help_option(ctx))


def _no_placeholder(param: Any) -> Any:
    if (
        param is not None
        and getattr(param, "is_flag", False)
        and not getattr(param, "count", False)
        and param.metavar is None
    ):
        param.metavar = ""
    return param


WORDS = {
    "<str>": "TEXT",
    "<int>": "INTEGER",
    "<int range>": "INTEGER",
    "<float>": "NUMBER",
    "<float range>": "NUMBER",
    "<path>": "PATH",
    "<list[str]>": "TEXT…",
    "<list[Path]>": "PATH…",
}
"""The placeholder typer 0.2x shows for an option's value, a Python type (`<list[str]>`), and the word in its
place (`TEXT…`: the option may be given more than once). Choices keep their list of values."""


def _placeholder_in_words(param: Any) -> None:
    if param.metavar is not None or getattr(param, "is_flag", False) or not hasattr(param, "display_type"):
        return
    descriptor = getattr(param, "type_descriptor", None)
    word = None if descriptor is None or descriptor.is_choice else WORDS.get(param.display_type(None))
    if word is None:
        return
    if param.param_type_name == "argument":  # named in words in its row's first column: no type after it
        param.display_type_rich = lambda ctx: None
        word = word.removesuffix("…")  # typer adds its own "..." to an argument that takes many
    param.metavar = word
