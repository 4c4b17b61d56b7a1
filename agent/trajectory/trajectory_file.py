"""The JSONL file format of trajectories (the data types are in `trajectory.py`): its
records, the writer that appends them and the reader that loads them back.

A trajectory file holds one JSON object per line, appended and flushed as the run goes:

    {"type": "start", "id": ..., "question": ..., ...}   once, when the run begins
    {"type": "turn", "trajectory_id": ..., "index": 0, ...}   once per model call
    {"type": "end", "trajectory_id": ..., "answer": ..., "stop_reason": ...}   once, when it ends

Several trajectories may share a file; every line names its trajectory. A crash loses at most the
turn in flight, and `load_trajectories` tolerates a torn line (skipped, with a warning when records
follow it). A trajectory without an end line is unfinished (resumable). A record that does not fit
the format (a start without an id, a number where text belongs) is skipped with a warning naming
its file and line.

The writer refuses to append to a file that holds something else, or to a FIFO, socket or device
other than /dev/null. When a write fails (a full disk), it cuts the file back to its last whole
line and raises `TrajectoryWriteError`: the loop ends the run with the stop reason `write_error`.
Writing a turn costs O(size of that turn): the file is never rewritten and the prompt is never
stored again.

`nanbeige resume` continues a trajectory cut short (no end line, or one whose stop reason is in
`RESUMABLE`) in the same file, by appending

    {"type": "resume", "trajectory_id": ..., "num_turns": K, "wall_s": ..., "resumed_at": ...}

and then turn lines from index K on and, in the end, a new end line. Records apply in file order:
a resume line keeps the trajectory's first K turns (a turn after them was not complete), and undoes
the end line before it, so the newest end line is the one that counts. `wall_s` is the run time
already used (the wall-time limit counts it). Files without resume lines read as before.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import orjson

from nanbeige.agent.trajectory.records import check_trajectory_file, encoded, fields_problem
from nanbeige.agent.trajectory.trajectory import NOT_ENDED_ON_ITS_OWN, ToolCall, ToolResult, Trajectory, Turn
from nanbeige.tools import handed_over

MAX_FILE_BYTES = 2048 * handed_over.MIB
"""The largest trajectory file read: thousands of long runs with their token ids fit, and a file past it is
refused before a byte is read (it is read whole, so this bounds the memory a handed-over file can take)."""

_END_FIELDS = ("answer", "stop_reason", "error", "reward", "judge", "timings", "usage")


def start_record(trajectory: Trajectory) -> dict[str, Any]:
    record = {f.name: getattr(trajectory, f.name) for f in dataclasses.fields(trajectory)}
    for name in ("turns", *_END_FIELDS):
        record.pop(name)
    return {"type": "start", **record}


def turn_record(trajectory_id: str, turn: Turn) -> dict[str, Any]:
    # Shallow on purpose: orjson writes the nested dataclasses itself, and asdict would copy every
    # token id one by one.
    return {
        "type": "turn",
        "trajectory_id": trajectory_id,
        **{f.name: getattr(turn, f.name) for f in dataclasses.fields(turn)},
    }


def end_record(trajectory: Trajectory) -> dict[str, Any]:
    record = {name: getattr(trajectory, name) for name in _END_FIELDS}
    return {"type": "end", "trajectory_id": trajectory.id, "num_turns": len(trajectory.turns), **record}


REDACTED = "[REDACTED]"


def usable_secrets(secrets: Iterable[str] | None) -> list[str]:
    """The secrets worth redacting: 8 characters or more (shorter ones would match ordinary text and
    JSON syntax), longest first (a key that holds another is replaced whole)."""
    return sorted({s for s in secrets or () if len(s) >= 8}, key=len, reverse=True)


def redact_json_line(line: bytes, secrets: list[str]) -> bytes:
    """An encoded JSON line with every secret, spelled as a JSON string spells it, replaced."""
    for secret in secrets:
        line = line.replace(orjson.dumps(secret)[1:-1], REDACTED.encode())
    return line


def redact(text: str, secrets: list[str]) -> str:
    """The text with every secret (API keys the runtime knows) replaced by `[REDACTED]`."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


RESUMABLE = (None, *NOT_ENDED_ON_ITS_OWN)
"""Stop reasons of runs that `nanbeige resume` continues: no end line yet (killed, or the machine
stopped), or cut short from outside. The others are limits the run reached on its own."""


