"""`nanbeige.toml`: settings that sit between the environment and the defaults.

Which files are read, key by key the later winning:
1. the user's own file, `$XDG_CONFIG_HOME/nanbeige/nanbeige.toml` (else `~/.config/nanbeige/nanbeige.toml`);
2. the file the user named (`nanbeige --config PATH ...` or `$NANBEIGE_CONFIG`), else the first `nanbeige.toml`
   in the working folder or a folder above it, but that one only once the user has trusted it (`trust.py`),
   and a file above only if trusted for its tree: a folder someone else made could otherwise run commands
   (`mcp`), read code (`reference`) or send the user's API key to a server of theirs (`base_url`).
A folder's file is read as itself: a symbolic link is refused, and so is a file over `MAX_BYTES`. Each file is
read once: the bytes its trust is checked on are the bytes parsed.
Keys are flag names with underscores (`max_turns = 300`, `mcp = ["docs=http://127.0.0.1:9000/mcp"]`).
A key at the top applies to every command that has that flag; a table named after a command
(`[ask]`, `[serve]`, `[index.build]`) applies to that command alone and wins. Flags and environment
variables still come first: the settings become click's `default_map`, which click reads after both.
A file's relative paths are its own: a path setting (`reference = "./MiroThinker"`), and a model or tokenizer
said as `./weights` or `../weights`, is taken from the file's folder, and an `mcp` command starts in that folder
(`env -C FOLDER COMMAND`), wherever nanbeige runs.
"""

from __future__ import annotations

import json
import os
import shlex
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import typer

from nanbeige.agent.cli import trust
from nanbeige.agent.user_dirs import config_dir
from nanbeige.tools import handed_over
from nanbeige.tools.errors import NanbeigeError

FILE_NAME = "nanbeige.toml"
MAX_BYTES = 1024 * 1024
"""The largest settings file read (a real one is a few hundred bytes); a larger one is refused unread."""


RISK = "(a folder's settings can run commands and choose servers)"

FOLDER_OR_ID = frozenset({"model", "tokenizer"})
"""Settings typed as text that name a local folder or a Hugging Face id: a value in a settings file that starts
with `./` or `../` is a folder, taken from the file's folder as a path setting is; anything else (an id such as
`Nanbeige/Nanbeige4.1-3B`) is kept as it is. (`gguf_file` is a name inside `model`, not a path of its own.)"""


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
    content: dict[Path, bytes] = field(default_factory=dict)
    """The bytes already read of a file in `used`: a trusted file's, whose sha256 was checked. They are
    parsed as they are, never read again, so a file swapped after its check is not what is obeyed."""
    how: dict[Path, str] = field(default_factory=dict)
    """How to use a file in `ignored`, where there is a way (`nanbeige trust --tree PATH`)."""


def user_settings_path() -> Path:
    """The user's own settings file (it may not exist)."""
    return config_dir() / FILE_NAME


def folder_settings_path(start: Path | None = None) -> Path | None:
    """The first `nanbeige.toml` in the working folder or one above it, other than the user's own; a symbolic
    link of that name counts (it is then refused, saying so, rather than passed over in silence)."""
    folder = (start or Path.cwd()).absolute()
    own = user_settings_path().absolute()
    for candidate in (folder / FILE_NAME, *(parent / FILE_NAME for parent in folder.parents)):
        if (candidate.is_symlink() or candidate.is_file()) and candidate.absolute() != own:
            return candidate
    return None


def find(named: Path | None = None) -> Found:
    """Which settings files are in effect. `named` (`--config`), else `$NANBEIGE_CONFIG`, is the user's
    own choice; a file found in a folder is read only when trusted, unchanged since, for the folder the
    user stands in."""
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
    content, why, how = _trusted_content(folder)
    if content is not None:
        found.used.append((folder, "trusted"))
        found.content[folder] = content
        return found
    found.ignored.append(
        (folder, f"ignoring the settings file {_shown(folder)}: {why} {RISK}" + (f"; {how}" if how else ""))
    )
    if how:
        found.how[folder] = how
    return found


def _trusted_content(path: Path) -> tuple[bytes | None, str, str]:
    """A folder's file's bytes when it is trusted as it is now for the folder the user stands in; else None,
    why not and how to use it. An untrusted file is not read at all."""
    shown = _shown(path)
    if path.is_symlink():
        return (
            None,
            "it is a symbolic link, and a link never has the trust of the file it leads to",
            f"copy the file here and `nanbeige trust {shown}`, or name it with --config",
        )
    if trust.entry(path) is None:
        return None, "it is not trusted", f"`nanbeige trust {shown}` uses it"
    try:
        content = read_bytes(path, follow=False)
    except SettingsError as exc:
        return None, str(exc), ""
    verdict = trust.verdict(path, content, Path.cwd())
    if verdict == trust.TRUSTED:
        return content, "", ""
    if verdict == trust.FOLDER_ONLY:
        return (
            None,
            f"it is trusted in {path.parent} alone, not in the folders below it",
            f"`nanbeige trust --tree {shown}` uses it in the folders below too",
        )
    return None, "it has changed since you trusted it", f"`nanbeige trust {shown}` uses it"


def trust_on_list(path: Path, known: trust.Trusted) -> bool:
    """Whether a file on the trust list is there still, as it was trusted."""
    try:
        return trust.digest(read_bytes(path, follow=False)) == known.sha256
    except SettingsError:
        return False


