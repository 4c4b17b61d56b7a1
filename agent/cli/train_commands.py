"""`nanbeige train`: GRPO or SFT on judged trajectories, once or as a loop (`--loop N`: collect, judge,
train, sync), and `nanbeige train report RUN_DIR`, a run's curves. Registered on the app in program.py; the
work is in `trainer/`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.console import err, fail, hide
from nanbeige.agent.cli.help_screen import ShortHelpGroup
from nanbeige.agent.config import AgentConfig, BackendConfig, ToolsConfig
from nanbeige.tools.endpoint import OPENAI_BASE_URL
from nanbeige.trainer.config import COUNTS, GroupRule, parse_keep
from nanbeige.trainer.train import TrainConfig

AdminUrl = Annotated[list[str] | None, typer.Option(
    "--admin-url", metavar="URL", show_default=False, rich_help_panel="Loop",
    help="With --loop: a vLLM engine to sync (repeatable), when the engines sit behind a router whose address is "
         "the only --base-url \\[default: every --base-url].")]


LoopRay = Annotated[str | None, typer.Option(
    "--ray", metavar="auto|HOST:PORT", show_default=False, rich_help_panel="Loop", callback=o.ray_address,
    help="With --loop: each iteration's collect and judge run in shards on a Ray cluster, as `collect --ray` and "
         "`judge --ray` run them: auto (the cluster `ray start` made this machine part of) or the head's address. "
         "Training stays in this process.")]


train_app = typer.Typer(invoke_without_command=True, cls=ShortHelpGroup, help=(
    "Train the model on judged trajectories: GRPO with turn-level advantages, or SFT; --loop N alternates "
    "collect, judge, train and sync. `nanbeige train report RUN_DIR` draws a run's curves."))


@train_app.callback()
def train(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="The model to start from: a Hugging Face id or folder "
                                                   "(required).", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for checkpoints, metrics.jsonl and TensorBoard events "
                                                  "(required).", show_default=False)] = None,
    data: Annotated[list[Path] | None, typer.Option(help="Judged trajectory files (repeatable).",
                                                    show_default=False)] = None,
    objective: Annotated[str, typer.Option(help="grpo, or sft (on passing rollouts, failed turns masked).")] = "grpo",
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps \\[default: one pass over the data].",
                                              show_default=False)] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the rollouts, without --steps: optimizer steps = "
                                                    "mini-batches x epochs, all against one fixed pi_old.")] = 1,
    step_tokens: Annotated[int, typer.Option(min=1, help="Tokens per optimizer step (the mini-batch).")] = 65_536,
    micro_tokens: Annotated[int, typer.Option(min=1, help="Padded tokens per micro-batch.")] = 16_384,
    lr: Annotated[float | None, typer.Option(min=0.0, help="Learning rate \\[default: 1e-6, or 3e-5 with LoRA].",
                                             show_default=False)] = None,
    warmup_steps: Annotated[int, typer.Option(min=0, help="Linear warmup of the learning rate over N steps.")] = 0,
    lr_schedule: Annotated[str, typer.Option(help="After the warmup: constant, or cosine (to --min-lr-ratio x lr "
                                                  "at the last step).")] = "constant",
    min_lr_ratio: Annotated[float, typer.Option(min=0.0, max=1.0, help="Where cosine ends, as a fraction of lr.")
                            ] = 0.0,
    no_tensorboard: Annotated[bool, typer.Option("--no-tensorboard", help="No TensorBoard event files (only "
                                                                          "metrics.jsonl).")] = False,
    wandb_project: Annotated[str | None, typer.Option(help="Also log to this Weights & Biases project (needs wandb).",
                                                      show_default=False)] = None,
    lam: Annotated[float, typer.Option("--lambda", help="Weight of the turn-level advantage (0: plain GRPO).")] = 1.0,
    min_pass_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Drop groups passing less often (the "
                                                                       "fraction --filter-counts counts).")] = 0.1,
    max_pass_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Drop groups passing more often.")] = 0.9,
    filter_counts: Annotated[str, typer.Option(help="What the group filter counts: pass (outcome reward > 0), "
                                                    "solved (the code grader's judge.solved) or complexity "
                                                    "(judge.complexity_ok: solved at optimal complexity).")
                             ] = "pass",
    keep: Annotated[str | None, typer.Option(metavar="K-M/N", show_default=False,
                                             help="Keep groups with K to M of N rollouts counted, instead of the "
                                                  "pass-rate band (1-5/8: Nanbeige4.1's code RL); another group "
                                                  "size keeps the same fractions.")] = None,
    advantage_std: Annotated[str, typer.Option(help="GRPO's std: sample (GRPO, verl, TRL), population, or none "
                                                    "(Dr.GRPO).", rich_help_panel="Objective")] = "sample",
    single_rollout: Annotated[str, typer.Option(help="A one-rollout group's advantage: zero (TRL) or reward (verl).",
                                                rich_help_panel="Objective")] = "zero",
    truncated: Annotated[str, typer.Option(help="Rollouts cut at max turns, the context limit, the timeout or the "
                                                "budget: train, or mask (DAPO's overlong filtering).",
                                           rich_help_panel="Objective")] = "train",
    clip_low: Annotated[float, typer.Option(min=0.0, max=1.0, help="PPO clip below: ratio >= 1 - CLIP_LOW.",
                                            rich_help_panel="Objective")] = TrainConfig.clip_low,
    clip_high: Annotated[float, typer.Option(min=0.0, help="PPO clip above (clip-higher): ratio <= 1 + CLIP_HIGH.",
                                             rich_help_panel="Objective")] = TrainConfig.clip_high,
    clip_dual: Annotated[float, typer.Option(min=1.0, help="Dual clip: a negative-advantage token loses at most "
                                                           "CLIP_DUAL x |A|.", rich_help_panel="Objective")
                         ] = TrainConfig.clip_dual,
    tis_cap: Annotated[float, typer.Option(min=0.0, help="Cap of the truncated importance weight pi_old / "
                                                         "pi_rollout.", rich_help_panel="Objective")
                       ] = TrainConfig.tis_cap,
    max_rollout_drift: Annotated[float, typer.Option(min=0.0, help="Refuse rollouts further from the starting "
                                                                   "policy (mean |log ratio|).",
                                                     rich_help_panel="Objective")] = TrainConfig.max_rollout_drift,
    off_policy: Annotated[bool, typer.Option("--off-policy", help="Train on rollouts sampled with top-p or penalties "
                                                                  "anyway (TIS corrects what it can).",
                                             rich_help_panel="Objective")] = False,
    lora_rank: Annotated[int, typer.Option(min=0, help="LoRA rank (0: every parameter).")] = 0,
    save_every: Annotated[int, typer.Option(min=0, help="Checkpoint every N steps (0: at the end).")] = 0,
    resume: Annotated[bool, typer.Option(help="Go on from the newest checkpoint in --out.")] = False,
    no_gradient_checkpointing: Annotated[bool, typer.Option("--no-gradient-checkpointing",
                                                            help="Keep activations (faster, more memory).")] = False,
    dtype: Annotated[str, typer.Option(help="Weights: auto (float32, computing in bfloat16 on a GPU) or bfloat16 "
                                            "(half the memory; tiny updates are lost).")] = "auto",
    chunk_tokens: Annotated[int, typer.Option(min=1, help="Positions whose logits exist at once.")] = 4096,
    packing: Annotated[str, typer.Option(help="on (rows end to end, no padding), off (padded micro-batches) or "
                                              "auto (on with flash attention).")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the row order.")] = 0,
    loop: Annotated[int, typer.Option(min=0, help="Alternate collect, judge, train and sync this many times "
                                                  "(0: train once on --data).", rich_help_panel="Loop")] = 0,
    questions: Annotated[Path | None, typer.Option(help="With --loop: the questions collect samples.",
                                                   rich_help_panel="Loop", show_default=False)] = None,
    group_size: Annotated[int, typer.Option("--group-size", "-G", min=1, help="With --loop: rollouts per question.",
                                            rich_help_panel="Loop")] = 8,
    questions_per_iteration: Annotated[int | None, typer.Option(
        min=1, rich_help_panel="Loop", show_default=False,
        help="With --loop: questions an iteration draws from the file, in order \\[default: all].")] = None,
    min_informative_groups: Annotated[int, typer.Option(
        min=0, rich_help_panel="Loop", help="With --loop: dynamic sampling, drawing more questions while fewer "
                                            "groups than this are kept by the group filter (the pass-rate "
                                            "band or --keep).")] = 0,
    max_draws: Annotated[int, typer.Option(min=1, rich_help_panel="Loop",
                                           help="With --loop: the most draws an iteration makes.")] = 4,
    sync: Annotated[str, typer.Option(help="With --loop: lora (hot-load each adapter into the serving vLLM), "
                                           "weights (load each full checkpoint into it in place; serve with "
                                           "--weight-sync) or none.", rich_help_panel="Loop")] = "lora",
    base_url: o.BaseUrl = None,
    admin_url: AdminUrl = None,
    ray: LoopRay = None,
    backend: o.Backend = BackendConfig.backend,
    token_mode: o.TokenMode = False,
    no_default_servers: o.NoDefaultServers = False,
    no_critic: Annotated[bool, typer.Option("--no-critic", help="With --loop: outcome rewards only.",
                                            rich_help_panel="Loop")] = False,
    problems: Annotated[Path | None, typer.Option(help="With --loop: code problems (JSONL) to sample instead of "
                                                       "--questions, judged by running each program against its "
                                                       "tests (code-tests).", rich_help_panel="Loop",
                                                  show_default=False)] = None,
    time_reward: Annotated[bool, typer.Option("--time-reward", help="With --loop --problems: code RL's stage 2 "
                                                                   "time reward, from the judge at "
                                                                   "NANBEIGE_JUDGE_BASE_URL / _MODEL / _API_KEY.",
                                              rich_help_panel="Loop")] = False,
    critic_base_url: Annotated[list[str] | None, typer.Option(envvar="NANBEIGE_CRITIC_BASE_URL", show_default=False,
                                                              rich_help_panel="Loop", help=(
                                                                  "With --loop: the turn critic's endpoint (repeat "
                                                                  "it for several) \\[default: "
                                                                  f"{OPENAI_BASE_URL}]."))] = None,
    critic_model: Annotated[str | None, typer.Option(envvar="NANBEIGE_CRITIC_MODEL", show_default=False,
                                                     rich_help_panel="Loop", help="With --loop: the critic model "
                                                                                  "\\[default: gpt-4.1-2025-04-14].")
                            ] = None,
    critic_api_key: Annotated[str | None, typer.Option(envvar="NANBEIGE_CRITIC_API_KEY", show_default=False,
                                                       rich_help_panel="Loop",
                                                       help="With --loop: API key for the critic endpoint.")] = None,
) -> None:
    """Train the model on judged trajectories: GRPO with turn-level advantages, or SFT. Under torchrun
    (`torchrun --nproc-per-node N --no-python nanbeige train ...`) the model is sharded with FSDP2. With
    --loop N it alternates collect, judge, train and sync N times in --out, resumable at any stage."""
    from nanbeige.trainer.judge import JudgeRunConfig
    from nanbeige.trainer.train import TrainError
    from nanbeige.trainer.train import train as run_training

    if ctx.invoked_subcommand is not None:
        return
    if model is None or out is None:
        fail(f"--{'model' if model is None else 'out'} is required (see nanbeige train --help)", 2)
    if packing not in ("auto", "on", "off"):
        fail(f"--packing must be auto, on or off, not {packing!r}", 2)
    if lr_schedule not in ("constant", "cosine"):
        fail(f"--lr-schedule must be constant or cosine, not {lr_schedule!r}", 2)
    if objective not in ("grpo", "sft"):
        fail(f"--objective must be grpo or sft, not {objective!r}", 2)
    if dtype not in ("auto", "float32", "bfloat16"):
        fail(f"--dtype must be auto, float32 or bfloat16, not {dtype!r}", 2)
    for name, value, allowed in (("--advantage-std", advantage_std, ("sample", "population", "none")),
                                 ("--single-rollout", single_rollout, ("zero", "reward")),
                                 ("--truncated", truncated, ("train", "mask"))):
        if value not in allowed:
            fail(f"{name} must be {', '.join(allowed[:-1])} or {allowed[-1]}, not {value!r}", 2)
    if min_pass_rate > max_pass_rate:
        fail(f"--min-pass-rate {min_pass_rate} is above --max-pass-rate {max_pass_rate}", 2)
    problem = ray_problem(ray, loop)
    if problem:
        fail(problem, 2)
    k_of_n = group_filter(filter_counts, keep, min_pass_rate, max_pass_rate)
    if k_of_n is not None and objective == "sft":
        fail("--keep filters GRPO's groups; --objective sft has no group filter (--filter-counts says which "
             "rollouts it imitates)", 2)
    config = TrainConfig(data=data or [], model=model, out=out, objective=objective, steps=steps, epochs=epochs,
                         clip_low=clip_low, clip_high=clip_high, clip_dual=clip_dual, tis_cap=tis_cap,
                         max_rollout_drift=max_rollout_drift, off_policy=off_policy, step_tokens=step_tokens,
                         groups=GroupRule(lam=lam, min_pass_rate=min_pass_rate, max_pass_rate=max_pass_rate,
                                          counts=filter_counts, k_of_n=k_of_n, std=advantage_std,
                                          single=single_rollout, truncated=truncated),
                         warmup_steps=warmup_steps, lr_schedule=lr_schedule, min_lr_ratio=min_lr_ratio,
                         tensorboard=not no_tensorboard, wandb_project=wandb_project, packing=packing,
                         micro_tokens=micro_tokens, lr=lr, lora_rank=lora_rank,
                         save_every=save_every, gradient_checkpointing=not no_gradient_checkpointing, dtype=dtype,
                         seed=seed, chunk_tokens=chunk_tokens)
    if loop:
        if (questions is None) == (problems is None):
            fail("--loop needs --questions (the questions collect samples rollouts for) or --problems (code "
                 "problems), one of them", 2)
        problem = admin_problem(admin_url or [], sync)
        if problem:
            fail(problem, 2)
        if time_reward and problems is None:
            fail("--time-reward rewards code problems' solutions: it needs --problems", 2)
        settings = o.run_settings(**{**o.shared(locals()), **LOOP_DEFAULTS, "model": model, "base_url": base_url,
                                     "backend": backend, "token_mode": token_mode,
                                     "no_default_servers": no_default_servers})
        critic = None if no_critic else o.critic_endpoint(critic_base_url, critic_model, critic_api_key)
        loop_options = {"admin_urls": tuple(admin_url or ()), "questions_per_iteration": questions_per_iteration,
                        "min_informative_groups": min_informative_groups, "max_draws": max_draws, "ray": ray}
        judging = JudgeRunConfig(critic=critic, no_critic=no_critic)
        if problems is not None:  # code RL: the problems are the questions, their tests the grader
            judge = os.environ
            judging = replace(judging, grader="code-tests", problems=problems, time_reward=time_reward,
                              complexity=o.complexity_endpoint((judge.get("NANBEIGE_JUDGE_BASE_URL") or "").split(),
                                                               judge.get("NANBEIGE_JUDGE_MODEL"),
                                                               judge.get("NANBEIGE_JUDGE_API_KEY")))
        return run_train_loop(loop, questions or problems, group_size, sync, settings, judging, config, loop_options)
    if admin_url:
        fail("--admin-url names the engines --loop syncs: it needs --loop", 2)
    if not data:
        fail("--data is required: judged trajectory files (`nanbeige judge ... --out FILE`)", 2)
    try:
        summary = run_training(config, resume=resume,
                               log=lambda text: err.print(escape(text), highlight=False, soft_wrap=True))
    except TrainError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]; checkpoints so far are kept: --resume goes on from the newest",
                  highlight=False)
        raise typer.Exit(130) from None
    if summary["checkpoint"]:
        err.print(f"checkpoint: {escape(summary['checkpoint'])}", highlight=False)


def admin_problem(urls: list[str], sync: str) -> str:
    """What is wrong with the --admin-url flags, or ""."""
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
            return f"--admin-url {url!r} is not an http:// or https:// address of a vLLM engine"
    if urls and sync == "none":
        return ("--admin-url names the engines --loop syncs, and --sync none syncs none: leave it out, or use "
                "--sync lora or weights")
    return ""


def ray_problem(address: str | None, loop: int) -> str:
    """What is wrong with --ray on `train`, or "". Checked here, before anything runs: the loop would only
    reach the cluster at its first collect, after its state file is written."""
    if address is None:
        return ""
    if os.environ.get("WORLD_SIZE", "1") != "1":  # every process torchrun starts would shard the same runs
        return ("--ray runs the loop's collect and judge on a Ray cluster from one process, and torchrun starts "
                "several: run `nanbeige train --loop N --ray ...` without torchrun")
    if not loop:
        return ("--ray runs the loop's collect and judge on a Ray cluster: it needs --loop (training on --data "
                "alone scales with torchrun)")
    return ""


def group_filter(counts: str, keep: str | None, min_pass_rate: float, max_pass_rate: float
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
    run: Annotated[Path, typer.Argument(help="A `train --out` folder, or a `train --loop` folder.")],
    out: Annotated[Path | None, typer.Option(help="Where the PNGs go \\[default: RUN/report].",
                                             show_default=False)] = None,
) -> None:
    """Draw a run's curves as PNG plots: reward and pass rate, loss, entropy, rollout length, clip fraction,
    drift, tokens/s, learning rate."""
    from nanbeige.trainer.report import ReportError, draw

    if not run.is_dir():
        fail(f"{run}: no such folder", 2)
    try:
        written = draw(run, out)
    except ReportError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the plots: {exc}")
    if not written:
        fail(f"{run}: its metrics have no step with numbers to draw")
    err.print(f"{len(written)} plots in {escape(str(written[0].parent))}: "
              + ", ".join(p.name for p in written), highlight=False)


# The run settings `train --loop` gives collect beyond its own flags: the loop's defaults.
LOOP_DEFAULTS: dict[str, Any] = {
    "api_key": None, "dialect": AgentConfig.dialect, "max_turns": None,
    "keep_tool_results": AgentConfig.keep_tool_results, "max_context": None, "temperature": None, "top_p": None,
    "repetition_penalty": None, "max_tokens": LLMConfig.max_tokens, "mcp": None,
    "tool_timeout": ToolsConfig.tool_timeout_s, "max_result_chars": ToolsConfig.max_result_chars, "timeout": None,
    "gguf_file": None, "chat_template": None, "summary_turn": None, "rollback": None, "system_prompt_file": None,
    "reference": None}


def run_train_loop(iterations: int, questions: Path, group_size: int, sync: str, settings: Any, judge_config: Any,
                   train_config: Any, loop_options: dict[str, Any]) -> None:
    from nanbeige.agent.cli.running import notice, run_command
    from nanbeige.agent.setup import secrets_of
    from nanbeige.trainer.judge import judging_secrets
    from nanbeige.trainer.rl_loop import LoopConfig, LoopError, run_loop

    hide(secrets_of(settings) + judging_secrets(judge_config))
    config = LoopConfig(iterations=iterations, out=train_config.out, questions=questions, settings=settings,
                        judge=judge_config, train=train_config, group_size=group_size, sync=sync, **loop_options)

    async def main() -> dict[str, Any]:
        try:
            return await run_loop(config, notice)
        except LoopError as exc:
            fail(str(exc))

    summary = run_command(main())
    for item in summary["iterations"]:
        err.print(f"iteration {item['iteration']}: {item['rollouts']} rollouts, mean reward {item['mean_reward']}, "
                  f"{item['train_steps']} steps, checkpoint {escape(str(item['checkpoint']))}", highlight=False)
