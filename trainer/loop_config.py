"""What `nanbeige loop` is told (`LoopConfig`: the iterations, the stages' own configs, the sync), and
the check that refuses a configuration that cannot work before any stage runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nanbeige.agent.run.run_config import RunSettings
from nanbeige.tools.errors import NanbeigeError
from nanbeige.trainer.judge_config import JudgeRunConfig
from nanbeige.trainer.train import TrainConfig
from nanbeige.trainer.train_config import rule_problem

SYNCS = ("lora", "weights", "none")


class LoopError(NanbeigeError):
    """A stage of the loop failed, or the loop is misconfigured; one line naming the fix."""


@dataclass
class LoopConfig:
    """What the loop runs each iteration; the stages' own configs say how."""

    iterations: int
    """Iterations to have done in `out` (calling again with a larger number goes on)."""
    out: Path
    """Folder for every iteration's files and the state file `loop.json`."""
    questions: Path
    """The questions file collect samples rollouts for (JSONL or CSV: `question`, `answer`, `id`); with the
    judge's grader `code-tests`, the code problems file (`evals/code_problems.py`)."""
    settings: RunSettings
    """How collect runs the agent: the model server or the in-process model, the tools, the limits.
    Its `llm.model` is the first iteration's policy."""
    judge: JudgeRunConfig
    """How the rollouts are judged (grader, critic)."""
    train: TrainConfig
    """The training template: its `data`, `model` and `out` are set per iteration (`model` is the
    starting point of the first iteration, and with LoRA the base model of every one)."""
    group_size: int = 8
    """Rollouts per question (G)."""
    collect_concurrency: int = 8
    """Rollouts at once."""
    questions_per_iteration: int | None = None
    """Questions an iteration draws from the file, in order and going round; None: all of them each time."""
    min_informative_groups: int = 0
    """Dynamic sampling: draw more questions while fewer groups than this are kept by the trainer's group
    filter (`train.groups`: the `min_pass_rate`..`max_pass_rate` band or `k_of_n`; 0: one draw, whatever the
    groups)."""
    max_draws: int = 4
    """The most draws of `questions_per_iteration` questions an iteration makes."""
    sync: str = "lora"
    """`lora`: hot-load each new adapter into the serving vLLM; `weights`: load each new checkpoint's weights
    into it in place; `none`: send nothing (in process the next collect loads the new checkpoint; against a
    server, restart it on the checkpoint)."""
    admin_urls: tuple[str, ...] = ()
    """The engines to sync, each its own vLLM, when they are not the endpoints collect asks: engines behind a
    router (vllm-router), whose address is the only base URL. Empty: every endpoint of `settings.llm`."""
    held_out: Path | None = None
    """Questions the loop must never train on (those the policy is evaluated on): a question of `questions`
    with the same id or text is refused before anything runs (`loop_questions.py`)."""
    ray: str | None = None
    """Run each iteration's collect and judge in shards on the Ray cluster at this address (`auto`, or the
    head's HOST:PORT; `loop_ray.py`); None: in this process. Training is never sharded by it."""
    max_staleness: int = 0
    """How many policy versions the policy an iteration samples may lag behind the one it trains from. 0: each
    iteration samples the policy the previous one trained (collect waits for training). K > 0: iteration i's
    collect and judge start once iteration i-1-K is synced, while earlier iterations train, so sampling and
    training overlap; its rollouts then come from an older policy than the one trained, which the trainer's
    importance weight corrects (decoupled PPO: `loss.py`)."""


def check(config: LoopConfig) -> None:
    """Refuse a configuration that cannot work, before anything runs."""
    if os.environ.get("WORLD_SIZE", "1") != "1":  # under torchrun every process would run the whole loop
        raise LoopError(
            "the loop trains in its own process: run it without torchrun (across machines, run "
            "collect, judge and `torchrun ... nanbeige train` one after another)"
        )
    if config.sync not in SYNCS:
        raise LoopError(f"sync must be one of {', '.join(SYNCS)}, not {config.sync!r}")
    if config.iterations < 1:
        raise LoopError("iterations must be at least 1")
    if config.max_staleness < 0:
        raise LoopError(f"max staleness must be 0 or more, not {config.max_staleness}")
    if config.max_staleness and config.sync == "none":
        raise LoopError(
            "a max staleness above 0 samples while training and syncs each new policy into the serving vLLM, "
            "and sync none syncs nothing: use sync lora or weights, or a max staleness of 0"
        )
    if config.sync == "lora" and not config.train.lora_rank:
        raise LoopError(
            "sync lora hot-loads a LoRA adapter into vLLM: train with a LoRA rank, or use sync none "
            "(and serve each new checkpoint)"
        )
    if config.sync == "weights" and config.train.lora_rank:
        raise LoopError(
            "sync weights loads full checkpoints into vLLM: train every parameter (LoRA rank 0), or use sync lora"
        )
    if config.admin_urls and config.sync == "none":
        raise LoopError(
            "admin URLs name the engines the loop syncs, and sync none syncs none: leave them out, or "
            "use sync lora or weights"
        )
    if config.sync != "none" and config.settings.backend.backend == "transformers":
        raise LoopError(
            f"sync {config.sync} updates a vLLM server, and the in-process backend has none: use sync "
            "none, where each iteration's collect loads the new checkpoint"
        )
    if not config.questions.is_file():
        raise LoopError(f"{config.questions}: no such questions file")
    problem = rule_problem(config.train.groups)
    if problem is not None:
        raise LoopError(problem)
    if config.min_informative_groups and not config.questions_per_iteration:
        raise LoopError(
            "dynamic sampling (min informative groups) draws more questions in batches: give the "
            "questions per iteration"
        )
