"""How a run ends once its loop stopped: with the summary turn (whatever the reason, when it is on), with
a final-answer turn at a limit, or as it is. The final turn is one model call without tools, asked with
what the context still has room for."""

from __future__ import annotations

from typing import Any

from nanbeige.agent.backends.llm import LLM, ModelError
from nanbeige.agent.run import dialects, replies
from nanbeige.agent.run.context import estimate_tokens, step_back
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
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter

MIN_ANSWER_TOKENS = 512  # the final answer turn needs at least this much room to be worth making
FINAL_ANSWER_TOKENS = 4096  # room wanted for the final answer (a thinking model reasons first)


async def end_run(
    state: Run,
    llm: LLM,
    config: AgentConfig,
    prompt_tokens: int | None,
    writer: TrajectoryWriter | None,
    on_event: Event,
    omit_latest: bool = False,
) -> None:
    """How a run ends once its loop stopped: with the summary turn (whatever the reason, when it is
    on), with a final-answer turn at a limit, or as it is."""
    limit = state.trajectory.stop_reason in ("max_turns", "context_limit", "budget")
    if state.trajectory.stop_reason == "model_error" or not (
        config.summary_turn or (config.final_answer_turn and limit)
    ):
        return
    if prompt_tokens is None:
        prompt_tokens = next_prompt_tokens(llm, state, None)
    await final_turn(state, llm, config, prompt_tokens, writer, on_event, omit_latest)


async def final_turn(
    state: Run,
    llm: LLM,
    config: AgentConfig,
    prompt_tokens: int,
    writer: TrajectoryWriter | None,
    on_event: Event,
    omit_latest: bool = False,
) -> None:
    """One call without tools that asks for the answer (`final_request` says with what); as the
    summary turn, asked again while a reply has no boxed answer, as many times as the reference tries."""
    trajectory = state.trajectory
    instruction = dialects.final_answer_instruction(
        config.dialect, trajectory.question, bool(config.summary_turn), config.reference
    )
    messages, room, omitted = final_request(state, llm, config, prompt_tokens, instruction, omit_latest)
    if room < MIN_ANSWER_TOKENS:
        trajectory.error = trajectory.error or "no room left in the context for a final answer"
        return
    request = [*messages, {"role": "user", "content": instruction}]
    # the reference's summary tries (1 in v1.0; 3 in some later commits): a reply without a boxed
    # answer is dropped and the summary asked for again
    tries = config.reference.summary_attempts(config.keep_tool_results) if config.reference else 1
    for attempt in range(tries if config.summary_turn else 1):
        on_event("model", turns_used(state))
        try:
            completion = await llm.complete(
                request,
                None,
                max_tokens=min(llm.config.max_tokens, room),
                conversation=state.conversation,
                **streaming_options(config, on_event),
            )
        except ModelError as exc:
            trajectory.error = str(exc)
            return
        turn = new_turn(trajectory, completion, state.tracker)
        turn.instruction, turn.omitted_latest_results = instruction, omitted
        answer = replies.final_answer(turn, config.dialect, bool(config.summary_turn))
        if answer is None:
            turn.format_error = "The reply to the final-answer request had no usable answer."
            turn.rolled_back = attempt < tries - 1
        log_turn(trajectory, turn, writer, on_event)
        if answer is not None:
            break
    if answer is None and config.summary_turn:
        answer = replies.latest_boxed(trajectory.turns)
    trajectory.answer = answer if answer is not None else trajectory.answer


def final_request(
    state: Run, llm: LLM, config: AgentConfig, prompt_tokens: int, instruction: str, omit_latest: bool
) -> tuple[list[dict[str, Any]], int, bool]:
    """The messages the final-answer turn is asked with before its instruction, the room left for its
    reply, and whether the newest tool results were left out. As the summary turn, a trailing tool
    result (or other user message) is dropped first, as the reference harness does. The newest tool
    results are also left out when the answer would otherwise have too little room (or the server said
    it did not fit)."""
    history = state.history
    messages = history.messages
    room = config.max_context - prompt_tokens - estimate_tokens(instruction)
    dropped = bool(config.summary_turn) and len(messages) > 2 and messages[-1]["role"] == "user"
    omitted = (
        not dropped
        and bool(history.observations)
        and (omit_latest or room < min(llm.config.max_tokens, FINAL_ANSWER_TOKENS))
    )
    if dropped:
        if config.dialect == "mcp-xml" and state.trajectory.stop_reason == "context_limit" and not omit_latest:
            # the reference steps back the whole last turn when its context check trips; then, as at
            # its turn limit, drops the tool result that is last after that (a server's refusal of a
            # prompt too long only drops the trailing result)
            messages, omitted = step_back(messages), True
        messages = messages[:-1] if messages[-1]["role"] == "user" else messages
        room += sum(estimate_tokens(m["content"] or "") for m in history.messages[len(messages) :])
    elif omitted:
        messages = history.omit_latest()
        room += history.latest_tool_result_tokens()
    if config.summary_turn:  # the summary prompt is one of the K results the reference shows
        messages = history.summary_view(messages)
    omitted = omitted or (
        dropped and bool(history.observations) and history.observations[-1][-1] == len(history.messages) - 1
    )
    return messages, room, omitted
