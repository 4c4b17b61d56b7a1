"""`nanbeige loop`'s state, `loop.json`: one dataclass per record, read back field by field and written whole
(`read_state`, `write_state`).

The file is rewritten by the loop after each stage, but anyone can edit it between two calls (or hand
over an out folder), and the loop goes on from what it says: a field of another type must be one line
naming the field, not an exception deep inside a stage. The dataclasses below are the one description of
the file: `read` checks each field against its declared type and builds them, `to_json` writes them.

`engines` maps each vLLM engine the loop syncs (its address) to the version of the policy it was last
found serving (`iter-I`), or null when it was found serving another.

Its paths are kept to the loop's own folder (`places_problem`): the loop trains from a policy's checkpoint,
samples from its model and tells the engines to load it, so a state naming a folder elsewhere would have
them all read what its writer chose."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nanbeige.tools import handed_over
from nanbeige.trainer.loop_config import LoopError

if TYPE_CHECKING:
    from nanbeige.trainer.loop_config import LoopConfig

R = TypeVar("R")


@dataclass
class Policy:
    """A policy the loop samples from."""

    model: str
    """The model asked for: the loop's `--model`, or a checkpoint inside the loop's folder."""
    checkpoint: str | None
    """The checkpoint it was trained into; None: the starting model."""
    version: str = ""
    """`iter-I`, the iteration that trained it (`iter-0`: the start)."""

    def number(self) -> int:
        """I of `iter-I`: the iteration that trained it (0: the start, or a version not of that form)."""
        digits = self.version.removeprefix("iter-")
        return int(digits) if digits.isdigit() else 0


@dataclass
class Collected:
    """What an iteration's collect stage did."""

    rollouts: int = 0
    """Rollouts in the iteration's file."""
    pass_rate: float | None = None
    """Share of them that passed, as collect grades them; None: none graded."""
    model: str = ""
    """The model they were sampled from."""


@dataclass
class Judged:
    """What an iteration's judge stage found."""

    judged: int = 0
    """Rollouts judged."""
    mean_reward: float | None = None
    """Their mean outcome reward; None: none had one."""
    outcome_errors: int = 0
    """Rollouts the outcome grader could not decide."""
    masked_turns: int = 0
    """Turns the critic masked out of training."""
    groups: int = 0
    """Groups of rollouts (one question each)."""
    informative_groups: int = 0
    """Groups the trainer's group filter keeps."""
    questions: int = 0
    """Questions drawn for the iteration."""
    pass_rate: float | None = None
    """Share of the judged rollouts that passed (the trainer's summary)."""
    tool_use: float | None = None
    """Share of the judged rollouts that called a tool."""


@dataclass
class Trained:
    """What an iteration's train stage wrote."""

    checkpoint: str
    """The last checkpoint, an absolute path inside the loop's folder."""
    steps: int = 0
    """Optimizer steps taken."""
    rows: int = 0
    """Training rows."""


@dataclass
class Iteration:
    """One iteration: the policy it samples, and each stage's record once the stage is done."""

    iteration: int
    """Its number, from 1."""
    policy: Policy
    """The policy it samples from."""
    collected: Collected | None = None
    judged: Judged | None = None
    trained: Trained | None = None
    synced: Policy | None = None
    """The policy the next iteration samples from, once every engine serves it."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Each finished stage's wall time (by the stage's record name), only reported."""

    def summary(self) -> dict[str, Any]:
        """The iteration as the loop reports it."""
        judged = self.judged or Judged()  # not judged yet: its shares unknown (None)
        return {
            "iteration": self.iteration,
            "model": self.policy.model,
            "rollouts": self.collected.rollouts if self.collected else None,
            "mean_reward": judged.mean_reward,
            "pass_rate": judged.pass_rate,
            "tool_use": judged.tool_use,
            "train_steps": self.trained.steps if self.trained else None,
            "checkpoint": self.trained.checkpoint if self.trained else None,
            "synced_model": self.synced.model if self.synced else None,
            "seconds": round(sum(self.seconds.values()), 1),
        }


