"""Files moved in and out of a local sandbox's folder by the server (uploads, downloads), never
following a link that sandboxed code planted: the server has rights the code lacks.
"""

from __future__ import annotations

import os
import stat
from contextlib import suppress
from pathlib import Path, PurePosixPath

from nanbeige.tools.sandbox.sandbox_config import MB, SANDBOX_HOME, SandboxError


def inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def host_path(folder: Path, path: str) -> Path:
    """The place in a local sandbox's folder that the model's path (under /home/user) names."""
    if "\0" in path:
        raise SandboxError(f"{path!r} is not a path: it holds a NUL character.")
    model_path = PurePosixPath(path or SANDBOX_HOME)
    if model_path.is_absolute():
        if not (model_path == PurePosixPath(SANDBOX_HOME) or PurePosixPath(SANDBOX_HOME) in model_path.parents):
            raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
        model_path = model_path.relative_to(SANDBOX_HOME)
    full = Path(os.path.normpath(folder / model_path))
    if not inside(full, folder):
        raise SandboxError(f"{path} is outside the sandbox; use a path under {SANDBOX_HOME}.")
    return full


def open_dir(folder: Path, parts: tuple[str, ...], create: bool, owner: int | None) -> int:
    """A descriptor of folder/parts reached one step at a time without following symlinks, so
    links the sandboxed code planted cannot lead the server outside its folder."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, owner, owner, dir_fd=fd, follow_symlinks=False)
            step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
    except OSError as exc:
        os.close(fd)
        raise SandboxError(
            f"Cannot use folder {'/'.join(parts)} in the sandbox: {exc.strerror} (symbolic links are not followed)."
        ) from None
    return fd


def write_file(folder: Path, path: str, data: bytes, owner: int | None) -> None:
    parts = host_path(folder, path).relative_to(folder).parts
    if not parts:
        raise SandboxError(f"{path!r} is a folder, not a file name.")
    dir_fd = open_dir(folder, parts[:-1], create=True, owner=owner)
    try:
        # O_NONBLOCK: a FIFO the code made there must not hang the server; O_TRUNC waits for the check
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        raise SandboxError(f"Cannot write {path}: {exc.strerror}.") from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"Cannot write {path}: it is not a regular file.")
    os.set_blocking(fd, True)
    os.ftruncate(fd, 0)
    with open(fd, "wb") as f:
        if owner is not None:
            os.fchown(fd, owner, owner)
        try:
            f.write(data)
        except OSError as exc:  # the sandbox's disk budget is spent
            raise SandboxError(f"Cannot write {path}: {exc.strerror}.") from None


def read_file(folder: Path, path: str, max_bytes: int) -> bytes:
    parts = host_path(folder, path).relative_to(folder).parts
    dir_fd = open_dir(folder, parts[:-1], create=False, owner=None)
    try:
        # no symlink is followed, and O_NONBLOCK keeps a FIFO from hanging the server
        fd = os.open(parts[-1] if parts else ".", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise SandboxError(f"Cannot read {path} in the sandbox: {exc.strerror}.") from None
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        os.close(fd)
        raise SandboxError(
            f"{path} is not a regular file."
            if not stat.S_ISREG(info.st_mode)
            else f"{path} is larger than {max_bytes // MB} MB."
        )
    with open(fd, "rb") as f:
        return f.read(max_bytes + 1)[:max_bytes]
