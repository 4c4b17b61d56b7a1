"""The `nanbeige` commands that make RL data: `collect` (rollouts), `judge` (rewards, turn critic) and
`synth` (questions from a corpus); `problems` (code problems) is problems_command.py's. Registered on the app in
program.py; the work is in `trainer/`."""

from __future__ import annotations

import enum
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.command_options import COLLECT, COLLECT_LEAVES_OUT
from nanbeige.agent.cli.console import counted, err, fail, hide
from nanbeige.agent.cli.judge_options import (
    CRITIC,
    JudgeApiKey,
    JudgeBaseUrl,
    JudgeModel,
    JudgeTemplate,
    complexity_endpoint,
    critic_endpoint,
    judge_endpoint,
)
from nanbeige.agent.cli.option_tables import with_options, with_run_options
from nanbeige.agent.run.run_config import RunSettings

if TYPE_CHECKING:
    from nanbeige.trainer.judge_config import JudgeRunConfig


@with_run_options(COLLECT, leave_out=COLLECT_LEAVES_OUT)
def collect(*, flags: dict[str, Any], settings: RunSettings) -> None:
    """Sample G token-exact rollouts per question for RL, concurrently; resumable."""
    from nanbeige.agent.setup.setup import secrets_of
    from nanbeige.evals.benchmarks import BENCHMARKS
    from nanbeige.trainer.collect import CollectConfig

    questions, bench, data = flags["questions"], flags["bench"], flags["data"]
    if (questions is None) == (bench is None):
        fail("give the questions with --questions FILE, or --bench NAME --data PATH (one of them)", 2)
    if bench is not None and bench not in BENCHMARKS:
        fail(f"unknown benchmark {bench!r}; known: {', '.join(BENCHMARKS)}", 2)
    if bench is not None and BENCHMARKS[bench].pipeline is not None:
        fail(
            f"{bench} runs through its own pipeline (its handler's prompts, its runner's grading), not as agent "
            "rollouts: use `nanbeige eval` for it",
            2,
        )
    if bench is not None and BENCHMARKS[bench].needs_data and data is None:
        fail(f"--data is required with --bench {bench}: the path of {BENCHMARKS[bench].about}", 2)
    for path in (questions, data):
        if path is not None and not path.exists():
            fail(f"{path}: no such file or folder", 2)
    same = ("out", "questions", "data", "group_size", "concurrency", "limit", "policy_version", "allow_inexact", "ray")
    config = CollectConfig(bench=BENCHMARKS[bench] if bench else None, **{name: flags[name] for name in same})
    hide(secrets_of(settings))
    run_collect(config, settings)


def run_collect(config: Any, settings: Any) -> None:
    from nanbeige.agent.cli.running import notice, resumable, run_command
    from nanbeige.agent.cli.view import RunsView
    from nanbeige.trainer.collect import collect

    def start(progress: Any) -> Any:
        # Called once every check has passed and the rollouts begin: a refused run promises no file.
        err.print(f"[dim]collect: rollouts go to {escape(str(config.out))}[/]", highlight=False)
        return RunsView(err, progress, "collect", config.group_size)

    kept = f"finished rollouts are kept in {escape(str(config.out))}"
    summary = run_command(resumable(collect(config, settings, notice, start), kept))
    rate = "-" if summary["pass_rate"] is None else f"{100 * summary['pass_rate']:.1f}%"
    err.print(
        f"{summary['rollouts']} of {summary['rollouts_expected']} rollouts in {escape(str(config.out))}; "
        f"{summary['questions_done']} of {summary['questions']} questions complete; pass rate (exact match) "
        f"{rate}",
        highlight=False,
    )
    if summary["failed"]:
        fail(
            f"{summary['failed']} rollouts failed and were not written (last: {summary['last_error']}); run the "
            "same command again to retry them"
        )


class FailedTurn(str, enum.Enum):
    """What a turn the critic fails gets (`trainer.critic.TurnRule.failed`)."""

    mask = "mask"
    penalise = "penalise"


CODE_RL = "Code RL"

