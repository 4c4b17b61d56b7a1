"""A resumed run's state, rebuilt from its trajectory exactly as it was after its last complete turn.

What the model is asked next must be what it would have been asked had the run not stopped:
- the history, with the same keep-K view: the turns are added to a fresh `History` as the loop
  added them (rolled-back replies and the final-answer turn never were in it);
- the token tracker, when turns carry token records: the last prompt and completion and their
  segment, so the next turn's `prompt_keep`, `prefix_hash` and segment continue the same chain;
- the backend's conversation, when prompts are built here (token mode, in-process): the last
  prompt and what was sampled after it, so the next prompt extends those ids verbatim.

A turn is complete when each of its tool calls has its result. The final-answer turn counts only
together with the end line after it (without one it is asked again): the run was ending, and the
end is made anew. A run whose last turn had ended the loop only has that end to make, and one that
used up its time limit stops at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nanbeige.agent.run import dialects, replies
from nanbeige.agent.run.context import History
from nanbeige.agent.run.tokens import TokenTracker, last_prompt
from nanbeige.agent.run.usage import run_usage
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn

if TYPE_CHECKING:
    from nanbeige.agent.run.run_config import AgentConfig


def complete_turns(turns: list[Turn]) -> int:
    """How many leading turns a resumed run keeps."""
    for position, turn in enumerate(turns):
        if len(turn.tool_results) < len(turn.tool_calls) or turn.instruction is not None:
            return position
    return len(turns)


def used_wall_s(trajectory: Trajectory) -> float:
    """The run time a trajectory has already used: the wall time its newest end (or resume) line
    gives, plus the model and tool time of turns made after that (by a run killed before it could
    write an end line; the rest of such a run's time is not known, so it is not counted)."""
    timings = trajectory.timings
    timed = int(timings.get("timed_turns", len(trajectory.turns))) if "wall_s" in timings else 0
    later = trajectory.turns[timed:]
    return float(timings.get("wall_s", 0.0)) + sum(
        turn.latency_s + sum(result.latency_s for result in turn.tool_results) for turn in later
    )


def reopen(trajectory: Trajectory) -> float:
    """Cut the trajectory after its last complete turn and open it again; returns the time it used."""
    used = used_wall_s(trajectory)
    del trajectory.turns[complete_turns(trajectory.turns) :]
    trajectory.answer = trajectory.stop_reason = trajectory.error = None
    trajectory.timings = {}
    trajectory.usage = run_usage(trajectory.turns)  # budgets count what the kept turns used
    return used


def rebuild(trajectory: Trajectory, llm: Any, keep_tool_results: int) -> tuple[History, Any, TokenTracker]:
    """The history, the backend's conversation and the token tracker after the trajectory's turns."""
    history = History(trajectory.system_prompt, trajectory.user_message, keep_tool_results)
    asked = history.messages  # the messages the last turn was asked with
    for turn in trajectory.turns:
        if turn is trajectory.turns[-1]:
            asked = list(history.messages)
        if not turn.rolled_back:
            history.add_turn(
                dialects.history_message(trajectory.dialect, turn.assistant),
                dialects.observation_messages(trajectory.dialect, turn),
                tool_results=bool(turn.tool_calls),
            )
    tracker, last = TokenTracker(), last_prompt(trajectory.turns)
    conversation = llm.new_conversation(trajectory.group_id)
    if last is not None:
        turn, prompt = last
        tracker.segment, tracker.ids = turn.segment if turn.segment is not None else 0, prompt + turn.completion_ids
        prompter = getattr(llm, "prompter", None)  # token mode and in-process: prompts are built here
        if prompter is not None and turn is trajectory.turns[-1]:
            tools = dialects.request_tools(trajectory.dialect, trajectory.tools)
            # a pool keeps its members' per-run state inside its own
            prompter.restore(getattr(conversation, "inner", conversation), asked, tools, prompt, turn.completion_ids)
    return history, conversation, tracker


def resumed(trajectory: Trajectory, llm: Any, config: AgentConfig) -> tuple[History, Any, TokenTracker]:
    """A reopened run's state (`rebuild`), and how its last turn left the loop: when it answered, or
    was one unusable reply too many, the run only has its end to make."""
    state = rebuild(trajectory, llm, config.keep_tool_results)
    last = trajectory.turns[-1] if trajectory.turns else None
    if last is not None and not last.rolled_back and not last.tool_calls and last.format_error is None:
        trajectory.answer, trajectory.stop_reason = replies.reply_answer(last, config), "answered"
    elif not config.rollback and replies.format_errors_in_a_row(trajectory.turns) >= config.max_format_errors:
        trajectory.stop_reason = "format_errors"
    return state


def time_left(timeout_s: float | None, used: float) -> float | None:
    """What the run's time limit leaves after the time it already used (None: no limit). A resumed run
    with none left stops as a run whose time runs out does, before the model is asked again."""
    if timeout_s is None:
        return None
    if used >= timeout_s:
        raise TimeoutError
    return timeout_s - used
