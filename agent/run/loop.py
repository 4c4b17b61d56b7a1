"""The ReAct loop: ask the model, parse its tool calls, run them, log the turn, repeat.

`run` is the whole agent; everything it needs is a function in dialects.py, replies.py (what a
reply is), context.py, restore.py (a resumed run's state), final_turn.py (how a run ends once its loop
stopped) or toolbox. Limits end the run with a stop
reason (all but time in one check before each model call, `_limit_reached`), never with an exception,
and so does a trajectory file that cannot be written (`write_error`: a full disk); Ctrl-C or SIGTERM
(task cancellation) closes the trajectory as `interrupted`, and a bug as `crashed`, and both re-raise.

Many runs may share one model backend and one toolbox: everything that belongs to one run (the
backend's conversation state, the history, the token tracker, the tool servers' restart budget)
lives in `Run` (run_state.py), made fresh by each call of `run`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from typing import TYPE_CHECKING, Any

from nanbeige.agent.backends.llm import LLM, ContextOverflow, ModelError, served_by
from nanbeige.agent.run import dialects, replies
from nanbeige.agent.run.context import (
    History,
    duplicate_note,
    estimate_tokens,
    query_tools,
    reference_margin,
    release_unseen_results,
    repeated_call,
    used_query,
)
from nanbeige.agent.run.final_turn import end_run
from nanbeige.agent.run.replies import EXTRA_ATTEMPTS, RESAMPLES
from nanbeige.agent.run.restore import reopen, resumed, time_left
from nanbeige.agent.run.run_config import AgentConfig
from nanbeige.agent.run.run_state import (
    Event,
    Run,
    log_turn,
    new_turn,
    next_prompt_tokens,
    streaming_options,
    turns_used,
)
from nanbeige.agent.run.usage import over_budget
from nanbeige.agent.toolbox.cache import ReplayMiss
from nanbeige.agent.trajectory.trajectory import ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriteError, TrajectoryWriter, resume_record

if TYPE_CHECKING:  # the MCP SDK takes most of a second to import; `nanbeige --help` needs none of it
    from nanbeige.agent.toolbox.toolbox import Toolbox

# The context when neither the user nor the server says: the reference harness runs Nanbeige with
# 262,144, the length the model was trained to.
DEFAULT_MAX_CONTEXT = 262144
RELEASED = "[not kept in memory: this tool result is in the trajectory file]"


def _no_event(kind: str, data: Any) -> None:
    pass


async def run(
    question: str,
    llm: LLM,
    toolbox: Toolbox | None,
    config: AgentConfig,
    writer: TrajectoryWriter | None = None,
    on_event: Event = _no_event,
    group_id: str | None = None,
    header: dict[str, Any] | None = None,
    resume_from: Trajectory | None = None,
) -> Trajectory:
    """Answer one question; returns the finished trajectory (also written turn by turn). `header`
    sets other fields of the trajectory's start record (`rollout_index`, `policy_version`, ...).
    `resume_from` continues a trajectory cut short (see `restore.py`) instead, with the settings it
    was made with (in `llm` and `config`), writing a resume line and then its next turns."""
    config = dataclasses.replace(
        config.for_dialect(),
        date=config.date or datetime.date.today().isoformat(),
        max_context=config.max_context or DEFAULT_MAX_CONTEXT,
    )
    if resume_from is None:
        state, used = _new_run(question, llm, toolbox, config, group_id, header), 0.0
    else:  # the time limit counts the time it already used
        used = reopen(resume_from)
        state = Run(resume_from, *resumed(resume_from, llm, config))
    trajectory, started = state.trajectory, time.monotonic()
    try:
        if writer and resume_from:
            writer.write(resume_record(trajectory, used))
        elif writer:
            writer.start(trajectory)
        async with asyncio.timeout(time_left(config.timeout_s, used)):
            await _turns(state, llm, toolbox, config, writer, on_event)
    except TimeoutError:
        trajectory.stop_reason = "timeout"
    except ReplayMiss as exc:  # the replay went where the recorded runs did not: no answer, plainly invalid
        trajectory.stop_reason, trajectory.error = "replay_miss", str(exc)
    except TrajectoryWriteError as exc:  # what is not logged would be lost: stop here
        trajectory.stop_reason, trajectory.error = "write_error", str(exc)
    except (asyncio.CancelledError, KeyboardInterrupt):
        trajectory.stop_reason = "interrupted"
        raise
    except Exception as exc:  # a bug or a broken connection: keep the log whole, then let it surface
        trajectory.stop_reason, trajectory.error = "crashed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _close(trajectory, used + time.monotonic() - started, writer, on_event)
    return trajectory


def _new_run(
    question: str,
    llm: LLM,
    toolbox: Toolbox | None,
    config: AgentConfig,
    group_id: str | None,
    header: dict[str, Any] | None,
) -> Run:
    """A fresh run's state: its trajectory, with the settings it is made with, and an empty history."""
    tools = toolbox.tools if toolbox else []
    reference = config.reference
    limits = dataclasses.asdict(dataclasses.replace(config, reference=None)) | (toolbox.settings() if toolbox else {})
    if reference is not None:  # resume reads the texts again from the same checkout, checked by its hash
        limits["reference"] = {"path": str(reference.path), **reference.identity()}
    if (server := served_by(llm)) is not None:  # resume asks the same server again
        limits["server"] = server
    trajectory = Trajectory(
        question=question,
        group_id=group_id,
        tools=tools,
        model=llm.config.model,
        dialect=config.dialect,
        system_prompt=dialects.system_prompt(
            config.dialect, tools, config.date, config.system_prompt_template, reference
        ),
        user_message=dialects.user_message(config.dialect, question, reference),
        reference=reference.identity() if reference else None,
        sampling=llm.config.sampling(),
        limits=limits,
        tokenizer=llm.tokenizer_identity,
        chat_template=llm.template_identity,
        **(header or {}),
    )
    history = History(trajectory.system_prompt, trajectory.user_message, config.keep_tool_results)
    return Run(trajectory, history, llm.new_conversation(trajectory.group_id))


