"""Reading a file that someone else could have made: a trajectory file, an eval's results, a loop's state.

Such a file is read the one way this module does it, so that every reader holds to the same rules:
- a file found in a folder (an eval's out folder, a loop's folder) is never a symbolic link, and the folder
  it is found in is that folder, not one a link leads to: a link planted in a handed-over folder cannot make
  a reader take in a file from elsewhere (a link the user named on the command line is theirs, and followed);
- it is a regular file (a FIFO would block the reader forever, a device would never end);
- its size is checked before anything is read, and no more than the cap is ever read, from the one open
  file whose size was checked (a writer growing or swapping the file in between changes nothing);
- nothing in it is unpickled (the readers here return bytes, text or JSON).

Any such problem is a `HandedOverError`: one line naming the file and what is wrong. It derives from
`ValueError`, as a file that is not what it should be already is for the readers that use this module.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

MIB = 1024 * 1024


class HandedOverError(ValueError):
    """A handed-over file that is refused unread: a link, not a regular file, too large, or outside its folder."""


def open_file(path: str | Path, max_bytes: int, inside: str | Path | None = None) -> BinaryIO:
    """The file opened for reading in binary, once it is found to be a regular file of at most `max_bytes`
    (for a reader that streams it; close it, or use it in `with`). `inside`: the folder the file was found in;
    the file must not be a link, nor lie elsewhere once its folder's links and `..` are resolved. Without it the
    path is one the user named, and a link there is followed."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: opening a FIFO with no writer returns
    if inside is not None:
        _check_inside(path, Path(inside))
        flags |= os.O_NOFOLLOW
    try:
        descriptor = os.open(path, flags)
    except OSError:
        if inside is not None and _is_link(path):  # O_NOFOLLOW's answer (ELOOP) reads as a puzzle: say what it is
            raise HandedOverError(f"{path} is a symbolic link: a file in {inside} is read only as itself") from None
        raise
    file = os.fdopen(descriptor, "rb")
    status = os.fstat(descriptor)
    problem = None
    if not stat.S_ISREG(status.st_mode):
        problem = f"{path} is not a regular file"
    elif status.st_size > max_bytes:
        problem = f"{path} is {_size(status.st_size)}, more than the {_size(max_bytes)} it may be"
    if problem is not None:
        file.close()
        raise HandedOverError(problem)
    return file


def read_bytes(path: str | Path, max_bytes: int, inside: str | Path | None = None) -> bytes:
    """The file's bytes, at most `max_bytes` of them, read from the one open file whose size was checked
    (`open_file` says which files are refused)."""
    with open_file(path, max_bytes, inside) as file:
        data = file.read(max_bytes + 1)  # grown since the check: still no more than the cap is held
    if len(data) > max_bytes:
        raise HandedOverError(f"{path} grew past {_size(max_bytes)} while it was read")
    return data


def read_text(path: str | Path, max_bytes: int, inside: str | Path | None = None) -> str:
    """The file as UTF-8 text (see `read_bytes`); bytes that are not UTF-8 are an error naming the file."""
    data = read_bytes(path, max_bytes, inside)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HandedOverError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def read_json_object(path: str | Path, max_bytes: int, inside: str | Path | None = None) -> dict[str, Any]:
    """The file as one JSON object (see `read_bytes`); anything else is an error naming the file."""
    data = read_bytes(path, max_bytes, inside)
    try:
        found = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise HandedOverError(f"{path} is not JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(found, dict):
        raise HandedOverError(f"{path} holds JSON that is not an object")
    return found


def check_folder(folder: str | Path, max_bytes: int, max_entries: int = 10_000) -> None:
    """Refuses a folder that another program is about to read by itself (an index's BM25 matrices, which its
    library opens): every entry under it, walked without following a link, must be a regular file or a
    folder, their sizes together at most `max_bytes`, and no more than `max_entries` of them. The folder
    itself is the one named (a link there is the user's); nothing below it may be a link, a FIFO or a device.
    Its files are still read through `open_file` where this program reads them itself."""
    folder = Path(folder)
    total, entries, pending = 0, 0, [folder]
    while pending:
        with os.scandir(pending.pop()) as listing:
            for entry in listing:
                entries += 1
                if entries > max_entries:
                    raise HandedOverError(f"{folder} holds more than {max_entries} files and folders")
                path = Path(entry.path)
                if entry.is_symlink():
                    raise HandedOverError(f"{path} is a symbolic link: a file in {folder} is read only as itself")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(path)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    raise HandedOverError(f"{path} is not a regular file")
                total += entry.stat(follow_symlinks=False).st_size
                if total > max_bytes:
                    raise HandedOverError(f"{folder} holds more than the {_size(max_bytes)} it may (at {path})")


def _check_inside(path: Path, folder: Path) -> None:
    """The file's folder, with every link resolved, is `folder` or below it (so `..` or a linked parent
    folder cannot lead out). The file's own name is checked by O_NOFOLLOW when it is opened."""
    where = path.parent.resolve()
    home = folder.resolve()
    if where != home and home not in where.parents:
        raise HandedOverError(f"{path} lies outside {folder} once its links are followed: refused")


def _is_link(path: Path) -> bool:
    try:
        return path.is_symlink()
    except OSError:
        return False


def _size(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count} bytes"
