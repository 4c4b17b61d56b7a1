"""What a Ray node sends back for an item, checked before the driver writes any of it (`agent/cluster.py`).

A node runs with the driver's trust: Ray unpickles what it sends on the driver, so a hostile node can run
code there, and nothing here prevents it (docs/scaling.md). What is checked is what a node could otherwise
put into the out folder as data: each result is read as a file from elsewhere would be. A run's records are
encoded as the driver's writer would write them and read back with the trajectory reader's own checks
(`trajectory_file.record_problem`: every field of its type); they must be the records of one trajectory, of
the question the node was given (its text, and the question's id as the group id), in order: a start, its
turns, its end. A result that does not fit is refused whole, naming what is wrong, and nothing of it is written.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from nanbeige.agent.trajectory.records import encoded
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import end_record, record_problem, start_record, turn_record


def as_record(call: Any, started: Trajectory | None) -> dict[str, Any] | str:
    """The record one of `Recorder.calls` is written as (its trajectory started by `started`), or why it
    cannot be one of this run's."""
    if type(call) is not tuple or len(call) != 2:
        return f"{type(call).__name__} where a (kind, value) pair belongs"
    kind, value = call
    if started is None:
        if kind == "start" and type(value) is Trajectory:
            return start_record(value)
        return f"a {kind!r} record where the trajectory's start belongs"
    if kind == "turn" and type(value) is Turn:
        return turn_record(started.id, value)
    if kind == "end" and type(value) is Trajectory and value.id == started.id:
        return end_record(value)
    resume = type(value) is dict and value.get("type") == "resume" and value.get("trajectory_id") == started.id
    if kind == "record" and resume:  # the loop writes one when a run goes on after a stop
        return value
    return f"a {kind!r} record that is not of trajectory {started.id!r}"


def records_problem(calls: Any, group_id: str | None, question: str) -> str | None:
    """Why a run's records (`Recorder.calls`) cannot be written as the records of the run asked for, or None."""
    if type(calls) is not list:
        return f"its records are {type(calls).__name__}, not a list"
    started: Trajectory | None = None
    for number, call in enumerate(calls, start=1):
        record = as_record(call, started)
        if isinstance(record, str):
            return f"record {number}: {record}"
        try:
            problem = record_problem(orjson.loads(encoded(record)))  # as the file would hold it, read back
        except (ValueError, RecursionError) as exc:
            problem = f"it cannot be written ({exc})"
        if problem is not None:
            return f"record {number} ({record.get('type')}): {problem}"
        if record["type"] == "start":
            started = call[1]
            if (started.group_id, started.question) != (group_id, question):
                return f"record {number}: a trajectory of another question ({started.group_id!r})"
    return None


def trajectory_problem(trajectory: Any) -> str | None:
    """Why a whole trajectory (a judged one) cannot be written as a trajectory file's records, or None."""
    if type(trajectory) is not Trajectory:
        return f"{type(trajectory).__name__}, not a trajectory"
    if type(trajectory.turns) is not list:
        return f"its turns are {type(trajectory.turns).__name__}, not a list"
    rewards = [trajectory.reward, *(turn.reward for turn in trajectory.turns if type(turn) is Turn)]
    if not all(reward is None or type(reward) in (int, float) and math.isfinite(reward) for reward in rewards):
        return "a reward that is not a finite number"
    calls = [("start", trajectory), *(("turn", turn) for turn in trajectory.turns), ("end", trajectory)]
    return records_problem(calls, trajectory.group_id, trajectory.question)