def _close(trajectory: Trajectory, wall_s: float, writer: TrajectoryWriter | None, on_event: Event) -> None:
    """Record the run's end: its timings, its end line, the `end` event."""
    trajectory.timings = {
        "wall_s": wall_s,
        "model_s": sum(t.latency_s for t in trajectory.turns),
        "tool_s": sum(r.latency_s for t in trajectory.turns for r in t.tool_results),
    }
    if writer:
        try:
            writer.end(trajectory)
        except TrajectoryWriteError as exc:  # not logged: the run's own exception, if any, goes on
            trajectory.stop_reason, trajectory.error = "write_error", str(exc)
    on_event("end", trajectory)


async def _turns(
    state: Run, llm: LLM, toolbox: Toolbox | None, config: AgentConfig, writer: TrajectoryWriter | None, on_event: Event
) -> None:
    """Ask the model and act on its reply, turn after turn, until a limit or a reply stops the loop; then
    the run's end (all that a resumed run whose last turn had ended the loop has left to make)."""
    trajectory = state.trajectory
    request_tools = dialects.request_tools(config.dialect, trajectory.tools)
    while not trajectory.stop_reason:
        prompt_tokens = next_prompt_tokens(llm, state, request_tools)
        if stop := _limit_reached(state, llm, config, prompt_tokens):
            trajectory.stop_reason, trajectory.error = stop
            await end_run(state, llm, config, prompt_tokens, writer, on_event)
            return
        on_event("model", turns_used(state))
        try:
            completion = await llm.complete(
                state.history.messages,
                request_tools,
                conversation=state.conversation,
                **streaming_options(config, on_event),
            )
        except ContextOverflow as exc:  # our estimate was low: answer from what fits
            trajectory.stop_reason, trajectory.error = "context_limit", str(exc)
            await end_run(state, llm, config, prompt_tokens, writer, on_event, omit_latest=True)
            return
        except ModelError as exc:  # the model cannot be asked for an answer either
            trajectory.stop_reason, trajectory.error = "model_error", str(exc)
            return
        turn = new_turn(trajectory, completion, state.tracker)
        served = served_by(llm) is not None
        if not trajectory.turns and (unseen := replies.tools_unseen(turn, request_tools, llm.config.model, served)):
            on_event("warning", unseen)
        await _act(turn, state, toolbox, config, writer, on_event)
    await end_run(state, llm, config, None, writer, on_event)


