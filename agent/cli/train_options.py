"""The flags of `nanbeige train` and `nanbeige loop`, as option tables (`option_tables.with_options`): what training
takes (`TRAINING`), what the loop takes beyond it (`LOOP`), and the choices among them as enums, so that the
parser refuses a value no choice has. `train` takes the loop's flags too, each said to be "With --loop", for
`train --loop N`, the loop's older spelling."""

from __future__ import annotations

import copy
import enum
import typing
from pathlib import Path
from typing import Any

from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.command_options import COLLECT, COLLECT_RUN
from nanbeige.agent.cli.judge_options import CRITIC
from nanbeige.agent.cli.option_tables import in_panel
from nanbeige.agent.cli.options import option
from nanbeige.trainer.train import TrainConfig


class Objective(str, enum.Enum):
    grpo = "grpo"
    sft = "sft"


class LrSchedule(str, enum.Enum):
    constant = "constant"
    cosine = "cosine"


class AdvantageStd(str, enum.Enum):
    sample = "sample"
    population = "population"
    none = "none"


class SingleRollout(str, enum.Enum):
    zero = "zero"
    reward = "reward"


class Truncated(str, enum.Enum):
    train = "train"
    mask = "mask"


class Dtype(str, enum.Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


class Packing(str, enum.Enum):
    auto = "auto"
    on = "on"
    off = "off"


class Sync(str, enum.Enum):
    """How each new policy reaches the serving vLLM (`trainer.loop_config.SYNCS`)."""

    lora = "lora"
    weights = "weights"
    none = "none"


class OutcomeGrader(str, enum.Enum):
    """The loop's outcome graders that need no judge model."""

    gaia_exact = "gaia-exact"
    token_f1 = "token-f1"


OBJECTIVE = "Objective"
LOOP_PANEL = "Loop"

# What one training run takes, in the order the help pages list them.
TRAINING: dict[str, tuple[Any, Any]] = {
    "model": option(
        str | None,
        None,
        help="The model to start from: a Hugging Face id or folder, or smollm2 (its de-quantized copy; required).",
        show_default=False,
    ),
    "out": option(
        Path | None,
        None,
        help="Folder for checkpoints, metrics.jsonl and TensorBoard events (required).",
        show_default=False,
    ),
    "data": option(list[Path] | None, None, help="Judged trajectory files (repeatable).", show_default=False),
    "objective": option(Objective, Objective.grpo, help="grpo, or sft (on passing rollouts, failed turns masked)."),
    "steps": option(
        int | None, None, min=1, help="Optimizer steps \\[default: one pass over the data].", show_default=False
    ),
    "epochs": option(
        int,
        1,
        min=1,
        help="Passes over the rollouts, without --steps: optimizer steps = "
        "mini-batches x epochs, all against one fixed pi_old.",
    ),
    "step_tokens": option(int, 65_536, min=1, help="Tokens per optimizer step (the mini-batch)."),
    "micro_tokens": option(int, 16_384, min=1, help="Padded tokens per micro-batch."),
    "lr": option(
        float | None, None, min=0.0, help="Learning rate \\[default: 1e-6, or 3e-5 with LoRA].", show_default=False
    ),
    "warmup_steps": option(int, 0, min=0, help="Linear warmup of the learning rate over N steps."),
    "lr_schedule": option(
        LrSchedule,
        LrSchedule.constant,
        help="After the warmup: constant, or cosine (to --min-lr-ratio x lr at the last step).",
    ),
    "min_lr_ratio": option(float, 0.0, min=0.0, max=1.0, help="Where cosine ends, as a fraction of lr."),
    "no_tensorboard": option(bool, False, "--no-tensorboard", help="No TensorBoard event files (only metrics.jsonl)."),
    "wandb_project": option(
        str | None, None, help="Also log to this Weights & Biases project (needs wandb).", show_default=False
    ),
    "lam": option(float, 1.0, "--lambda", help="Weight of the turn-level advantage (0: plain GRPO)."),
    "min_pass_rate": option(
        float, 0.1, min=0.0, max=1.0, help="Drop groups passing less often (the fraction --filter-counts counts)."
    ),
    "max_pass_rate": option(float, 0.9, min=0.0, max=1.0, help="Drop groups passing more often."),
    # text, checked with --keep in train_commands.group_filter: its one-line refusal names the choices
    "filter_counts": option(
        str,
        "pass",
        help="What the group filter counts: pass (outcome reward > 0; fully right for code-tests and token-f1), solved "
        "(the code grader's judge.solved) or complexity (judge.complexity_ok: "
        "solved at optimal complexity).",
    ),
    "keep": option(
        str | None,
        None,
        metavar="K-M/N",
        show_default=False,
        help="Keep groups with K to M of N rollouts counted, instead of the pass-rate band (1-5/8: "
        "Nanbeige4.1's code RL); another group size keeps the same fractions.",
    ),
    "advantage_std": option(
        AdvantageStd,
        AdvantageStd.sample,
        rich_help_panel=OBJECTIVE,
        help="GRPO's std: sample (GRPO, verl, TRL), population, or none (Dr.GRPO).",
    ),
    "single_rollout": option(
        SingleRollout,
        SingleRollout.zero,
        rich_help_panel=OBJECTIVE,
        help="A one-rollout group's advantage: zero (TRL) or reward (verl).",
    ),
    "truncated": option(
        Truncated,
        Truncated.train,
        rich_help_panel=OBJECTIVE,
        help="Rollouts cut at max turns, the context limit, the timeout or the budget: train, or "
        "mask (DAPO's overlong filtering).",
    ),
    "clip_low": option(
        float,
        TrainConfig.clip_low,
        min=0.0,
        max=1.0,
        rich_help_panel=OBJECTIVE,
        help="PPO clip below: ratio >= 1 - CLIP_LOW.",
    ),
    "clip_high": option(
        float,
        TrainConfig.clip_high,
        min=0.0,
        rich_help_panel=OBJECTIVE,
        help="PPO clip above (clip-higher): ratio <= 1 + CLIP_HIGH.",
    ),
    "clip_dual": option(
        float,
        TrainConfig.clip_dual,
        min=1.0,
        rich_help_panel=OBJECTIVE,
        help="Dual clip: a negative-advantage token loses at most CLIP_DUAL x |A|.",
    ),
    "tis_cap": option(
        float,
        TrainConfig.tis_cap,
        min=0.0,
        rich_help_panel=OBJECTIVE,
        help="Cap of the truncated importance weight pi_old / pi_rollout.",
    ),
    "max_rollout_drift": option(
        float,
        TrainConfig.max_rollout_drift,
        min=0.0,
        rich_help_panel=OBJECTIVE,
        help="Refuse rollouts further from the starting policy (mean |log ratio|).",
    ),
    "off_policy": option(
        bool,
        False,
        "--off-policy",
        rich_help_panel=OBJECTIVE,
        help="Train on rollouts sampled with top-p or penalties anyway (TIS corrects what it can).",
    ),
    "lora_rank": option(int, 0, min=0, help="LoRA rank (0: every parameter)."),
    "save_every": option(int, 0, min=0, help="Checkpoint every N steps (0: at the end)."),
    "resume": option(bool, False, help="Go on from the newest checkpoint in --out."),
    "no_gradient_checkpointing": option(
        bool, False, "--no-gradient-checkpointing", help="Keep activations (faster, more memory)."
    ),
    "dtype": option(
        Dtype,
        Dtype.auto,
        help="Weights: auto (float32, computing in bfloat16 on a GPU) or bfloat16 "
        "(half the memory; tiny updates are lost).",
    ),
    "chunk_tokens": option(int, 4096, min=1, help="Positions whose logits exist at once."),
    "packing": option(
        Packing,
        Packing.auto,
        help="on (rows end to end, no padding), off (padded micro-batches) or auto (on with flash attention).",
    ),
    "seed": option(int, 0, help="Seed of the row order."),
}

# Training flags the loop has no use for: it trains on what each iteration judged, and always goes on from
# where it stopped.
TRAINING_ONLY = ("data", "resume")

# What the loop takes beyond training, worded for `nanbeige loop` (`said_with_loop` words them for `train`).
LOOP: dict[str, tuple[Any, Any]] = {
    "questions": option(
        Path | None, None, rich_help_panel=LOOP_PANEL, show_default=False, help="The questions collect samples."
    ),
    "group_size": option(
        int, 8, "--group-size", "-G", min=1, rich_help_panel=LOOP_PANEL, help="Rollouts per question."
    ),
    "held_out": option(
        Path | None,
        None,
        rich_help_panel=LOOP_PANEL,
        show_default=False,
        help="Questions never to train on (those you evaluate on): a question of --questions with the same id "
        "or text is refused before anything runs.",
    ),
    "questions_per_iteration": option(
        int | None,
        None,
        min=1,
        rich_help_panel=LOOP_PANEL,
        show_default=False,
        help="Questions an iteration draws from the file, in order \\[default: all].",
    ),
    "min_informative_groups": option(
        int,
        0,
        min=0,
        rich_help_panel=LOOP_PANEL,
        help="Dynamic sampling, drawing more questions while fewer groups than this "
        "are kept by the group filter (the pass-rate band or --keep).",
    ),
    "max_draws": option(int, 4, min=1, rich_help_panel=LOOP_PANEL, help="The most draws an iteration makes."),
    "sync": option(
        Sync,
        Sync.lora,
        rich_help_panel=LOOP_PANEL,
        help="lora (hot-load each adapter into the serving vLLM), weights (load each full checkpoint "
        "into it in place; serve with --weight-sync) or none.",
    ),
    "admin_url": option(
        list[str] | None,
        None,
        "--admin-url",
        metavar="URL",
        show_default=False,
        rich_help_panel=LOOP_PANEL,
        help="A vLLM engine to sync (repeatable), when the engines sit behind a router whose "
        "address is the only --base-url \\[default: every --base-url].",
    ),
    "max_staleness": option(
        int,
        0,
        "--max-staleness",
        metavar="K",
        min=0,
        rich_help_panel=LOOP_PANEL,
        help="Sample while training: iteration i samples once iteration i-1-K is synced, from a policy at most "
        "K versions behind the one it trains from (needs --sync lora or weights). 0: each iteration samples "
        "the policy the last one trained.",
    ),
    "ray": option(
        str | None,
        None,
        "--ray",
        metavar="auto|HOST:PORT",
        show_default=False,
        rich_help_panel=LOOP_PANEL,
        callback=o.ray_address,
        help="Each iteration's collect and judge run in shards on a Ray cluster, as `collect --ray` and "
        "`judge --ray` run them: auto (the cluster `ray start` made this machine part of) or the "
        "head's address. Training stays in this process.",
    ),
    "grader": option(
        OutcomeGrader | None,
        None,
        rich_help_panel=LOOP_PANEL,
        show_default=False,
        help="How --questions' answers are graded: gaia-exact (exact match) or token-f1 (partial credit, the "
        "answer's word overlap with the reference) \\[default: gaia-exact].",
    ),
    "no_critic": option(bool, False, "--no-critic", rich_help_panel=LOOP_PANEL, help="Outcome rewards only."),
    "problems": option(
        Path | None,
        None,
        rich_help_panel=LOOP_PANEL,
        show_default=False,
        help="Code problems (JSONL) to sample instead of --questions, judged by running each program "
        "against its tests (code-tests).",
    ),
    "time_reward": option(
        bool,
        False,
        "--time-reward",
        rich_help_panel=LOOP_PANEL,
        help="With --problems: code RL's stage 2 time reward, from the judge at "
        "NANBEIGE_JUDGE_BASE_URL / _MODEL / _API_KEY.",
    ),
    **in_panel(CRITIC, LOOP_PANEL),
}

# The model server flags `train --loop` takes for its collect, whose other run settings keep their defaults
# (`nanbeige loop` takes every run flag collect takes).
SERVER: dict[str, tuple[Any, Any]] = {
    "base_url": o.RUN_OPTIONS["base_url"],
    "backend": o.RUN_OPTIONS["backend"],
    "token_mode": o.RUN_OPTIONS["token_mode"],
    "no_default_servers": o.RUN_OPTIONS["no_default_servers"],
    "request_timeout": o.RUN_OPTIONS["request_timeout"],
}

ITERATIONS = option(
    int,
    1,
    "--iterations",
    "-n",
    min=1,
    rich_help_panel=LOOP_PANEL,
    help="Iterations in all; a folder that has done some goes on with the next.",
)
OLD_LOOP = option(
    int,
    0,
    min=0,
    rich_help_panel=LOOP_PANEL,
    help="Alternate collect, judge, train and sync this many times (0: train once on --data).",
)


def said_with_loop(table: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The loop's flags as `train` lists them: each help text says the flag is for --loop."""
    said = {}
    for name, (flag, default) in table.items():
        kind, info = typing.get_args(flag)
        info = copy.copy(info)
        info.help = with_loop(info.help)
        said[name] = (typing.Annotated[kind, info], default)
    return said


def with_loop(text: str) -> str:
    """ "Rollouts per question." -> "With --loop: rollouts per question."; "With --problems: ..." ->
    "With --loop --problems: ..."."""
    if text.startswith("With --"):
        return "With --loop " + text.removeprefix("With ")
    first = text.split()[0]
    acronym = any(letter.isupper() for letter in first[1:])  # API and OpenAI stay as they are
    return "With --loop: " + (text if acronym else text[0].lower() + text[1:])


TRAIN = TRAINING | {"loop": OLD_LOOP} | said_with_loop(LOOP) | SERVER
"""`nanbeige train`'s flags: training's, then the loop's under --loop."""
LOOP_COMMAND = (
    {"iterations": ITERATIONS}
    | {name: flag for name, flag in TRAINING.items() if name not in TRAINING_ONLY}
    | LOOP
    | SERVER
    | {name: COLLECT[name] for name in COLLECT_RUN}
)
"""`nanbeige loop`'s own flags; it takes collect's run flags besides (`with_run_options`), so that its collect is
set up as `nanbeige collect` is."""