STAGES = {"collected": "collect", "judged": "judge", "trained": "train", "synced": "sync"}
"""An iteration's stages in order: the name of their record -> the stage, as messages name it."""


@dataclass
class LoopState:
    """The whole of `loop.json`."""

    policy: Policy
    """The current policy: the last synced iteration's, or the start."""
    questions: str = ""
    """The question file the loop was started on."""
    sync: str = ""
    """How policies reach the engines (`lora`, `weights`, `none`)."""
    iterations: list[Iteration] = field(default_factory=list)
    engines: dict[str, str | None] = field(default_factory=dict)
    """Each engine's address, and the policy version it was last found serving (None: another)."""

    def iteration(self, number: int) -> Iteration:
        """The record of iteration `number` (created when it starts, sampling the current policy)."""
        if len(self.iterations) < number:
            self.iterations.append(Iteration(number, dataclasses.replace(self.policy)))
        return self.iterations[number - 1]

    def to_json(self) -> dict[str, Any]:
        """The file's object; an iteration's stages not done are left out."""
        state = dataclasses.asdict(self)
        for entry in state["iterations"]:
            for stage in STAGES:
                if entry[stage] is None:
                    del entry[stage]
        return state


class StateProblem(ValueError):
    """A field of the state that the loop cannot go on from (its message names the field)."""


def read(raw: Any) -> LoopState:
    """The state in `raw` (the parsed file), each field checked against its declared type; StateProblem names
    the first field that is wrong."""
    if not isinstance(raw, dict):
        raise StateProblem(f"it must be an object, not {type_name(raw)}")
    top = fields_of(LoopState, raw, "", skip=("policy", "iterations", "engines"))  # questions, sync
    policy = record(Policy, raw.get("policy"), "policy")
    engines = raw.get("engines", {})
    if not isinstance(engines, dict):
        raise StateProblem(f"`engines` must be an object, not {type_name(engines)}")
    for url, version in engines.items():
        if not is_kind(version, KINDS[str | None]):
            raise StateProblem(f"`engines[{url!r}]` must be {KINDS[str | None]}, not {type_name(version)}")
    entries = raw.get("iterations")
    if not isinstance(entries, list):
        raise StateProblem(f"`iterations` must be a list, not {type_name(entries)}")
    iterations = [iteration_of(entry, index) for index, entry in enumerate(entries)]
    return LoopState(policy, iterations=iterations, engines=engines, **top)


def iteration_of(raw: Any, index: int) -> Iteration:
    where = f"iterations[{index}]"
    if not isinstance(raw, dict):
        raise StateProblem(f"`{where}` must be an object, not {type_name(raw)}")
    policy = record(Policy, raw.get("policy"), f"{where}.policy")
    if type(raw.get("iteration")) is not int or raw["iteration"] != index + 1:
        raise StateProblem(f"`{where}.iteration` must be {index + 1}, not {type_name(raw.get('iteration'))}")
    seconds = raw.get("seconds", {})
    if not isinstance(seconds, dict):
        raise StateProblem(f"`{where}.seconds` must be an object, not {type_name(seconds)}")
    for stage, value in seconds.items():
        if not is_kind(value, KINDS[float]):
            raise StateProblem(f"`{where}.seconds.{stage}` must be {KINDS[float]}, not {type_name(value)}")
    kinds = {"collected": Collected, "judged": Judged, "trained": Trained, "synced": Policy}
    stages = {stage: record(kinds[stage], raw[stage], f"{where}.{stage}") for stage in STAGES if stage in raw}
    return Iteration(index + 1, policy, **stages, seconds=seconds)


KINDS = {
    str: "text",
    int: "a whole number",
    float: "a number",
    str | None: "text or null",
    float | None: "a number or null",
}
"""Each field type of the records, in the words an error says it in."""


def record(kind: type[R], raw: Any, where: str) -> R:
    """One record of the state, built from `raw` once its fields are of their declared types."""
    if not isinstance(raw, dict):
        raise StateProblem(f"`{where}` must be an object, not {type_name(raw)}")
    return kind(**fields_of(kind, raw, where))


