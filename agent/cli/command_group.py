"""The usage error for an option a command does not have, made to say where the option is. Left to
itself it only guesses a near spelling: eval given --bench got "Possible options: --backend", when
eval takes the benchmark as its argument and `collect` is the command with --bench."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

from nanbeige.agent.cli.help_screen import dress_help


class Commands(TyperGroup):
    """The program's command group: a command's own parsing runs inside the group's `invoke`, so a
    subcommand's unknown option passes here on its way to being printed. Made once every command is, so it
    is where every command's flags get their look in the help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        dress_help(self)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # NoSuchOption, recognised by what it carries (click's own class, or the copy newer typer ships)
            if hasattr(exc, "possibilities") and getattr(exc, "ctx", None) is not None:
                hint = where_it_is(exc.ctx, exc.option_name)
                if hint:
                    exc.message, exc.possibilities = f"No such option: {exc.option_name}; {hint}", None
            raise


def where_it_is(ctx: Any, name: str) -> str | None:
    """`eval takes BENCH as its argument: nanbeige eval BENCH; collect has --bench`, or None when the
    option is nowhere near (then the guess at a near spelling stays)."""
    command, parent = ctx.command, ctx.parent.command if ctx.parent is not None else None
    argument = next(
        (
            param
            for param in command.params
            if param.param_type_name == "argument" and param.name == name.lstrip("-").replace("-", "_")
        ),
        None,
    )
    siblings = [
        other
        for other in getattr(parent, "commands", {}).values()
        if other is not command
        and any(
            name in (*param.opts, *param.secondary_opts) for param in other.params if param.param_type_name == "option"
        )
    ]
    said = []
    if argument is not None:
        said.append(
            f"{command.name} takes {argument.name.upper()} as an argument, not an option: "
            f"`{ctx.command_path} {argument.name.upper()}`"
        )
    if siblings:
        names = sorted(other.name for other in siblings)
        said.append(f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} {name}")
    return "; ".join(said) or None
