"""`nanbeige train`: GRPO or SFT on judged trajectories; `nanbeige loop`: collect, judge, train and sync N
times (`train --loop N`, its older spelling, runs the same); `nanbeige train report RUN_DIR`, a run's curves.
Registered on the app in program.py; their flags are tables in train_options.py; the work is in `trainer/`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.command_options import COLLECT, COLLECT_LEAVES_OUT
from nanbeige.agent.cli.console import err, fail, hide
from nanbeige.agent.cli.help_screen import ShortHelpGroup
from nanbeige.agent.cli.judge_options import complexity_endpoint, critic_endpoint
from nanbeige.agent.cli.option_tables import with_options, with_run_options
from nanbeige.agent.cli.train_options import LOOP_COMMAND, SERVER, TRAIN
from nanbeige.agent.run.run_config import RunSettings
from nanbeige.trainer.train import TrainConfig
from nanbeige.trainer.train_config import COUNTS, GroupRule, parse_keep

if TYPE_CHECKING:
    from nanbeige.trainer.judge_config import JudgeRunConfig
    from nanbeige.trainer.loop_config import LoopConfig

train_app = typer.Typer(
    invoke_without_command=True,
    cls=ShortHelpGroup,
    help=(
        "Train the model on judged trajectories: GRPO with turn-level advantages, or SFT (`nanbeige loop` "
        "alternates collect, judge, train and sync). `nanbeige train report RUN_DIR` draws a run's curves."
    ),
)

OLD_SPELLING = (
    "note: the loop is now its own command, `nanbeige loop --iterations N` with the same flags; "
    "`train --loop N` still runs it, for this release"
)
"""Said after a `train --loop` run: after, so that a refusal stays one line."""


@train_app.callback()
@with_options(TRAIN)
def train(ctx: typer.Context, *, flags: dict[str, Any]) -> None:
    """Train the model on judged trajectories: GRPO with turn-level advantages, or SFT. Under torchrun
    (`torchrun --nproc-per-node N --no-python nanbeige train ...`) the model is sharded with FSDP2. The
    loop's older spelling, --loop N, runs `nanbeige loop --iterations N` for this release."""
    if ctx.invoked_subcommand is not None:
        return
    config = training(flags, flags["loop"], "nanbeige train --loop N")
    if flags["loop"]:
        start_loop(flags["loop"], flags, config, "--loop")
        err.print(f"[dim]{escape(OLD_SPELLING)}[/]", highlight=False)
        return
    if flags["admin_url"]:
        fail("--admin-url names the engines --loop syncs: it needs --loop", 2)
    if not flags["data"]:
        fail("--data is required: judged trajectory files (`nanbeige judge ... --out FILE`)", 2)
    train_once(config, flags["resume"])


@with_run_options(LOOP_COMMAND, leave_out=COLLECT_LEAVES_OUT)
def loop(*, flags: dict[str, Any], settings: RunSettings) -> None:
    """Alternate collect, judge, train and sync: each iteration samples the policy being trained, judges and
    trains on its rollouts and syncs the new policy to the server. Resumable: the same command goes on."""
    config = training(flags, flags["iterations"], "nanbeige loop")
    start_loop(flags["iterations"], flags, config, "nanbeige loop", settings)


def checked_flags(flags: dict[str, Any], loop: int, spelled: str) -> tuple[int, int, int] | None:
    """Refuse, in one line (exit 2), flags that cannot work together or an --out that cannot be written, before
    anything starts; the group filter's k of n when --keep gives one."""
    if flags["model"] is None or flags["out"] is None:
        fail(f"--{'model' if flags['model'] is None else 'out'} is required (see {spelled.split(' --')[0]} --help)", 2)
    from nanbeige.agent.trajectory.writable import unwritable_folder

    problem = unwritable_folder(flags["out"])
    if problem:
        fail(f"cannot write to --out {flags['out']}: {problem}", 2)
    if flags["min_pass_rate"] > flags["max_pass_rate"]:
        fail(f"--min-pass-rate {flags['min_pass_rate']} is above --max-pass-rate {flags['max_pass_rate']}", 2)
    problem = ray_problem(flags["ray"], loop, spelled)
    if problem:
        fail(problem, 2)
    k_of_n = group_filter(flags["filter_counts"], flags["keep"], flags["min_pass_rate"], flags["max_pass_rate"])
    if k_of_n is not None and flags["objective"] == "sft":
        fail(
            "--keep filters GRPO's groups; --objective sft has no group filter (--filter-counts says which "
            "rollouts it imitates)",
            2,
        )
    return k_of_n