# judge's flags after its argument, in the order its help lists them
JUDGE_OPTIONS: dict[str, tuple[Any, Any]] = {
    "out": o.option(
        Path,
        ...,
        help="Where the judged trajectories go (appended; an existing file is resumed). Never the input file.",
    ),
    "grader": o.option(
        str | None,
        None,
        show_default=False,
        help="gaia-exact, token-f1 (partial credit: word overlap), code-tests or a judge profile (browsecomp, "
        "browsecomp-zh, hle, xbench, "
        "equivalent) for every trajectory \\[default: each trajectory's own].",
    ),
    "problems": o.option(
        Path | None,
        None,
        show_default=False,
        rich_help_panel=CODE_RL,
        help="Code problems (JSONL) whose tests code-tests runs each program against, matched by question id.",
    ),
    "time_reward": o.option(
        bool,
        False,
        "--time-reward",
        rich_help_panel=CODE_RL,
        help="Code RL stage 2: a judge model compares each solved program's time complexity "
        "with the problem's label (the --judge-* endpoint).",
    ),
    "format_penalty": o.option(
        float,
        1.0,
        min=0.0,
        rich_help_panel=CODE_RL,
        help="R_format of an answer without a well-formed program: minus this.",
    ),
    "time_weight": o.option(
        float, 1.0, min=0.0, rich_help_panel=CODE_RL, help="R_time of a solved program at optimal complexity."
    ),
    "no_critic": o.option(bool, False, "--no-critic", help="The outcome reward alone; no critic endpoint needed."),
    **CRITIC,
    "critic_template": o.option(
        Path | None,
        None,
        show_default=False,
        help="The critic prompt from a file, verbatim; {question}, {earlier_turns}, "
        "{reasoning}, {tool_calls} and {tool_results} are filled in.",
    ),
    "min_logical_soundness": o.option(int, 3, min=1, max=5, help="A turn fails below this score."),
    "min_tool_call_accuracy": o.option(int, 3, min=1, max=5, help="A turn fails below this score."),
    "min_information_gain": o.option(int, 3, min=1, max=5, help="A turn fails below this score."),
    "failed": o.option(
        FailedTurn,
        FailedTurn.mask,
        help="What a failed turn gets: mask (left out of training) or penalise (trained on with reward -PENALTY).",
    ),
    "penalty": o.option(float, 1.0, min=0.0, help="The negative reward of a failed turn, with --failed penalise."),
    "judge_base_url": (JudgeBaseUrl, None),
    "judge_model": (JudgeModel, None),
    "judge_api_key": (JudgeApiKey, None),
    "judge_template": (JudgeTemplate, None),
    "concurrency": o.option(int, 8, min=1, help="Trajectories judged at once."),
    "request_timeout": o.RUN_OPTIONS["request_timeout"],
    "retries": o.option(
        int | None,
        None,
        min=0,
        show_default=False,
        help="How many times a failed judge or critic call is asked again \\[default: 3 for the "
        "judge, 2 for the critic].",
    ),
    "ray": (o.RayAddress, None),
}


@with_options(JUDGE_OPTIONS)
def judge(
    src: Annotated[Path, typer.Argument(help="Trajectory JSONL to judge (from `nanbeige collect`).")],
    *,
    flags: dict[str, Any],
) -> None:
    """Add outcome rewards and turn-level critic scores, rewards and masks to trajectories; tokens untouched."""
    from nanbeige.trainer.rewards import judging_secrets

    config = judge_config(flags)
    hide(judging_secrets(config))
    run_judge(src, flags["out"], config)


def judge_config(flags: dict[str, Any]) -> JudgeRunConfig:
    """The judging the flags describe."""
    from nanbeige.evals.code_tests import CodeRewards
    from nanbeige.trainer.critic import TurnRule
    from nanbeige.trainer.judge_config import JudgeRunConfig

    # Each endpoint keeps its own defaults for what is not given.
    calls = {
        name: flags[flag]
        for name, flag in (("timeout_s", "request_timeout"), ("retries", "retries"))
        if flags[flag] is not None
    }
    critic = (
        None
        if flags["no_critic"]
        else replace(
            critic_endpoint(
                flags["critic_base_url"], flags["critic_model"], flags["critic_api_key"], flags["critic_template"]
            ),
            **calls,
        )
    )
    rule = TurnRule(
        **{
            name: flags[name]
            for name in ("min_logical_soundness", "min_tool_call_accuracy", "min_information_gain", "failed", "penalty")
        }
    )
    asked = (flags["judge_base_url"], flags["judge_model"], flags["judge_api_key"])
    return JudgeRunConfig(
        grader=flags["grader"],
        judge=replace(judge_endpoint(*asked, flags["judge_template"]), **calls),
        critic=critic,
        rule=rule,
        concurrency=flags["concurrency"],
        no_critic=flags["no_critic"],
        problems=flags["problems"],
        time_reward=flags["time_reward"],
        rewards=CodeRewards(format_penalty=flags["format_penalty"], time_weight=flags["time_weight"]),
        complexity=replace(complexity_endpoint(*asked), **calls),
        ray=flags["ray"],
    )


