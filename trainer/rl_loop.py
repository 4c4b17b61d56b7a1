"""`nanbeige loop --iterations N`: collect -> judge -> train -> sync, N iterations, resumable at any stage.

    out/iter-<i>/questions.jsonl  the questions drawn for the iteration (all, or the next batch of the file)
    out/iter-<i>/rollouts.jsonl   G rollouts per question, sampled by the current policy (`collect`)
    out/iter-<i>/judged.jsonl     the same, with rewards (`judge`)
    out/iter-<i>/train/           the checkpoints trained on them (`train`)
    out/loop.json                 the state: the stages done per iteration, and the current policy

Iteration i trains from iteration i-1's checkpoint (the first from `TrainConfig.model`), then makes
the new checkpoint the policy the next iteration samples from:
- `sync="lora"`: the new adapter is hot-loaded into the serving vLLM (`POST /v1/load_lora_adapter`)
  under the checkpoint's absolute path as its name, and the next collect asks for that model. The
  name is a path because token mode loads the tokenizer from the model name, and the checkpoint
  holds one. With LoRA every iteration goes on training one adapter on the base model (seeded from
  the last checkpoint's adapter and optimizer state), since vLLM applies an adapter to the base model.
- `sync="weights"`: full fine-tuning; the new checkpoint's weights are loaded into the running vLLM
  in place, through vLLM's own RL path (`reload_weights`, see `sync.load_weights`), and the next collect
  asks for the same served model. The server must be started with `nanbeige serve --weight-sync`.
- Every engine is synced (`settings.llm.urls()`, or `admin_urls` behind a router), but one that says it serves
  the policy already; the iteration is synced once every engine says so (`loop.json` records who serves what).
  Collect asks them again first: while they differ it does not start, and the previous iteration is no longer
  synced, so the next call syncs the engines that lack its policy (a restarted one) and goes on.
- `sync="none"`: nothing is sent anywhere. In process (`--backend transformers`) the next collect
  loads the new checkpoint folder itself; against a server it samples from whatever the server
  serves, so restart the server on the new checkpoint between iterations (run one iteration at a
  time, `iterations` 1, 2, ...: each call resumes the last) to stay on-policy.

Dynamic sampling (DAPO's, `min_informative_groups`): an iteration draws `questions_per_iteration`
questions from the file in order (going round across iterations); after judging, while fewer groups than
asked are kept by the trainer's group filter (`batches.group_verdict`: the pass-rate band, or k of n passing,
solved or complexity-satisfying), it draws the next questions and collects and judges
them too, at most `max_draws` times. The groups outside the band are then dropped by the trainer as usual.

The state file is rewritten (atomically) after each stage, so a run stopped anywhere goes on where
it stopped when called again with the same out folder: done stages are skipped; an interrupted
collect or judge resumes its own out file, and an interrupted training resumes from its newest
checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanbeige.evals.files import first_link
from nanbeige.tools.errors import NanbeigeError
from nanbeige.trainer.loop_config import LoopConfig, LoopError, check
from nanbeige.trainer.loop_engines import engines_agree, sampling_settings, sync_stage
from nanbeige.trainer.loop_questions import draw_questions, drawn, question_pool
from nanbeige.trainer.loop_state import (
    STAGES,
    STATE,
    Collected,
    Judged,
    LoopState,
    Policy,
    Trained,
    new_state,
    read_state,
    write_state,
)
from nanbeige.trainer.model import trainable_model
from nanbeige.trainer.train import TrainConfig

# ---------------------------------------------------------------- the stages


async def collect_stage(config: LoopConfig, policy: Policy, folder: Path, notice: Callable[[str], None]) -> Collected:
    """G rollouts per question with the iteration's policy (collect resumes its own file)."""
    from nanbeige.agent.setup.model_setup import template_file
    from nanbeige.trainer.collect import CollectConfig, collect

    settings, backend = config.settings, config.settings.backend
    if backend.token_mode:
        # the first model's template for every iteration, whichever folder the iteration's policy is in
        backend = dataclasses.replace(backend, chat_template=template_file(settings, settings.llm.model))
    settings = dataclasses.replace(settings, backend=backend, llm=dataclasses.replace(settings.llm, model=policy.model))
    settings = await sampling_settings(config, settings, policy)
    collect_config = CollectConfig(
        out=folder / "rollouts.jsonl",
        questions=folder / "questions.jsonl",
        group_size=config.group_size,
        concurrency=config.collect_concurrency,
        ray=config.ray,
    )
    summary = await collect(collect_config, settings, notice)
    if summary["failed"]:  # not written: the next call retries them, so the stage is not done
        raise LoopError(f"{summary['failed']} rollouts failed on the model server (last: {summary['last_error']})")
    return Collected(summary["rollouts"], summary["pass_rate"], settings.llm.model)