def training(flags: dict[str, Any], loop: int, spelled: str) -> TrainConfig:
    """The training the flags describe, refused in one line (exit 2) where they cannot work together."""
    k_of_n = checked_flags(flags, loop, spelled)
    groups = GroupRule(
        lam=flags["lam"],
        min_pass_rate=flags["min_pass_rate"],
        max_pass_rate=flags["max_pass_rate"],
        counts=flags["filter_counts"],
        k_of_n=k_of_n,
        std=flags["advantage_std"],
        single=flags["single_rollout"],
        truncated=flags["truncated"],
    )
    same = (
        "model",
        "out",
        "objective",
        "steps",
        "epochs",
        "clip_low",
        "clip_high",
        "clip_dual",
        "tis_cap",
        "max_rollout_drift",
        "off_policy",
        "step_tokens",
        "warmup_steps",
        "lr_schedule",
        "min_lr_ratio",
        "wandb_project",
        "packing",
        "micro_tokens",
        "lr",
        "lora_rank",
        "save_every",
        "dtype",
        "seed",
        "chunk_tokens",
    )
    return TrainConfig(
        data=flags.get("data") or [],
        groups=groups,
        tensorboard=not flags["no_tensorboard"],
        gradient_checkpointing=not flags["no_gradient_checkpointing"],
        **{name: flags[name] for name in same},
    )


def train_once(config: TrainConfig, resume: bool) -> None:
    from nanbeige.trainer.train import train as run_training

    try:
        summary = run_training(config, resume=resume, log=lambda text: err.print(escape(text), highlight=False))
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted[/]; checkpoints so far are kept: --resume goes on from the newest", highlight=False
        )
        raise typer.Exit(130) from None
    if summary["checkpoint"]:
        err.print(f"checkpoint: {escape(summary['checkpoint'])}", highlight=False)


def start_loop(
    iterations: int, flags: dict[str, Any], config: TrainConfig, spelled: str, settings: RunSettings | None = None
) -> None:
    """The loop the flags describe, run (`spelled`: how the refusals name the loop, --loop or nanbeige loop), its
    collect run with `settings` (`train --loop`: the run flags' defaults but its model and server flags)."""
    from nanbeige.trainer.loop_config import LoopConfig

    questions, problems = flags["questions"], flags["problems"]
    if (questions is None) == (problems is None):
        fail(
            f"{spelled} needs --questions (the questions collect samples rollouts for) or --problems (code "
            "problems), one of them",
            2,
        )
    problem = admin_problem(flags["admin_url"] or [], flags["sync"], spelled)
    if problem:
        fail(problem, 2)
    if flags["max_staleness"] and flags["sync"] == "none":
        fail(
            f"--max-staleness {flags['max_staleness']} samples while training, each new policy synced into the "
            "serving vLLM, and --sync none syncs nothing: use --sync lora or weights, or --max-staleness 0",
            2,
        )
    if flags["time_reward"] and problems is None:
        fail("--time-reward rewards code problems' solutions: it needs --problems", 2)
    if flags["grader"] is not None and problems is not None:
        fail("--grader grades --questions' answers; code problems are graded by their tests: leave it out", 2)
    if settings is None:
        settings = o.run_settings({"model": flags["model"]} | {name: flags[name] for name in SERVER})
    run_train_loop(
        LoopConfig(
            iterations=iterations,
            out=config.out,
            questions=questions or problems,
            settings=settings,
            judge=judging(flags),
            train=config,
            group_size=flags["group_size"],
            sync=flags["sync"],
            admin_urls=tuple(flags["admin_url"] or ()),
            ray=flags["ray"],
            collect_concurrency=flags.get("concurrency", COLLECT["concurrency"][1]),
            held_out=flags["held_out"],
            questions_per_iteration=flags["questions_per_iteration"],
            min_informative_groups=flags["min_informative_groups"],
            max_draws=flags["max_draws"],
            max_staleness=flags["max_staleness"],
        )
    )


