"""Which folder settings files the user has trusted: their paths and the sha256 of what was trusted, kept in
the user's own config folder (`trusted.json`), so that a file edited since needs trusting again (as git's
`safe.directory` or `direnv allow` do for what a cloned folder may make them do)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from nanbeige.agent.user_dirs import config_dir
from nanbeige.tools.errors import NanbeigeError

TRUSTED, CHANGED, UNKNOWN = "trusted", "changed", "unknown"


class TrustError(NanbeigeError):
    """The trust list cannot be read or written."""


def store_path() -> Path:
    return config_dir() / "trusted.json"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trusted() -> dict[str, str]:
    """Each trusted file's absolute path -> the sha256 it had when trusted; nothing when there is no list."""
    path = store_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise TrustError(f"cannot read the list of trusted settings files {path}: {exc}") from None
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
        raise TrustError(
            f"the list of trusted settings files {path} is not in nanbeige's format: delete it and "
            "trust the files again"
        )
    return entries


def verdict(path: Path) -> str:
    """TRUSTED when the file is on the list with the content it has now, CHANGED when it is on the list with
    other content, UNKNOWN otherwise (an unreadable list trusts nothing)."""
    try:
        known = trusted().get(str(path.resolve()))
        now = digest(path)
    except (TrustError, OSError):
        return UNKNOWN
    return UNKNOWN if known is None else TRUSTED if known == now else CHANGED


def trust(path: Path) -> str:
    """Put the file on the list as it is now; returns its sha256."""
    sha = digest(path)
    _write(trusted() | {str(path.resolve()): sha})
    return sha


def forget(path: Path) -> bool:
    """Take the file off the list; False when it was not on it."""
    entries = trusted()
    removed = entries.pop(str(path.resolve()), None) is not None
    if removed:
        _write(entries)
    return removed


def _write(entries: dict[str, str]) -> None:
    """The list, replaced whole (written beside and renamed, so a crash leaves the old one), readable by the
    user alone."""
    path = store_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({"files": entries}, file, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError as exc:
        raise TrustError(f"cannot write the list of trusted settings files {path}: {exc.strerror or exc}") from None
