"""`nanbeige.toml`: settings that sit between the environment and the defaults.

The file is `$NANBEIGE_CONFIG` if set, else `./nanbeige.toml`, else `~/.config/nanbeige/nanbeige.toml`.
Keys are flag names with underscores (`max_turns = 300`, `mcp = ["docs=http://127.0.0.1:9000/mcp"]`).
A key at the top applies to every command that has that flag; a table named after a command
(`[ask]`, `[serve]`, `[index.build]`) applies to that command alone and wins. Flags and environment
variables still come first: the file becomes click's `default_map`, which click reads after both.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import typer


class SettingsError(Exception):
    """The settings file cannot be read or names a setting no command has."""


# (typer carries its own copy of click, so its commands are told apart by what they have)


def settings_path() -> Path | None:
    named = os.environ.get("NANBEIGE_CONFIG")
    if named:
        return Path(named)
    for candidate in (Path("nanbeige.toml"), Path.home() / ".config" / "nanbeige" / "nanbeige.toml"):
        if candidate.is_file():
            return candidate
    return None


def default_map(app: typer.Typer) -> dict[str, Any] | None:
    """The file's settings as click's `default_map` for the app's commands; None without a file."""
    path = settings_path()
    if path is None:
        return None
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"cannot read the settings file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None
    group = typer.main.get_command(app)
    shared = {_key(k): v for k, v in data.items() if not isinstance(v, dict)}
    mapped, used = _for_group(group, shared, data, path, "")
    unused = sorted(set(shared) - used)
    if unused:
        raise SettingsError(f"settings file {path}: no command has the setting {unused[0]!r}")
    return mapped


def _for_group(group: Any, shared: dict[str, Any], tables: dict[str, Any], path: Path, prefix: str
               ) -> tuple[dict[str, Any], set[str]]:
    """The default map of each command in `group`, and which top-level keys some command took."""
    mapped: dict[str, Any] = {}
    used: set[str] = set()
    for name, command in group.commands.items():
        table = tables.get(name, {}) if isinstance(tables.get(name, {}), dict) else {}
        if hasattr(command, "commands"):  # a group of commands: its table holds only its commands' tables
            loose = sorted(k for k, v in table.items() if not isinstance(v, dict))
            if loose:
                raise SettingsError(f"settings file {path}: [{prefix}{name}] has no setting {loose[0]!r} (settings "
                                    f"go in the table of one of its commands, such as [{prefix}{name}."
                                    f"{next(iter(command.commands))}])")
            mapped[name], taken = _for_group(command, shared, table, path, f"{prefix}{name}.")
            used |= taken
            continue
        params = _option_names(command)
        unknown = sorted(set(map(_key, table)) - set(params))
        if unknown:
            raise SettingsError(f"settings file {path}: [{prefix}{name}] has no setting {unknown[0]!r}")
        taken = {k for k in shared if k in params}
        used |= taken
        mapped[name] = {params[k]: shared[k] for k in taken} | {params[_key(k)]: v for k, v in table.items()}
    for name in tables:
        if isinstance(tables[name], dict) and name not in group.commands:
            raise SettingsError(f"settings file {path}: there is no command [{prefix}{name}]")
    return mapped, used


def _option_names(command: Any) -> dict[str, str]:
    """Each name a setting may have (the parameter's, or its flag's without dashes) -> the parameter."""
    names = {}
    for param in command.params:
        if param.param_type_name == "option" and param.name:
            names[param.name] = param.name
            names.update({_key(flag.lstrip("-")): param.name for flag in param.opts if flag.startswith("--")})
    return names


def _key(name: str) -> str:
    return name.replace("-", "_")