def _limit_reached(state: Run, llm: LLM, config: AgentConfig, prompt_tokens: int) -> tuple[str, str | None] | None:
    """Why the loop must stop before the next model call, and what that says, or None: the turns
    (rolled-back replies count only towards a bound of their own), a budget, or the context, which must
    hold the next prompt, the longest reply and the margin. The time limit cuts the run short wherever it
    is instead (`asyncio.timeout` in `run`)."""
    if turns_used(state) >= config.max_turns or len(state.trajectory.turns) >= config.max_turns + EXTRA_ATTEMPTS:
        return "max_turns", None
    if spent := over_budget(state.trajectory.usage, config.budgets):
        return "budget", spent
    if prompt_tokens + llm.config.max_tokens + _margin(state, config) > config.max_context:
        return "context_limit", None
    return None


async def _act(
    turn: Turn,
    state: Run,
    toolbox: Toolbox | None,
    config: AgentConfig,
    writer: TrajectoryWriter | None,
    on_event: Event,
) -> None:
    """Log the reply as a turn: rolled back when unusable, else with its tool calls run, or as the
    answer that ends the loop (with rollback off, so do too many format errors in a row)."""
    trajectory, history = state.trajectory, state.history
    parsed = dialects.parse_reply(config.dialect, turn.assistant, trajectory.tools, config.reference)
    turn.tool_calls = parsed.tool_calls
    problem = replies.unusable(turn, parsed, config.reference, trajectory.turns) if config.rollback else None
    if problem is not None:  # dropped: the next prompt is this one again, and the model samples anew
        turn.format_error, turn.rolled_back = problem, True
        turn.consumed = replies.used_up(trajectory.turns, turn, RESAMPLES)
        turn.tool_calls = []  # none of its calls ran (each recorded call has its result)
        log_turn(trajectory, turn, writer, on_event)
    else:
        turn.format_error = parsed.format_error or (
            (dialects.EMPTY_REPLY if replies.empty(turn) else None)
            if config.rollback
            else replies.reply_problem(turn, parsed, config.dialect)
        )
        if not turn.tool_calls and turn.format_error is None:
            trajectory.answer = replies.reply_answer(turn, config)
            trajectory.stop_reason = "answered"
        await _run_calls(turn, parsed, state, toolbox, config, on_event)
        log_turn(trajectory, turn, writer, on_event)
        history.add_turn(
            dialects.history_message(config.dialect, turn.assistant),
            dialects.observation_messages(config.dialect, turn),
            tool_results=bool(turn.tool_calls),
        )
        if config.release_results and writer is not None:
            release_unseen_results(trajectory.turns, config.keep_tool_results, RELEASED)
    if (
        not trajectory.stop_reason
        and not config.rollback
        and replies.format_errors_in_a_row(trajectory.turns) >= config.max_format_errors
    ):
        trajectory.stop_reason = "format_errors"


async def _run_calls(
    turn: Turn, parsed: dialects.ParsedReply, state: Run, toolbox: Toolbox | None, config: AgentConfig, on_event: Event
) -> None:
    """Run the turn's tool calls one after another; calls that cannot run get an error result."""
    earlier = state.trajectory.turns
    for position, call in enumerate(turn.tool_calls):
        on_event("tool", call)
        if position in parsed.call_errors:
            result = ToolResult(text=parsed.call_errors[position], is_error=True)
        elif (
            config.dialect == "mcp-xml"
            and (note := duplicate_note(config.reference))
            and (query := used_query(earlier, turn, position, query_tools(config.reference))) is not None
        ):
            result = ToolResult(text=note.format(query=query, tool=call.name))
        elif config.dialect != "mcp-xml" and repeated_call(earlier, call, config.repeat_limit):
            result = ToolResult(
                text=f"This exact call was already made {config.repeat_limit - 1} times in a row "
                "and was not run again. Try a different call, or answer.",
                is_error=True,
            )
        elif toolbox is None:
            result = ToolResult(text="No tools are available.", is_error=True)
        else:
            result = await toolbox.call(call, state.restarts)
        turn.tool_results.append(result)


def _margin(state: Run, config: AgentConfig) -> int:
    """Tokens the context must hold beyond the next prompt and the reply: in the reference's flow
    (mcp-xml with its summary turn) its own check's, else `context_reserve`."""
    if config.dialect != "mcp-xml" or not config.summary_turn:
        return config.context_reserve
    if state.summary_tokens is None:
        state.summary_tokens = estimate_tokens(
            dialects.final_answer_instruction(config.dialect, state.trajectory.question, True, config.reference)
        )
    return reference_margin(state.history.messages, state.summary_tokens, bool(state.trajectory.turns))