def read_bytes(path: Path, follow: bool = True) -> bytes:
    """A settings file's bytes, read as any file someone else could have made is (`tools/handed_over.py`): its
    size checked before anything is read, no more than `MAX_BYTES` read, from the one open file checked.
    `follow=False`: a symbolic link is refused (a folder's file is trusted as itself); the user's own file and
    the one they name may be links of theirs."""
    try:
        return handed_over.read_bytes(path, MAX_BYTES, inside=None if follow else path.absolute().parent)
    except handed_over.HandedOverError as exc:
        raise SettingsError(f"settings file {exc}") from None
    except OSError as exc:
        raise SettingsError(f"cannot read the settings file {path}: {exc.strerror or exc}") from None


def parse(path: Path, content: bytes) -> dict[str, Any]:
    """One settings file's TOML, from its bytes."""
    try:
        return tomllib.loads(content.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None


def read(path: Path) -> dict[str, Any]:
    """One settings file's TOML, the file read (once) as `read_bytes` reads it."""
    return parse(path, read_bytes(path))


def default_map(app: typer.Typer, found: Found | None = None) -> dict[str, Any] | None:
    """The settings in effect as click's `default_map` for the app's commands; None without a file."""
    found = find() if found is None else found
    if not found.used:
        return None
    group = typer.main.get_command(app)
    data: dict[str, Any] = {}
    paths = path_settings(group)
    for path, _ in found.used:
        content = found.content.get(path)
        settings = parse(path, content) if content is not None else read(path)
        data = _merged(data, resolved(settings, path.absolute().parent, paths))
    where = " and ".join(str(path) for path, _ in found.used)
    shared = {_key(k): v for k, v in data.items() if not isinstance(v, dict)}
    mapped, used = _for_group(group, shared, data, where, "")
    unused = sorted(set(shared) - used)
    if unused:
        raise SettingsError(f"settings file {where}: no command has the setting {unused[0]!r}")
    return mapped


def path_settings(group: Any) -> set[str]:
    """The names of every setting, in any command, that takes a path (a file or folder)."""
    names: set[str] = set()
    for command in group.commands.values():
        if hasattr(command, "commands"):
            names |= path_settings(command)
        by_param = {param.name: param for param in command.params}
        names |= {name for name, param in _option_names(command).items() if _takes_path(by_param[param])}
    return names


def resolved(data: dict[str, Any], folder: Path, paths: set[str]) -> dict[str, Any]:
    """A settings file's values with its relative paths its own: each path setting (and a folder-or-id setting
    said as a relative folder) taken from `folder`, the file's folder, and each `mcp` command started there
    (`env -C FOLDER COMMAND`), so that nothing in it means a file of whatever folder nanbeige runs in."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out[key] = resolved(value, folder, paths)
            continue
        change = _change_for(_key(key), paths)
        if change is None:
            out[key] = value
        else:  # a repeatable setting takes a list or one value
            out[key] = [change(item, folder) for item in value] if isinstance(value, list) else change(value, folder)
    return out


def _change_for(key: str, paths: set[str]) -> Any:
    """How a setting's value is made the file's own, or None for a value kept as it is."""
    if key == "mcp":
        return _started_in
    if key in paths:
        return _from
    return _from_if_folder if key in FOLDER_OR_ID else None


def agreed(path: Path, content: bytes, paths: set[str]) -> list[str]:
    """Every value the file sets, nested ones included, as `key = value` lines, with its paths and commands as
    they will be used: what trusting it agrees to. Control and invisible characters are written out."""
    return _leaves(resolved(parse(path, content), path.absolute().parent, paths), "")


def _leaves(value: Any, name: str) -> list[str]:
    if isinstance(value, dict | list) and not value:  # `mcp = []` sets something too: no servers
        return [f"{name} = {json.dumps(value)}"]
    if isinstance(value, dict):
        return [line for key, item in value.items() for line in _leaves(item, _joined(name, key))]
    if isinstance(value, list):
        return [line for index, item in enumerate(value) for line in _leaves(item, f"{name}[{index}]")]
    text = json.dumps(value, ensure_ascii=False, default=str)
    return [f"{name} = {''.join(c if c.isprintable() else ascii(c)[1:-1] for c in text)}"]


def _joined(name: str, key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return f"{name}{'.' if name else ''}{key if bare else json.dumps(key)}"


def _takes_path(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return Path in (annotation, *typing.get_args(annotation)) or isinstance(getattr(param, "type", None), click.Path)


def _from(value: Any, folder: Path) -> Any:
    """A path setting's value taken from the file's folder when relative; one from the home folder (`~/x`)
    or absolute is kept as it is."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return value
    return str(folder / value)


def _from_if_folder(value: Any, folder: Path) -> Any:
    """A folder-or-id setting's value taken from the file's folder when it says it is a relative folder."""
    return _from(value, folder) if isinstance(value, str) and value.startswith(("./", "../")) else value


def _started_in(spec: Any, folder: Path) -> Any:
    """An `mcp` value `NAME=COMMAND` whose command starts in the file's folder; a URL, or a value that is no
    spec (the command line's own check then refuses it), is left as it is."""
    if not isinstance(spec, str):
        return spec
    name, sep, command = spec.partition("=")
    if not sep or not command.strip() or command.strip().startswith(("http://", "https://")):
        return spec
    return f"{name}=env -C {shlex.quote(str(folder))} {command.strip()}"


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
