"""`nanbeige.toml`: settings that sit between the environment and the defaults.

Which files are read, key by key the later winning:
1. the user's own file, `$XDG_CONFIG_HOME/nanbeige/nanbeige.toml` (else `~/.config/nanbeige/nanbeige.toml`);
2. the file the user named (`nanbeige --config PATH ...` or `$NANBEIGE_CONFIG`), else the first `nanbeige.toml`
   in the working folder or a folder above it, but that one only once the user has trusted it (`trust.py`):
   a folder someone else made could otherwise run commands (`mcp`), read code (`reference`) or send the
   user's API key to a server of theirs (`base_url`).
Keys are flag names with underscores (`max_turns = 300`, `mcp = ["docs=http://127.0.0.1:9000/mcp"]`).
A key at the top applies to every command that has that flag; a table named after a command
(`[ask]`, `[serve]`, `[index.build]`) applies to that command alone and wins. Flags and environment
variables still come first: the settings become click's `default_map`, which click reads after both.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from nanbeige.agent.cli import trust
from nanbeige.agent.user_dirs import config_dir
from nanbeige.tools.errors import NanbeigeError

FILE_NAME = "nanbeige.toml"


class SettingsError(NanbeigeError):
    """The settings file cannot be read or names a setting no command has."""

    exit_code = 2  # a usage error, as a bad flag is


@dataclass
class Found:
    """The settings files this command reads, and those it leaves out with the reason."""

    used: list[tuple[Path, str]] = field(default_factory=list)
    """Each file read, first to last, with where it comes from ("your own", "named", "trusted")."""
    ignored: list[tuple[Path, str]] = field(default_factory=list)
    """Each file found and left out, with the line that says why and how to use it."""


def user_settings_path() -> Path:
    """The user's own settings file (it may not exist)."""
    return config_dir() / FILE_NAME


def folder_settings_path(start: Path | None = None) -> Path | None:
    """The first `nanbeige.toml` in the working folder or one above it, other than the user's own."""
    folder = (start or Path.cwd()).absolute()
    own = user_settings_path().absolute()
    for candidate in (folder / FILE_NAME, *(parent / FILE_NAME for parent in folder.parents)):
        if candidate.is_file() and candidate.absolute() != own:
            return candidate
    return None


def find(named: Path | None = None) -> Found:
    """Which settings files are in effect. `named` (`--config`), else `$NANBEIGE_CONFIG`, is the user's
    own choice; a file found in a folder is read only when trusted, unchanged since."""
    found = Found()
    own = user_settings_path()
    if own.is_file():
        found.used.append((own, "your own"))
    named = named or (Path(os.environ["NANBEIGE_CONFIG"]) if os.environ.get("NANBEIGE_CONFIG") else None)
    if named is not None:
        found.used.append((named, "named"))
        return found
    folder = folder_settings_path()
    if folder is None:
        return found
    verdict = trust.verdict(folder)
    if verdict == trust.TRUSTED:
        found.used.append((folder, "trusted"))
    else:
        shown = _shown(folder)
        why = "it has changed since you trusted it" if verdict == trust.CHANGED else "it is not trusted"
        found.ignored.append(
            (
                folder,
                f"ignoring the settings file {shown}: {why} (a folder's settings can run "
                f"commands and choose servers); `nanbeige trust {shown}` uses it",
            )
        )
    return found


def default_map(app: typer.Typer, found: Found | None = None) -> dict[str, Any] | None:
    """The settings in effect as click's `default_map` for the app's commands; None without a file."""
    found = find() if found is None else found
    if not found.used:
        return None
    data: dict[str, Any] = {}
    for path, _ in found.used:
        data = _merged(data, read(path))
    where = " and ".join(str(path) for path, _ in found.used)
    group = typer.main.get_command(app)
    shared = {_key(k): v for k, v in data.items() if not isinstance(v, dict)}
    mapped, used = _for_group(group, shared, data, where, "")
    unused = sorted(set(shared) - used)
    if unused:
        raise SettingsError(f"settings file {where}: no command has the setting {unused[0]!r}")
    return mapped


def read(path: Path) -> dict[str, Any]:
    """One settings file's TOML."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"cannot read the settings file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: tables merged key by key, any other value replaced."""
    merged = dict(base)
    for key, value in over.items():
        both_tables = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both_tables else value
    return merged


def _shown(path: Path) -> str:
    """The path as the user would type it from here."""
    return f"./{path.name}" if path.parent == Path.cwd().absolute() else str(path)


def _for_group(
    group: Any, shared: dict[str, Any], tables: dict[str, Any], path: str, prefix: str
) -> tuple[dict[str, Any], set[str]]:
    """The default map of each command in `group`, and which top-level keys some command took."""
    mapped: dict[str, Any] = {}
    used: set[str] = set()
    for name, command in group.commands.items():
        table = tables.get(name, {}) if isinstance(tables.get(name, {}), dict) else {}
        if hasattr(command, "commands"):  # a group: its table holds its own options and its commands' tables
            own = {k: v for k, v in table.items() if not isinstance(v, dict)}
            loose = sorted(set(map(_key, own)) - set(_option_names(command)))
            if loose:
                raise SettingsError(
                    f"settings file {path}: [{prefix}{name}] has no setting {loose[0]!r} (settings "
                    f"of its commands go in their tables, such as [{prefix}{name}."
                    f"{next(iter(command.commands))}])"
                )
            mapped[name], taken = _for_group(command, shared, table, path, f"{prefix}{name}.")
            mapped[name] |= _for_command(command, shared, own, path, f"{prefix}{name}", taken)
            used |= taken
            continue
        mapped[name] = _for_command(command, shared, table, path, f"{prefix}{name}", used)
    for name in tables:
        if isinstance(tables[name], dict) and name not in group.commands:
            raise SettingsError(f"settings file {path}: there is no command [{prefix}{name}]")
    return mapped, used


def _for_command(
    command: Any, shared: dict[str, Any], table: dict[str, Any], path: str, name: str, used: set[str]
) -> dict[str, Any]:
    """One command's default map from its table and the top-level settings it has; adds those to `used`."""
    params = _option_names(command)
    unknown = sorted(set(map(_key, table)) - set(params))
    if unknown:
        raise SettingsError(f"settings file {path}: [{name}] has no setting {unknown[0]!r}")
    taken = {k for k in shared if k in params}
    used |= taken
    several = {param.name for param in command.params if getattr(param, "multiple", False)}
    values = {params[k]: shared[k] for k in taken} | {params[_key(k)]: v for k, v in table.items()}
    # a flag given several times (`--base-url`) may be set to one value: click wants a list
    return {k: [v] if k in several and isinstance(v, str) else v for k, v in values.items()}


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
