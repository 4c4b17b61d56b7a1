"""One run's state (`Run`, made fresh by each call of `run` and never shared with another run) and the
steps the loop and its final turn both take with it: count the turns used, size the next prompt, make a
turn of the model's reply and log it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.llm import LLM
from nanbeige.agent.run.context import History
from nanbeige.agent.run.run_config import AgentConfig
from nanbeige.agent.run.tokens import TokenTracker
from nanbeige.agent.run.usage import add_turn
from nanbeige.agent.toolbox.restarts import Restarts
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn, counted_turns
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter

Event = Callable[[str, Any], None]


@dataclass
class Run:
    """The state of one run, never shared with another."""

    trajectory: Trajectory
    history: History
    conversation: Any
    """The model backend's state for this conversation (see `LLM.new_conversation`)."""
    tracker: TokenTracker = dataclasses.field(default_factory=TokenTracker)
    restarts: Restarts = dataclasses.field(default_factory=Restarts)
    """This run's budget of tool-server restarts."""
    turns_counted: tuple[int, int] = (0, 0)
    """How many of the trajectory's turns were counted against max_turns, and how many of those
    count (rolled-back replies do not): counting only the new ones keeps a turn's cost flat."""
    summary_tokens: int | None = None
    """The estimated size of the run's summary prompt, which the context check counts every turn
    (made once: with a reference checkout it is the checkout's function's output)."""


def streaming_options(config: AgentConfig, on_event: Event) -> dict[str, Any]:
    """The model call's `on_text` when the run streams; nothing otherwise, so a backend that cannot
    stream works as before."""
    return {"on_text": lambda text: on_event("text", text)} if config.stream else {}


def turns_used(state: Run) -> int:
    """The turns that count against max_turns so far (rolled-back replies do not)."""
    turns = state.trajectory.turns
    seen, used = state.turns_counted
    used += counted_turns(turns[seen:])
    state.turns_counted = (len(turns), used)
    return used


def next_prompt_tokens(llm: LLM, state: Run, tools: list[dict[str, Any]] | None) -> int:
    """The next prompt's size: exact when the backend has the model's tokenizer, else the server's
    last count plus an estimate of what was added since."""
    exact = llm.count_prompt(state.history.messages, tools, state.conversation)
    if exact is not None:
        return exact
    turns = state.trajectory.turns
    return state.history.next_prompt_tokens(turns[-1] if turns else None)


def new_turn(trajectory: Trajectory, completion: Completion, tracker: TokenTracker) -> Turn:
    turn = Turn(
        index=len(trajectory.turns),
        assistant=completion.message,
        finish_reason=completion.finish_reason,
        usage=completion.usage,
        latency_s=completion.latency_s,
        logprobs=completion.logprobs,
        endpoint=completion.endpoint,
    )
    if completion.prompt_ids is not None and completion.completion_ids is not None:
        tracker.record(turn, completion.prompt_ids, completion.completion_ids)
    return turn


def log_turn(trajectory: Trajectory, turn: Turn, writer: TrajectoryWriter | None, on_event: Event) -> None:
    trajectory.turns.append(turn)
    add_turn(trajectory.usage, turn)
    if writer:
        writer.turn(trajectory, turn)
    on_event("turn", turn)