def resume_record(trajectory: Trajectory, wall_s: float) -> dict[str, Any]:
    return {
        "type": "resume",
        "trajectory_id": trajectory.id,
        "num_turns": len(trajectory.turns),
        "wall_s": wall_s,
        "resumed_at": time.time(),
    }


class TrajectoryWriteError(Exception):
    """The trajectory file could not be written (a full disk, a quota): the run stops."""


class TrajectoryWriter:
    """Appends trajectory records to a JSONL file, one line per record; or, with `whole`,
    each trajectory's lines together when it ends, and only when it ended on its own (not
    `NOT_ENDED_ON_ITS_OWN`), so that the file holds finished trajectories only.

    Every string in `secrets` (of 8 characters or more: shorter ones would match ordinary text and
    JSON syntax) is replaced by `[REDACTED]` before a line is written. A failed write cuts the file
    back to its last whole line and raises `TrajectoryWriteError`, as does every write after it."""

    def __init__(self, path: str | Path, secrets: list[str] | None = None, whole: bool = False):
        self.path = Path(path)
        check_trajectory_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.secrets = usable_secrets(secrets)
        self.whole = whole
        self.error: str | None = None
        """Why writing failed; every later write raises `TrajectoryWriteError` with it."""
        self._held: dict[str, list[bytes]] = {}  # whole mode: each open trajectory's lines so far
        # Unbuffered: each record is one write call, so a failed one leaves nothing pending to retry
        self._file = open(self.path, "ab", buffering=0)
        _hold_shared_lock(self._file)
        self._whole_lines = self._file.tell()  # the file's size up to its last whole line
        if self._whole_lines and not _ends_with_newline(self.path):
            self._append(b"\n")  # an earlier run died mid-line: start ours on a line of its own

    def _line(self, record: dict[str, Any]) -> bytes:
        return redact_json_line(encoded(record), self.secrets) + b"\n"

    def _append(self, data: bytes) -> None:
        if self.error:
            raise TrajectoryWriteError(self.error)
        rest = memoryview(data)
        try:
            while rest:
                rest = rest[self._file.write(rest) :]
        except OSError as exc:
            self.error = f"cannot write the trajectory to {self.path}: {exc.strerror or exc}"
            try:  # no torn line left behind; what was written before stays
                os.ftruncate(self._file.fileno(), self._whole_lines)
            except OSError:
                pass
            raise TrajectoryWriteError(self.error) from None
        self._whole_lines += len(data)

    def write(self, record: dict[str, Any]) -> None:
        self._append(self._line(record))

    def start(self, trajectory: Trajectory) -> None:
        if self.whole:
            self._held[trajectory.id] = [self._line(start_record(trajectory))]
        else:
            self.write(start_record(trajectory))

    def turn(self, trajectory: Trajectory, turn: Turn) -> None:
        if self.whole:  # encoded now: the record is what the turn was when it was logged
            self._held[trajectory.id].append(self._line(turn_record(trajectory.id, turn)))
        else:
            self.write(turn_record(trajectory.id, turn))

    def end(self, trajectory: Trajectory) -> None:
        if self.whole:
            lines = self._held.pop(trajectory.id, [])
            if trajectory.stop_reason in NOT_ENDED_ON_ITS_OWN:
                return
            self._append(b"".join([*lines, self._line(end_record(trajectory))]))
        else:
            self.write(end_record(trajectory))
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # EINVAL: /dev/null cannot be synced
                self.error = f"cannot write the trajectory to {self.path}: {exc.strerror or exc}"
                raise TrajectoryWriteError(self.error) from None

    def close(self) -> None:
        self._file.close()


def _hold_shared_lock(file: Any) -> None:
    """Say that this process writes the file, for as long as it is open: `nanbeige resume` refuses a
    file that someone still writes (writers share the lock; many may append to one file)."""
    import fcntl

    try:
        fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        pass  # being resumed this very moment, or a file system without locks: write as before


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _turn_from_record(record: dict[str, Any]) -> Turn:
    turn = _from_dict(Turn, record)
    turn.tool_calls = [_from_dict(ToolCall, c) for c in turn.tool_calls]
    turn.tool_results = [_from_dict(ToolResult, r) for r in turn.tool_results]
    return turn


Warn = Callable[[str], None]


def warn_on_stderr(text: str) -> None:
    sys.stderr.write(f"warning: {text}\n")


