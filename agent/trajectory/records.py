"""Checks of trajectory files and records. Before writing: that a file may be appended to, and that
a record can be encoded. After reading: that a record has the shape of the dataclass it becomes,
each field of the type its annotation names (only the outer type: a list is a list, its items are
not looked at, so that checking a record costs next to nothing beside parsing it)."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import os
import re
import stat
import sys
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from nanbeige.tools.errors import NanbeigeError


class NotATrajectoryFile(NanbeigeError, ValueError):
    """The path names something trajectories must not be appended to."""


# The first record of a trajectory file, as this writer (or json.dumps) spells its start
_RECORD_HEAD = re.compile(rb'\{\s*"type"\s*:\s*"(start|turn|end)"')


def check_trajectory_file(path: str | Path) -> None:
    """Raise `NotATrajectoryFile` when appending trajectories to `path` would harm what it holds or
    hang: an existing file that is not empty and does not begin with a trajectory record, or a
    FIFO, socket or device. /dev/null is allowed (the trajectory is thrown away)."""
    try:
        info = os.stat(path)
    except OSError:
        return  # missing (it will be created) or unreadable (opening it says why)
    if stat.S_ISDIR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        if os.path.samestat(info, os.stat(os.devnull)):
            return
        raise NotATrajectoryFile(f"{path} is not a regular file (a FIFO, socket or device); trajectories go to files")
    if info.st_size == 0:
        return
    with open(path, "rb") as file:
        head = file.read(4096).lstrip()
    if not _RECORD_HEAD.match(head):
        raise NotATrajectoryFile(f"{path} exists and is not a trajectory file; it was left as it is")


_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(value: Any) -> Any:
    """The value with what orjson refuses made writable: lone surrogates (undecodable bytes that
    came in as text) become U+FFFD, integers beyond 64 bits become text."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {encodable(str(k)): encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encodable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


def encoded(record: dict[str, Any]) -> bytes:
    """The record as one JSON line (without its newline). ValueError for a record that cannot be
    written at all: nested deeper than the encoder goes (a file read in may hold one)."""
    import orjson

    try:
        return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY, default=str)
    except TypeError:  # text orjson refuses (lone surrogates), an integer over 64 bits
        pass
    try:
        return orjson.dumps(encodable(record), option=orjson.OPT_SERIALIZE_NUMPY, default=str)
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"the {record.get('type', '')} record cannot be written: {exc}") from None


def record_line(path: str | Path, trajectory_id: str, kind: str, index: int | None = None) -> int | None:
    """The number of the line holding a trajectory's record of this kind (and turn index): the last
    such line, the one a reader keeps. Reads the whole file: for naming the line in an error."""
    import orjson

    found = None
    for number, line in enumerate(Path(path).read_bytes().split(b"\n"), start=1):
        if trajectory_id.encode() not in line:
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(record, dict) or record.get("type") != kind:
            continue
        if record.get("id" if kind == "start" else "trajectory_id") == trajectory_id and (
            index is None or record.get("index") == index
        ):
            found = number
    return found


def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The classes a value of this annotation may be an instance of."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in get_args(hint) for t in _runtime_types(arg))
    if origin is typing.Literal:
        return tuple({type(arg) for arg in get_args(hint)})
    if hint is Any:
        return (object,)
    if hint is float:
        return (int, float)
    if hint is None or hint is type(None):
        return (type(None),)
    return (origin or hint,)


class _Names(dict):
    """The names an annotation may use: its module's, then the builtins; a name only imported for type
    checkers is not there, and is not checked (Any)."""

    def __missing__(self, name: str) -> Any:
        return vars(builtins).get(name, Any)


@functools.cache
def field_types(cls: type) -> dict[str, tuple[type, ...]]:
    hints = get_type_hints(cls, localns=_Names(vars(sys.modules[cls.__module__])))
    return {f.name: _runtime_types(hints[f.name]) for f in dataclasses.fields(cls)}


def fields_problem(data: Any, cls: type, required: tuple[str, ...] = ()) -> str | None:
    """Why `data` cannot become a `cls`, or None: not an object, a required field missing, or a field
    of the wrong type."""
    if not isinstance(data, dict):
        return f"a {cls.__name__} is {type(data).__name__}, not an object"
    for name in required:
        if name not in data:
            return f"no {name!r}"
    types_of = field_types(cls)
    for name, value in data.items():
        allowed = types_of.get(name)
        if allowed is not None and not isinstance(value, allowed):
            return f"{name!r} is {type(value).__name__}, not {' or '.join(t.__name__ for t in allowed)}"
    return None