def run_judge(src: Path, out: Path, config: JudgeRunConfig) -> None:
    from nanbeige.agent.cli.running import notice, resumable, run_command
    from nanbeige.agent.cli.view import LiveLine
    from nanbeige.trainer.judge_config import check
    from nanbeige.trainer.rewards import JudgeProgress, judge_file

    progress = JudgeProgress()

    def line() -> str:
        mean = "-" if progress.mean_reward is None else f"{progress.mean_reward:.3f}"
        return (
            f"judge {progress.done}/{progress.total} trajectories · {progress.running} running · mean reward "
            f"{mean} · {counted(progress.turns_judged, 'turn')} judged, {progress.masked_turns} masked · "
            f"{counted(progress.critic_failures, 'critic failure')}"
        )

    check(src, out, config)  # before the live line starts: a bad input is one line, alone

    judge_all = None
    if config.ray is not None:  # Ray is loaded only then
        from nanbeige.trainer.rewards_sharded import judge_on_ray as judge_all

    async def main() -> dict[str, Any]:
        view = LiveLine(err, line)
        try:
            return await resumable(
                judge_file(src, out, config, notice, progress, judge_all),
                f"judged trajectories are kept in {escape(str(out))}",
                before_error=view.stop,
            )
        finally:
            view.stop()

    summary = run_command(main())
    already = summary["already_judged"]
    err.print(
        f"{counted(summary['judged'], 'trajectory', 'trajectories')} judged into {escape(str(out))} ({already} "
        f"{'was' if already == 1 else 'were'} already there, {summary['skipped']} unfinished skipped); "
        f"{summary['outcome_errors']} without an "
        f"outcome reward, {counted(summary['critic_failures'], 'turn')} the critic could not judge",
        highlight=False,
    )


def refuse_unwritable(out: Path, *others: Path) -> None:
    """Refuse, in one line (exit 2), an --out (or a file written beside it) that cannot be written, before the
    corpus is walked."""
    from nanbeige.agent.trajectory.writable import unwritable

    for path in (out, *others):
        problem = unwritable(path)
        if problem:
            fail(f"cannot write --out {out}: {problem}", 2)


def synth(
    corpus: Annotated[Path, typer.Option(help="A local index built by `nanbeige index build`: the documents.")],
    out: Annotated[Path, typer.Option(help="Questions JSONL (appended; resumed), for `nanbeige collect --questions`.")],
    count: Annotated[int, typer.Option(min=1, help="How many questions the file should hold.")] = 100,
    hops: Annotated[int, typer.Option(min=1, max=6, help="Links each question must follow.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the random walks (the same seed gives the same walks).")] = 0,
    concurrency: Annotated[int, typer.Option(min=1, help="Walks written and checked at once.")] = 4,
    base_url: Annotated[
        str | None,
        typer.Option(
            envvar="NANBEIGE_SYNTH_BASE_URL",
            show_default=False,
            help=f"OpenAI-compatible endpoint that writes and checks the questions \\[default: {LLMConfig.base_url}].",
        ),
    ] = None,
    model: Annotated[str, typer.Option(envvar="NANBEIGE_SYNTH_MODEL", help="The model there.")] = LLMConfig.model,
    api_key: Annotated[
        str | None, typer.Option(envvar="NANBEIGE_SYNTH_API_KEY", show_default=False, help="API key for that endpoint.")
    ] = None,
    request_timeout: o.flag("request_timeout") = None,
) -> None:
    """Write multi-hop questions from your documents: random walks over the links between them, a question
    per walk that needs every hop, rejected when one document answers it or the documents do not support it."""
    from nanbeige.agent.cli.running import run_command
    from nanbeige.trainer.synth import SYNTH_ENDPOINT, rejected_path, synthesize

    config = replace(
        SYNTH_ENDPOINT,
        base_url=base_url or SYNTH_ENDPOINT.base_url,
        model=model,
        api_key=api_key,
        timeout_s=request_timeout or SYNTH_ENDPOINT.timeout_s,
    )
    hide([api_key] if api_key else [])
    refuse_unwritable(out, rejected_path(out))

    def progress(in_file: int, wanted: int, rejected: int) -> None:
        err.print(f"[dim]{in_file}/{wanted} questions, {rejected} walks rejected[/]", highlight=False)

    async def main() -> dict[str, Any]:
        return await synthesize(
            corpus, out, config, count, hops=hops, seed=seed, concurrency=concurrency, progress=progress
        )

    say_what_synth_wrote(run_command(main()), out, count, seed, hops)


def say_what_synth_wrote(summary: dict[str, Any], out: Path, count: int, seed: int, hops: int) -> None:
    """The questions written, or, when a run added none, a failure naming what to change."""
    from nanbeige.trainer.synth import rejected_path

    rejected = ", ".join(f"{reason} {n}" for reason, n in summary["rejected"].items()) or "none"
    if not summary["accepted"] and summary["in_file"] < count:  # a run that adds nothing is a failure to fix
        if summary["walks"]:
            fail(
                f"no question written to {out}: every walk tried was rejected ({rejected}); see why in "
                f"{rejected_path(out)}"
            )
        if summary["skipped"]:
            fail(
                f"no question written to {out}: every walk of seed {seed} with --hops {hops} was tried before; "
                "pass another --seed"
            )
        fail(f"no question written to {out}: the corpus has no walk of {hops} links; pass fewer --hops")
    err.print(
        f"{summary['in_file']} questions in {escape(str(out))} ({summary['accepted']} new) from "
        f"{summary['walks']} walks over {summary['documents']} documents and {summary['edges']} links; "
        f"rejected: {rejected}"
        + ("; the walks ran out before the count was reached" if summary.get("exhausted") else ""),
        highlight=False,
    )
