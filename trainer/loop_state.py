"""The shape of `nanbeige loop`'s state file, `loop.json`, checked field by field when it is read back.

The file is rewritten by the loop after each stage, but anyone can edit it between two calls (or hand
over an out folder), and the loop goes on from what it says: a field of another type must be one line
naming the field, not an exception deep inside a stage.

`engines` maps each vLLM engine the loop syncs (its address) to the version of the policy it was last
found serving (`iter-I`), or null when it was found serving another.

Its paths are kept to the loop's own folder (`places_problem`): the loop trains from a policy's checkpoint,
samples from its model and tells the engines to load it, so a state naming a folder elsewhere would have
them all read what its writer chose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXT, WHOLE, NUMBER, OPTIONAL_TEXT, OPTIONAL_NUMBER = (
    "text",
    "a whole number",
    "a number",
    "text or null",
    "a number or null",
)

POLICY = {"model": TEXT, "checkpoint": OPTIONAL_TEXT, "version": TEXT}
REQUIRED = {"policy": ("model", "checkpoint"), "synced": ("model", "checkpoint"), "trained": ("checkpoint",)}
"""The fields the loop reads back to go on (the others are only reported)."""
STAGES = {
    "collected": {"rollouts": WHOLE, "pass_rate": OPTIONAL_NUMBER, "model": TEXT},
    "judged": {
        "judged": WHOLE,
        "mean_reward": OPTIONAL_NUMBER,
        "outcome_errors": WHOLE,
        "masked_turns": WHOLE,
        "groups": WHOLE,
        "informative_groups": WHOLE,
        "questions": WHOLE,
        "pass_rate": OPTIONAL_NUMBER,
        "tool_use": OPTIONAL_NUMBER,
    },
    "trained": {"checkpoint": TEXT, "steps": WHOLE, "rows": WHOLE},
    "synced": POLICY,
}


def is_kind(value: Any, kind: str) -> bool:
    if kind.endswith("or null") and value is None:
        return True
    if kind in (TEXT, OPTIONAL_TEXT):
        return isinstance(value, str)
    if kind == WHOLE:
        return type(value) is int and value >= 0
    return type(value) in (int, float)  # a bool is no number here


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), repr(value) if type(value) in (int, float) else type(value).__name__
    )


def fields_problem(record: Any, kinds: dict[str, str], where: str, required: tuple[str, ...] = ()) -> str:
    """What is wrong with one object of the state (its known fields' types), or ""."""
    if not isinstance(record, dict):
        return f"`{where}` must be an object, not {type_name(record)}"
    for name in required:
        if name not in record:
            return f"`{where}.{name}` is missing"
    for name, kind in kinds.items():
        if name in record and not is_kind(record[name], kind):
            return f"`{where}.{name}` must be {kind}, not {type_name(record[name])}"
    return ""


def state_problem(state: Any) -> str:
    """What is wrong with a state read from `loop.json`, or "" when the loop can go on from it."""
    if not isinstance(state, dict):
        return f"it must be an object, not {type_name(state)}"
    top = fields_problem(state, {"questions": TEXT, "sync": TEXT}, "state") or fields_problem(
        state.get("policy"), POLICY, "policy", REQUIRED["policy"]
    )
    if top:
        return top.replace("`state.", "`")
    engines = state.get("engines", {})
    if not isinstance(engines, dict):
        return f"`engines` must be an object, not {type_name(engines)}"
    for url, version in engines.items():
        if not is_kind(version, OPTIONAL_TEXT):
            return f"`engines[{url!r}]` must be {OPTIONAL_TEXT}, not {type_name(version)}"
    entries = state.get("iterations")
    if not isinstance(entries, list):
        return f"`iterations` must be a list, not {type_name(entries)}"
    for index, entry in enumerate(entries):
        where = f"iterations[{index}]"
        problem = fields_problem(entry, {}, where) or fields_problem(
            entry.get("policy"), POLICY, f"{where}.policy", REQUIRED["policy"]
        )
        if not problem and (type(entry.get("iteration")) is not int or entry["iteration"] != index + 1):
            problem = f"`{where}.iteration` must be {index + 1}, not {type_name(entry.get('iteration'))}"
        if not problem:  # each stage's wall time, only reported
            problem = fields_problem(entry.get("seconds", {}), dict.fromkeys(STAGES, NUMBER), f"{where}.seconds")
        for stage, kinds in STAGES.items():
            if not problem and stage in entry:
                problem = fields_problem(entry[stage], kinds, f"{where}.{stage}", REQUIRED.get(stage, ()))
        if problem:
            return problem
    return ""


def places_problem(state: dict[str, Any], out: Path, model: str) -> str:
    """What in a well-typed state (`state_problem` found nothing) names a place the loop must not go, or "":
    a checkpoint that does not resolve to a path inside the loop's folder `out`, or a policy's model that is
    neither `model` (the one this loop was given) nor such a checkpoint."""
    records = [("policy", state["policy"])]
    for index, entry in enumerate(state["iterations"]):
        records += [
            (f"iterations[{index}].{name}", entry[name]) for name in ("policy", "synced", "trained") if name in entry
        ]
    for where, record in records:
        checkpoint = record.get("checkpoint")
        if checkpoint is not None and not inside(checkpoint, out):
            return f"`{where}.checkpoint` names {checkpoint[:200]!r}, outside the loop's folder {out}"
        named = record.get("model", model)
        if named != model and not inside(named, out):
            return (
                f"`{where}.model` is {named[:200]!r}: neither the model this loop was given ({model}) nor a "
                f"checkpoint inside its folder {out}"
            )
    return ""


def inside(path: str, out: Path) -> bool:
    """Whether `path`, its links and `..` resolved, lies below the folder `out`."""
    try:
        return out.resolve() in Path(path).resolve().parents
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a loop of links: no place of the folder
        return False
