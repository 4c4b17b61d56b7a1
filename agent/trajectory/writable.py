"""Whether a file can be written where a flag says, checked before a command asks any model: every
command that writes files its flags name (`--trajectory`, `--report`, `--cache`, `--out`) asks here."""

from __future__ import annotations

import os
from pathlib import Path


def unwritable(path: Path) -> str:
    """Why a file cannot be written at `path` (its missing folders made), or "" when it can; nothing is
    left behind."""
    try:
        return _unwritable(path)
    except OSError as exc:  # even looking fails: a name over 255 bytes, a folder that cannot be read
        return exc.strerror or str(exc)


def _unwritable(path: Path) -> str:
    if path.is_dir():
        return "it is a folder"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if path.exists():
        return "" if os.access(path, os.W_OK) else "permission denied"
    return _probe(path)


def _probe(path: Path) -> str:
    """Make the file and its missing folders, then remove them: permission bits say nothing to root, nor
    about a filesystem such as /proc that takes no new entry, so only doing it tells."""
    made: list[Path] = []
    try:
        for folder in reversed(path.parents):  # the outermost first
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        path.unlink()
    except FileExistsError:  # made meanwhile, by another process
        pass
    except OSError as exc:
        return f"cannot make {exc.filename or path}: {exc.strerror or exc}"
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
    return ""


def unwritable_folder(path: Path) -> str:
    """Why files cannot be written in the folder `path` (made where missing), or "" when they can; nothing
    is left behind."""
    try:
        if path.exists() and not path.is_dir():
            return "it is not a folder"
    except OSError as exc:
        return exc.strerror or str(exc)
    return unwritable(path / ".nanbeige-write-check")