def judging(flags: dict[str, Any]) -> JudgeRunConfig:
    """How the loop judges: by the turn critic (unless --no-critic) and, with --problems, by the tests."""
    from nanbeige.trainer.judge_config import JudgeRunConfig

    no_critic = flags["no_critic"]
    calls = {} if flags["request_timeout"] is None else {"timeout_s": flags["request_timeout"]}
    critic = (
        None
        if no_critic
        else replace(critic_endpoint(flags["critic_base_url"], flags["critic_model"], flags["critic_api_key"]), **calls)
    )
    judge = JudgeRunConfig(critic=critic, no_critic=no_critic, grader=flags["grader"])
    if flags["problems"] is None:
        return judge
    # code RL: the problems are the questions, their tests the grader
    env = os.environ
    complexity = complexity_endpoint(
        (env.get("NANBEIGE_JUDGE_BASE_URL") or "").split(),
        env.get("NANBEIGE_JUDGE_MODEL"),
        env.get("NANBEIGE_JUDGE_API_KEY"),
    )
    return replace(
        judge,
        grader="code-tests",
        problems=flags["problems"],
        time_reward=flags["time_reward"],
        complexity=replace(complexity, **calls),
    )


def admin_problem(urls: list[str], sync: str, spelled: str = "--loop") -> str:
    """What is wrong with the --admin-url flags, or ""."""
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
            return f"--admin-url {url!r} is not an http:// or https:// address of a vLLM engine"
    if urls and sync == "none":
        return (
            f"--admin-url names the engines {spelled} syncs, and --sync none syncs none: leave it out, or use "
            "--sync lora or weights"
        )
    return ""


def ray_problem(address: str | None, loop: int, spelled: str = "nanbeige train --loop N") -> str:
    """What is wrong with --ray on `train` or `loop` (`spelled`: the command as the user gives it), or "".
    Checked here, before anything runs: the loop would only reach the cluster at its first collect, after its
    state file is written."""
    if address is None:
        return ""
    if os.environ.get("WORLD_SIZE", "1") != "1":  # every process torchrun starts would shard the same runs
        return (
            "--ray runs the loop's collect and judge on a Ray cluster from one process, and torchrun starts "
            f"several: run `{spelled} --ray ...` without torchrun"
        )
    if not loop:
        return (
            "--ray runs the loop's collect and judge on a Ray cluster: it needs --loop (training on --data "
            "alone scales with torchrun)"
        )
    return ""


def group_filter(
    counts: str, keep: str | None, min_pass_rate: float, max_pass_rate: float
) -> tuple[int, int, int] | None:
    """The group filter's flags checked: the k-of-n band of --keep, or None for the pass-rate band."""
    if counts not in COUNTS:
        fail(f"--filter-counts must be {', '.join(COUNTS[:-1])} or {COUNTS[-1]}, not {counts!r}", 2)
    if keep is None:
        return None
    # --keep replaces the band: a band given too would be silently ignored
    if (min_pass_rate, max_pass_rate) != (GroupRule.min_pass_rate, GroupRule.max_pass_rate):
        fail("--keep replaces the pass-rate band: pass either --keep or --min-pass-rate/--max-pass-rate, not both", 2)
    try:
        return parse_keep(keep)
    except ValueError as exc:
        fail(f"--keep {exc}", 2)


@train_app.command("report")
def train_report(
    run: Annotated[Path, typer.Argument(help="A `train --out` folder, or a `loop --out` folder.")],
    out: Annotated[
        Path | None, typer.Option(help="Where the PNGs go \\[default: RUN/report].", show_default=False)
    ] = None,
) -> None:
    """Draw a run's curves as PNG plots: reward and pass rate, loss, entropy, rollout length, clip fraction,
    drift, tokens/s, learning rate."""
    from nanbeige.trainer.train_report import draw

    if not run.is_dir():
        fail(f"{run}: no such folder", 2)
    try:
        written = draw(run, out)
    except OSError as exc:
        fail(f"cannot write the plots: {exc}")
    if not written:
        fail(f"{run}: its metrics have no step with numbers to draw")
    err.print(
        f"{len(written)} plots in {escape(str(written[0].parent))}: " + ", ".join(p.name for p in written),
        highlight=False,
    )


def run_train_loop(config: LoopConfig) -> None:
    """The loop run to its end, its secrets hidden from every line it prints, and one line an iteration."""
    from nanbeige.agent.cli.running import notice, run_command
    from nanbeige.agent.setup.setup import secrets_of
    from nanbeige.trainer.rewards import judging_secrets
    from nanbeige.trainer.rl_loop import run_loop

    hide(secrets_of(config.settings) + judging_secrets(config.judge))

    async def main() -> dict[str, Any]:
        return await run_loop(config, notice)

    summary = run_command(main())
    for item in summary["iterations"]:
        err.print(
            f"iteration {item['iteration']}: {item['rollouts']} rollouts, mean reward {item['mean_reward']}, "
            f"pass rate {item['pass_rate']}, tool use {item['tool_use']}, "
            f"{item['train_steps']} steps, checkpoint {escape(str(item['checkpoint']))}",
            highlight=False,
        )