def _numbered_records(path: str | Path, warn: Warn, say_torn: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """The records of a file with their line numbers. A line that is not a JSON object (torn by a
    crash mid-write) is skipped: with a warning when records follow it (the file was appended to
    after the crash), quietly when it is the last line (unless `say_torn`: a command that reads a
    finished file says so). Two such lines at the end are not a torn write: ValueError."""
    unread: list[int] = []  # unreadable lines no record has followed yet
    data = handed_over.read_bytes(path, MAX_FILE_BYTES)  # a regular file only (a FIFO blocks), its size capped
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            unread.append(number)
            continue
        for torn in unread:
            warn(f"{path}:{torn}: skipped a line that is not a JSON object (a write cut short?)")
        unread = []
        yield number, record
    if len(unread) > 1:
        raise ValueError(f"{path}:{unread[0]}: not a JSON line")
    if unread and say_torn:
        warn(f"{path}:{unread[0]}: the last line is cut short (a writer killed mid-line?); skipped")


def read_records(path: str | Path, warn: Warn = warn_on_stderr, say_torn: bool = False) -> list[dict[str, Any]]:
    """All records (JSON objects) of a trajectory file; see `_numbered_records` for torn lines."""
    return [record for _, record in _numbered_records(path, warn, say_torn)]


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a record cannot be read as the trajectory record it says it is, or None."""
    kind = record.get("type")
    if kind == "start":
        return fields_problem(record, Trajectory, ("id", "question"))
    if kind not in ("turn", "end", "resume"):
        return None  # not ours: ignored
    if not isinstance(record.get("trajectory_id"), str):
        return "no text 'trajectory_id'"
    if kind == "resume":
        count = record.get("num_turns")
        if not isinstance(record.get("wall_s"), int | float | None) or isinstance(record.get("wall_s"), bool):
            return "'wall_s' is not a number"
        return None if type(count) is int and count >= 0 else "'num_turns' is not a count"
    if kind == "end":
        problem = fields_problem({k: record[k] for k in _END_FIELDS if k in record}, Trajectory)
        times = record.get("timings") or {}
        if problem is None and not all(isinstance(v, int | float) and not isinstance(v, bool) for v in times.values()):
            problem = "a timing is not a number"
        return problem
    problem = fields_problem(record, Turn, ("index", "assistant"))
    if problem is None and not isinstance(record["assistant"].get("content"), (str, type(None))):
        problem = "the assistant message's content is not text"
    for item in record.get("tool_calls", ()) if problem is None else ():
        problem = problem or fields_problem(item, ToolCall, ("server", "name", "arguments"))
    for item in record.get("tool_results", ()) if problem is None else ():
        problem = problem or fields_problem(item, ToolResult, ("text",))
    return problem


def load_trajectories(path: str | Path, warn: Warn = warn_on_stderr, say_torn: bool = False) -> list[Trajectory]:
    """Trajectories of a file, in the order they started; unfinished ones have `stop_reason` None.
    A record that does not fit the format is skipped, with a warning naming its line; so is a torn
    last line with `say_torn`."""
    by_id: dict[str, Trajectory] = {}
    for number, record in _numbered_records(path, warn, say_torn):
        problem = record_problem(record)
        if problem is not None:
            warn(f"{path}:{number}: skipped the {record.get('type')} record that does not fit the format: {problem}")
            continue
        kind = record.get("type")
        if kind == "start":
            by_id[record["id"]] = _from_dict(Trajectory, record)
        elif kind == "turn" and record.get("trajectory_id") in by_id:
            by_id[record["trajectory_id"]].turns.append(_turn_from_record(record))
        elif kind == "end" and record.get("trajectory_id") in by_id:
            trajectory = by_id[record["trajectory_id"]]
            for name in _END_FIELDS:
                setattr(trajectory, name, record.get(name))
            trajectory.usage = trajectory.usage or {}  # files from before usage was recorded
            trajectory.timings = trajectory.timings or {}  # an end record written without them
        elif kind == "resume" and record.get("trajectory_id") in by_id:
            _reopen(by_id[record["trajectory_id"]], record)
    return list(by_id.values())


def _reopen(trajectory: Trajectory, record: dict[str, Any]) -> None:
    """Apply a resume line: the first `num_turns` turns stay, and the run is open again."""
    del trajectory.turns[record.get("num_turns", len(trajectory.turns)) :]
    for name in _END_FIELDS:
        setattr(trajectory, name, None)
    trajectory.usage = {}
    # what the wall time covers: the turns after them were made in a run that wrote no end line
    trajectory.timings = {"wall_s": record.get("wall_s") or 0.0, "timed_turns": len(trajectory.turns)}