async def judge_stage(
    config: LoopConfig, policy: Policy, iteration: int, folder: Path, notice: Callable[[str], None]
) -> Judged:
    """Judge the rollouts; with dynamic sampling, draw, collect and judge more until enough groups are
    informative or the draws run out."""
    from nanbeige.agent.trajectory.trajectory_file import load_trajectories
    from nanbeige.trainer.batches import describe_band
    from nanbeige.trainer.loop_ray import judge_rollouts
    from nanbeige.trainer.rollouts import rollout_summary

    judged = folder / "judged.jsonl"
    while True:
        summary = await judge_rollouts(config.judge, config.ray, folder, notice)
        trajectories = load_trajectories(judged) if judged.exists() else []
        informative, groups = informative_groups(trajectories, config.train)
        have = drawn(folder)
        draws = -(-have // (config.questions_per_iteration or max(1, have)))
        if (
            informative >= config.min_informative_groups
            or draws >= config.max_draws
            or not draw_questions(config, iteration, folder)
        ):
            break
        notice(
            f"loop: iteration {iteration}: {informative} of {groups} groups with "
            f"{describe_band(config.train.groups)}, {config.min_informative_groups} wanted: drawing "
            f"{config.questions_per_iteration} more questions"
        )
        await collect_stage(config, policy, folder, notice)
    return Judged(
        judged=summary["judged"] + summary["already_judged"],
        mean_reward=summary["mean_reward"],
        outcome_errors=summary["outcome_errors"],
        masked_turns=summary["masked_turns"],
        groups=groups,
        informative_groups=informative,
        questions=drawn(folder),
        # the trainer's own summary of the judged rollouts: the pass rate and the share that called a tool
        **{name: round(value, 4) for name, value in rollout_summary(trajectories).items() if name in SHARES},
    )


SHARES = ("pass_rate", "tool_use")
"""What the loop's record and its line per iteration give of the judged rollouts' summary."""


def informative_groups(trajectories: list[Any], train: TrainConfig) -> tuple[int, int]:
    """How many of the judged groups the trainer's group filter keeps (`group_verdict`, the trainer's own
    decision, over the rollouts with an outcome reward), and how many groups there are."""
    from nanbeige.trainer.batches import group_verdict

    groups: dict[str, list[Any]] = {}
    for trajectory in trajectories:
        if trajectory.reward is not None:
            groups.setdefault(trajectory.group_id or trajectory.id, []).append(trajectory)
    return sum(group_verdict(group, train.groups) == "kept" for group in groups.values()), len(groups)


def train_config_for(config: LoopConfig, policy: Policy, folder: Path) -> TrainConfig:
    """The iteration's training: on its judged rollouts, from the previous checkpoint. With LoRA the
    model stays the base one and training goes on from the previous adapter and its optimizer state:
    a fresh adapter on a merged checkpoint would be wrong on a server that applies it to the base model."""
    previous = Path(policy.checkpoint) if policy.checkpoint else None
    model = str(previous) if previous and not config.train.lora_rank else config.train.model
    init_from = previous if previous and config.train.lora_rank else None
    return dataclasses.replace(
        config.train, data=[folder / "judged.jsonl"], model=model, out=folder / "train", init_from=init_from
    )


async def train_stage(config: LoopConfig, policy: Policy, folder: Path, notice: Callable[[str], None]) -> Trained:
    """Train in a thread (the event loop stays free), resuming from the newest checkpoint in the folder."""
    from nanbeige.trainer.train import train

    train_config = train_config_for(config, policy, folder)
    summary = await asyncio.to_thread(train, train_config, True, notice)
    checkpoint = str(Path(summary["checkpoint"]).resolve())
    return Trained(checkpoint, summary["steps"], summary["rows"])


# ---------------------------------------------------------------- the loop


SAMPLE = ("collected", "judged")
LEARN = ("trained", "synced")
"""An iteration's two halves: sampling its rollouts with the policy it records, and learning from them."""


async def run_stages(
    config: LoopConfig, state: LoopState, iteration: int, stages: tuple[str, ...], notice: Callable[[str], None]
) -> None:
    """The iteration's `stages` not yet done, the state written after each. Training starts from the newest
    policy (`state.policy`): with a max staleness of 0 the one the iteration sampled, above 0 perhaps a later one."""
    entry = state.iteration(iteration)
    folder = config.out / f"iter-{iteration}"
    folder.mkdir(parents=True, exist_ok=True)
    if not drawn(folder):
        draw_questions(config, iteration, folder)
    work: dict[str, Callable[[], Any]] = {
        "collected": lambda: collect_stage(config, entry.policy, folder, notice),
        "judged": lambda: judge_stage(config, entry.policy, iteration, folder, notice),
        "trained": lambda: train_stage(config, state.policy, folder, notice),
        "synced": lambda: sync_stage(config, state, entry.trained.checkpoint, iteration, notice),
    }
    for stage in stages:
        if getattr(entry, stage) is not None:
            continue
        started = time.monotonic()
        try:
            setattr(entry, stage, await work[stage]())
        except NanbeigeError as exc:  # a stage's CollectError, JudgeError, TrainError, SetupError, SyncError ...
            write_state(config.out, state)  # what was done before the failure (engines a sync reached)
            raise LoopError(
                f"iteration {iteration}, {STAGES[stage]}: {exc} "
                f"(the state is in {config.out / STATE}: run the same loop again to resume)"
            ) from None
        # each stage's wall time, only reported (a resumed stage counts from the call that finished it)
        entry.seconds[stage] = round(time.monotonic() - started, 1)
        if stage == "synced" and entry.synced.number() >= state.policy.number():
            state.policy = entry.synced  # never back to an older policy (an older iteration synced again)
        write_state(config.out, state)
        notice(f"loop: iteration {iteration} {stage}: {json.dumps(dataclasses.asdict(getattr(entry, stage)))}")


async def start_sampling(config: LoopConfig, state: LoopState, iteration: int, notice: Callable[[str], None]) -> bool:
    """Before an iteration samples: its record (made now, sampling the newest policy), and the engines asked
    whether they all serve that policy. False when its sampling is done already. A new record is written at
    once: a loop stopped in its collect samples the rest with the policy it admitted it with."""
    new = len(state.iterations) < iteration
    entry = state.iteration(iteration)
    if new:
        write_state(config.out, state)
    if entry.judged is not None:
        return False
    if entry.collected is None:
        await engines_agree(config, state, iteration, notice)
        if iteration == 1:  # the model the first train stage starts from, decided before anything is sampled
            trainable_model(config.train.model, notice)
    return True


async def run_iteration(config: LoopConfig, state: LoopState, iteration: int, notice: Callable[[str], None]) -> None:
    """The iteration's stages not yet done, in order: the synchronous loop (a max staleness of 0)."""
    await start_sampling(config, state, iteration, notice)
    await run_stages(config, state, iteration, SAMPLE + LEARN, notice)


async def run_overlapped(config: LoopConfig, state: LoopState, notice: Callable[[str], None]) -> None:
    """A max staleness K above 0: sampling and learning as two lanes. The sampler takes the iterations in
    order, and iteration i starts sampling once iteration i-1-K is synced (AReaL's admission rule, at the grain
    of an iteration: its policy is never more than K versions behind the one it trains from, and nothing
    sampled is dropped for its age); the learner trains each iteration as soon as it is judged, from the
    newest policy, and syncs it. A sync and the start of a collect never interleave (the collect checks what
    the engines serve); a collect already running goes on (with weights sync its later turns come from the
    newer weights, their sampler's logprobs recorded as sampled)."""
    iterations, staleness = config.iterations, config.max_staleness
    synced = {number: asyncio.Event() for number in range(iterations + 1)}
    judged = {number: asyncio.Event() for number in range(1, iterations + 1)}
    synced[0].set()
    for entry in state.iterations[:iterations]:  # a resumed loop (asked for fewer iterations: the first ones)
        if entry.synced is not None:
            synced[entry.iteration].set()
    policy_change, stop = asyncio.Lock(), asyncio.Event()

    async def sample() -> None:
        for number in range(1, iterations + 1):
            await synced[max(0, number - 1 - staleness)].wait()
            if number <= len(state.iterations):  # admitted before (resumed): the policy it samples served again first
                # a version above its own number is none a loop wrote (a state edited by hand): its own bound
                await synced[min(state.iterations[number - 1].policy.number(), number - 1)].wait()
            async with policy_change:
                started = await start_sampling(config, state, number, notice)
            if started:
                await run_stages(config, state, number, SAMPLE, notice)
            judged[number].set()

    async def learn() -> None:
        for number in range(1, iterations + 1):
            if not await first_of(judged[number], stop):
                return  # the sampler failed: nothing more to train
            await run_stages(config, state, number, ("trained",), notice)
            if stop.is_set():
                return  # trained and recorded; the rerun syncs it
            async with policy_change:
                await run_stages(config, state, number, ("synced",), notice)
            synced[number].set()

    sampler, learner = asyncio.ensure_future(sample()), asyncio.ensure_future(learn())
    try:
        await asyncio.wait([sampler, learner], return_when=asyncio.FIRST_EXCEPTION)
        if sampler.done() and sampler.exception() is not None and not learner.done():
            # training runs in a thread a cancel cannot stop: let the step in progress finish and be recorded
            notice(f"loop: stopping once the training in progress is recorded: {sampler.exception()}")
            stop.set()
            await asyncio.gather(learner, return_exceptions=True)
        for lane in (sampler, learner):
            if lane.done() and not lane.cancelled() and lane.exception() is not None:
                raise lane.exception()  # the first failure, as the synchronous loop raises it
    finally:
        for lane in (sampler, learner):
            lane.cancel()
        await asyncio.gather(sampler, learner, return_exceptions=True)


async def first_of(wanted: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for `wanted` or `stop`, whichever is set first; whether `wanted` is."""
    waits = [asyncio.ensure_future(wanted.wait()), asyncio.ensure_future(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    return wanted.is_set()


async def run_loop(config: LoopConfig, notice: Callable[[str], None], resume: bool = True) -> dict[str, Any]:
    """Run (or, with `resume`, go on with) the loop in `config.out`; returns a summary per iteration.
    Without `resume` an out folder that already holds a loop is refused rather than overwritten."""
    check(config)
    question_pool(config)  # refused before any folder is made
    link = first_link(config.out) if config.out.is_dir() else None
    if link is not None:  # a loop folder may be someone else's: a link would lead what it reads or writes elsewhere
        raise LoopError(
            f"{link} is a symbolic link: a loop's files are read and written only inside its folder {config.out}; "
            "remove the link, or pass another out folder"
        )
    state = read_state(config.out, config.settings.llm.model)
    if state is not None and not resume:
        raise LoopError(f"{config.out} already holds a loop ({STATE}): resume it, or pass another out folder")
    if state is None:
        config.out.mkdir(parents=True, exist_ok=True)
        state = new_state(config)
        write_state(config.out, state)
    if config.max_staleness:
        await run_overlapped(config, state, notice)
    else:
        for iteration in range(1, config.iterations + 1):
            await run_iteration(config, state, iteration, notice)
    return {
        "out": str(config.out),
        "policy": dataclasses.asdict(state.policy),
        "iterations": [entry.summary() for entry in state.iterations],
    }