def fields_of(kind: type, raw: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of dataclass `kind` that `raw` holds, checked: the required ones present, each of its type.
    A field `raw` holds that `kind` does not declare is left out (a later version's, or a note)."""
    types = typing.get_type_hints(kind)
    declared = [f for f in dataclasses.fields(kind) if f.name not in skip]
    prefix = f"{where}." if where else ""
    for f in declared:
        if f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise StateProblem(f"`{prefix}{f.name}` is missing")
    for f in declared:
        if f.name in raw and not is_kind(raw[f.name], KINDS[types[f.name]]):
            raise StateProblem(f"`{prefix}{f.name}` must be {KINDS[types[f.name]]}, not {type_name(raw[f.name])}")
    return {f.name: raw[f.name] for f in declared if f.name in raw}


def is_kind(value: Any, kind: str) -> bool:
    if kind.endswith("or null") and value is None:
        return True
    if kind.startswith("text"):
        return isinstance(value, str)
    if kind == KINDS[int]:
        return type(value) is int and value >= 0
    return type(value) in (int, float)  # a bool is no number here


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), repr(value) if type(value) in (int, float) else type(value).__name__
    )


def places_problem(state: LoopState, out: Path, model: str) -> str:
    """What in a state names a place the loop must not go, or "": a checkpoint that does not resolve to a path
    inside the loop's folder `out`, or a policy's model that is neither `model` (the one this loop was given)
    nor such a checkpoint."""
    records: list[tuple[str, Policy | Trained]] = [("policy", state.policy)]
    for index, entry in enumerate(state.iterations):
        named = (("policy", entry.policy), ("synced", entry.synced), ("trained", entry.trained))
        records += [(f"iterations[{index}].{name}", r) for name, r in named if r is not None]
    for where, held in records:
        checkpoint = held.checkpoint
        if checkpoint is not None and not inside(checkpoint, out):
            return f"`{where}.checkpoint` names {checkpoint[:200]!r}, outside the loop's folder {out}"
        named_model = held.model if isinstance(held, Policy) else model
        if named_model != model and not inside(named_model, out):
            return (
                f"`{where}.model` is {named_model[:200]!r}: neither the model this loop was given ({model}) nor a "
                f"checkpoint inside its folder {out}"
            )
    return ""


def inside(path: str, out: Path) -> bool:
    """Whether `path`, its links and `..` resolved, lies below the folder `out`."""
    try:
        return out.resolve() in Path(path).resolve().parents
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a loop of links: no place of the folder
        return False


STATE = "loop.json"
MAX_STATE_BYTES = 64 * 1024 * 1024
"""`loop.json`: a few hundred bytes an iteration."""


def new_state(config: LoopConfig) -> LoopState:
    """The state before the first iteration: the policy is the model of the settings."""
    return LoopState(Policy(config.settings.llm.model, None, "iter-0"), str(config.questions), config.sync)


def read_state(out: Path, model: str) -> LoopState | None:
    """The loop's state in folder `out`, checked: its fields' types, and its paths kept to the folder (a policy's
    model is `model`, the one this loop was given, or a checkpoint there)."""
    path = out / STATE
    if not path.exists():
        return None
    try:  # a regular file of the folder (a FIFO would block), its size capped
        raw = json.loads(handed_over.read_bytes(path, MAX_STATE_BYTES, inside=out))
    except (OSError, ValueError, RecursionError) as exc:
        raise LoopError(f"cannot read the loop state {path} ({exc}); fix it or pass another out folder") from None
    try:
        state = read(raw)
    except StateProblem as exc:
        raise LoopError(f"{path}: {exc}; fix it or pass another out folder") from None
    problem = places_problem(state, out, model)
    if problem:
        raise LoopError(f"{path}: {problem}; fix it or pass another out folder")
    return state


def write_state(out: Path, state: LoopState) -> None:
    """Write the state whole or not at all: a kill mid-write leaves the previous state."""
    path, temporary = out / STATE, out / (STATE + ".tmp")
    temporary.write_text(json.dumps(state.to_json(), indent=1) + "\n")
    os.replace(temporary, path)
