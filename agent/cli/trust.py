"""Which folder settings files the user has trusted, kept in the user's own config folder (`trusted.json`).

Trust is for one file, at its own place, with the content it had (as git's `safe.directory` or `direnv allow`
do for what a cloned folder may make them do):
- its place: the file's own path, its folder's links resolved but never the file itself, so a symbolic link
  named `nanbeige.toml` is a file of its own that leads elsewhere, and never carries the trust of its target
  (the settings file reader refuses such a link outright);
- its content: the sha256 of the very bytes the settings are then parsed from (the caller reads the file
  once and hands the bytes to both), so a file edited since, or swapped between a check and a read, is not
  obeyed;
- where it applies: in its own folder only, unless it was trusted for its tree (`nanbeige trust --tree`),
  then in every folder below too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from nanbeige.agent.user_dirs import config_dir
from nanbeige.tools.errors import NanbeigeError

TRUSTED, CHANGED, UNKNOWN, FOLDER_ONLY = "trusted", "changed", "unknown", "folder only"


class TrustError(NanbeigeError):
    """The trust list cannot be read or written."""


@dataclass(frozen=True)
class Trusted:
    """One file on the trust list."""

    sha256: str
    """The sha256 of the file's bytes when it was trusted."""
    tree: bool = False
    """Whether it applies in the folders below its own too (`nanbeige trust --tree`)."""


def store_path() -> Path:
    return config_dir() / "trusted.json"


def place(path: Path) -> str:
    """The file's own path, the key of the list: absolute, its folder's links resolved (the user may stand
    in a folder through a link), the file's own name kept as it is, never followed."""
    absolute = path.absolute()
    return str(absolute.parent.resolve() / absolute.name)


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def trusted() -> dict[str, Trusted]:
    """Each trusted file's place -> how it was trusted; nothing when there is no list."""
    path = store_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TrustError(f"cannot read the list of trusted settings files {path}: {exc}") from None
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(_valid(entry) for entry in entries.values()):
        raise TrustError(
            f"the list of trusted settings files {path} is not in nanbeige's format: delete it and "
            "trust the files again"
        )
    # an entry of an older list is its sha256 alone: trusted in its own folder, as every entry now starts
    return {
        name: Trusted(entry) if isinstance(entry, str) else Trusted(entry["sha256"], entry["tree"])
        for name, entry in entries.items()
    }


def entry(path: Path) -> Trusted | None:
    """How the file was trusted; None when it is not on the list (or the list cannot be read: that trusts
    nothing)."""
    try:
        return trusted().get(place(path))
    except TrustError:
        return None


def verdict(path: Path, content: bytes, here: Path) -> str:
    """For the file found by one standing in `here`, with `content` as just read: TRUSTED when it is on the
    list with this content and applies here, CHANGED when on the list with other content, FOLDER_ONLY when
    trusted for its own folder and `here` is below it, UNKNOWN otherwise."""
    known = entry(path)
    if known is None:
        return UNKNOWN
    if known.sha256 != digest(content):
        return CHANGED
    own_folder = Path(place(path)).parent
    return TRUSTED if known.tree or here.resolve() == own_folder else FOLDER_ONLY


def trust(path: Path, content: bytes, tree: bool = False) -> str:
    """Put the file on the list with `content`, the bytes the caller read and showed; returns their sha256."""
    sha = digest(content)
    _write(trusted() | {place(path): Trusted(sha, tree)})
    return sha


def forget(path: Path) -> bool:
    """Take the file off the list; False when it was not on it."""
    entries = trusted()
    removed = entries.pop(place(path), None) is not None
    if removed:
        _write(entries)
    return removed


def _valid(entry: object) -> bool:
    if isinstance(entry, str):
        return True
    return isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("tree"), bool)


def _write(entries: dict[str, Trusted]) -> None:
    """The list, replaced whole (written beside and renamed, so a crash leaves the old one), readable by the
    user alone."""
    path = store_path()
    data = {name: {"sha256": known.sha256, "tree": known.tree} for name, known in entries.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({"files": data}, file, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError as exc:
        raise TrustError(f"cannot write the list of trusted settings files {path}: {exc.strerror or exc}") from None
