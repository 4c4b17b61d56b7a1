"""`nanbeige trust`: show every value a folder's settings file sets, ask, and only on yes put it on the
trust list (trust.py keeps the list)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from nanbeige.agent.cli.console import err, fail
from nanbeige.agent.cli.console import out as print_line

NO_ANSWER = "no answer, nothing trusted: run it where it can ask you, or pass --yes to trust what it shows unasked"


def trust_command(
    ctx: typer.Context,
    path: Annotated[
        Path | None,
        typer.Argument(
            help="The settings file (default: the nanbeige.toml found in this folder or above).", show_default=False
        ),
    ] = None,
    tree: Annotated[
        bool, typer.Option("--tree", help="Trust it in every folder below its own too (default: its own folder).")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Trust it without asking (for scripts); it is still shown.")
    ] = False,
    forget: Annotated[bool, typer.Option("--forget", help="Stop trusting the file.")] = False,
    show_list: Annotated[bool, typer.Option("--list", help="List the trusted files.")] = False,
) -> None:
    """Let a folder's nanbeige.toml take effect: its settings can run commands (mcp), read code (reference)
    and choose the server your API key goes to (base_url), so a folder's file is ignored until you trust it.
    Every value it sets is shown first, its paths and commands as they will be used (taken from its own
    folder), and you are asked before it is recorded (--yes: not asked). Trust is for the file itself, never
    a symbolic link, as it is now (a changed file needs trusting again), in its own folder; --tree trusts it
    in the folders below too. It covers the file, not the scripts its commands run: trust a folder whose
    scripts you have read."""
    from nanbeige.agent.cli import settings_file, trust

    try:
        if show_list:
            for name, known in sorted(trust.trusted().items()):
                now = settings_file.trust_on_list(Path(name), known)
                below = "  (and the folders below)" if known.tree else ""
                print_line(name + below + ("" if now else "  (changed or gone)"))
            return
        path = path or settings_file.folder_settings_path()
        if path is None:
            fail("no nanbeige.toml in this folder or above: name the file", 2)
        if forget:
            print_line(f"{'no longer trusted' if trust.forget(path) else 'was not trusted'}: {trust.place(path)}")
            return
        content = settings_file.read_bytes(path, follow=False)  # read once: what is shown is what is trusted
        paths = settings_file.path_settings(ctx.find_root().command)  # the settings of every command
        lines = settings_file.agreed(path, content, paths)  # it must be TOML before it is trusted
        print_line(f"{trust.place(path)} sets:" if lines else f"{trust.place(path)} sets nothing")
        for line in lines:
            print_line(f"  {line}")
        if not (yes or agrees()):
            err.print("nothing trusted", highlight=False)
            raise typer.Exit(1)
        sha = trust.trust(path, content, tree)
    except (settings_file.SettingsError, trust.TrustError, OSError) as exc:  # exit 1: the file is wrong, not a flag
        fail(str(exc))
    folder = Path(trust.place(path)).parent
    where = f"{folder} and every folder below it" if tree else f"{folder} alone"
    print_line(f"trusted {trust.place(path)} (sha256 {sha[:12]}) in {where}")


def agrees() -> bool:
    """The user's answer to "Trust it?", asked on stderr so that stdout stays what was shown; no by default.
    No answer at all (input closed, as in a script without --yes) fails with one line."""
    try:
        return click.confirm("Trust it?", default=False, err=True)
    except click.Abort:
        err.print()  # the question's line ends before the error's
        fail(NO_ANSWER)
