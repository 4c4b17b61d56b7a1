"""`nanbeige loop`, the RL loop's own command, and `train --loop N`, its older spelling: both give the loop the
same run from the same flags, the old spelling says once it is done that the loop has moved, and a choice
flag's bad value (`--sync`, `--objective`, judge's `--failed`) is refused by the parser with exit 2, naming
the values it takes. The loop itself is stubbed here (`run_train_loop`); tests/test_train_loop.py runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanbeige.agent.cli import settings_file
from nanbeige.agent.cli.program import app
from nanbeige.agent.cli.train_commands import OLD_SPELLING
from nanbeige.trainer.loop_config import LoopConfig

QUESTIONS = '{"id": "a", "question": "What is 2+2?", "answer": "4"}\n'


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch) -> list[LoopConfig]:
    """The loop each command starts, in place of running it."""
    started: list[LoopConfig] = []
    monkeypatch.setattr("nanbeige.agent.cli.train_commands.run_train_loop", started.append)
    return started


def flags(tmp_path: Path) -> list[str]:
    questions = tmp_path / "questions.jsonl"
    questions.write_text(QUESTIONS)
    return [
        "--questions",
        str(questions),
        "-G",
        "2",
        "--model",
        "m",
        "--out",
        str(tmp_path / "loop"),
        "--backend",
        "transformers",
        "--no-default-servers",
        "--no-critic",
        "--sync",
        "none",
        "--lora-rank",
        "0",
        "--min-pass-rate",
        "0",
        "--max-pass-rate",
        "1",
        "--step-tokens",
        "100000",
        "--objective",
        "grpo",
        "--packing",
        "off",
        "--questions-per-iteration",
        "1",
        "--min-informative-groups",
        "1",
    ]


def words(text: str) -> str:
    return " ".join(text.translate(str.maketrans("", "", "│╭╮╰╯─")).replace("\\[", "[").split())


def test_loop_help_lists_the_loops_options() -> None:
    result = CliRunner().invoke(app, ["loop", "--help-all"], terminal_width=200)
    assert result.exit_code == 0, result.output
    page = words(result.output)
    for option in (
        "--iterations",
        "--questions",
        "--problems",
        "--group-size",
        "--sync",
        "--admin-url",
        "--ray",
        "--no-critic",
        "--critic-base-url",
        "--model",
        "--out",
        "--lora-rank",
        "--objective",
        "--base-url",
        "--token-mode",
    ):
        assert option in page, option
    assert "lora|weights|none" in page and "grpo|sft" in page  # the choices, as the parser takes them
    assert "With --loop" not in page and "--data" not in page  # the loop's own wording; nothing it would ignore
    short = words(CliRunner().invoke(app, ["loop", "--help"], terminal_width=200).output)
    assert "--iterations" in short and "loop --help-all shows all" in short
    assert "loop" in words(CliRunner().invoke(app, ["--help"], terminal_width=200).output.split("Commands")[-1])


def test_trains_help_names_the_loop_command_and_keeps_the_older_spelling_to_help_all() -> None:
    """`train --loop N` still runs the loop for this release, but `train --help` sends a reader to `nanbeige loop`
    instead of listing the loop's flags as its own ("With --loop: rollouts per question")."""
    short = words(CliRunner().invoke(app, ["train", "--help"], terminal_width=200).output)
    assert "`nanbeige loop` alternates collect, judge, train and sync" in short
    assert "--loop" not in short and "With --loop" not in short
    every = words(CliRunner().invoke(app, ["train", "--help-all"], terminal_width=200).output)
    assert "--loop" in every and "With --loop: rollouts per question" in every


def test_loop_and_train_loop_give_the_loop_the_same_run(tmp_path: Path, loops: list[LoopConfig]) -> None:
    new = CliRunner().invoke(app, ["loop", "--iterations", "2", *flags(tmp_path)])
    assert new.exit_code == 0, new.output
    old = CliRunner().invoke(app, ["train", "--loop", "2", *flags(tmp_path)])
    assert old.exit_code == 0, old.output
    [by_loop, by_train] = loops
    assert by_loop == by_train
    train = by_loop.train
    assert (by_loop.iterations, by_loop.questions.name, by_loop.group_size, by_loop.sync) == (
        2,
        "questions.jsonl",
        2,
        "none",
    )
    assert type(by_loop.sync) is str and type(train.objective) is str and type(train.packing) is str  # not enums
    assert (train.objective, train.packing, train.lora_rank, train.step_tokens) == ("grpo", "off", 0, 100000)
    assert by_loop.settings.backend.backend == "transformers" and by_loop.judge.no_critic
    assert (by_loop.questions_per_iteration, by_loop.min_informative_groups) == (1, 1)
    assert by_loop.max_staleness == 0  # the synchronous loop unless asked
    staleness = CliRunner().invoke(
        app, ["loop", *flags(tmp_path), "--sync", "lora", "--lora-rank", "4", "--max-staleness", "2"]
    )
    assert staleness.exit_code == 0 and loops[-1].max_staleness == 2, staleness.output
    # the old spelling says where the loop went, once, after the run; the new one says nothing of it
    assert words(OLD_SPELLING) in words(old.output) and "nanbeige loop" not in new.output
    assert words(old.output).count("note:") == 1


def test_iterations_default_to_one_and_train_alone_never_starts_the_loop(
    tmp_path: Path, loops: list[LoopConfig]
) -> None:
    assert CliRunner().invoke(app, ["loop", *flags(tmp_path)]).exit_code == 0
    assert loops[0].iterations == 1
    refused = CliRunner().invoke(app, ["loop", "--iterations", "0", *flags(tmp_path)])
    assert refused.exit_code == 2 and len(loops) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model", "m", "--out", "o"], "nanbeige loop needs --questions"),
        (["--out", "o", "--questions", "q.jsonl"], "--model is required (see nanbeige loop --help)"),
        (
            ["--model", "m", "--out", "o", "--problems", "p.jsonl", "--admin-url", "http://e:1", "--sync", "none"],
            "--sync none syncs none",
        ),
        (["--model", "m", "--out", "o", "--questions", "q.jsonl", "--time-reward"], "it needs --problems"),
        (
            ["--model", "m", "--out", "o", "--questions", "q.jsonl", "--max-staleness", "1", "--sync", "none"],
            "--max-staleness 1 samples while training",
        ),
    ],
)
def test_a_loop_that_cannot_work_is_refused_in_one_line(args: list[str], said: str, loops: list[LoopConfig]) -> None:
    result = CliRunner().invoke(app, ["loop", *args])
    assert result.exit_code == 2 and loops == []
    [line] = result.output.strip().splitlines()
    assert line.startswith("error:") and said in line, line


def test_the_loop_under_torchrun_is_refused_naming_its_own_command(
    monkeypatch: pytest.MonkeyPatch, loops: list[LoopConfig]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = CliRunner().invoke(app, ["loop", "--model", "m", "--out", "o", "--questions", "q.jsonl", "--ray", "auto"])
    assert result.exit_code == 2 and "run `nanbeige loop --ray ...` without torchrun" in result.output


@pytest.mark.parametrize(
    ("args", "flag", "allowed"),
    [
        (["loop", "--sync", "full"], "--sync", ("lora", "weights", "none")),
        (["train", "--loop", "1", "--sync", "full"], "--sync", ("lora", "weights", "none")),
        (["train", "--objective", "ppo"], "--objective", ("grpo", "sft")),
        (["loop", "--packing", "maybe"], "--packing", ("auto", "on", "off")),
        (["train", "--dtype", "float16"], "--dtype", ("auto", "float32", "bfloat16")),
        (["train", "--lr-schedule", "linear"], "--lr-schedule", ("constant", "cosine")),
        (["train", "--advantage-std", "mad"], "--advantage-std", ("sample", "population", "none")),
        (["train", "--single-rollout", "one"], "--single-rollout", ("zero", "reward")),
        (["train", "--truncated", "drop"], "--truncated", ("train", "mask")),
        (["judge", "in.jsonl", "--out", "out.jsonl", "--failed", "drop"], "--failed", ("mask", "penalise")),
    ],
)
def test_a_bad_choice_is_refused_by_the_parser_naming_the_choices(
    args: list[str], flag: str, allowed: tuple[str, ...], loops: list[LoopConfig]
) -> None:
    result = CliRunner().invoke(app, [*args, "--model", "m", "--out", "o"] if args[0] != "judge" else args)
    assert result.exit_code == 2 and loops == []
    said = words(result.output)
    assert f"Invalid value for '{flag}'" in said and "Traceback" not in said
    for value in allowed:
        assert f"'{value}'" in said, said


def test_the_settings_file_takes_the_loops_options_in_its_own_table(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text('lora_rank = 8\n[loop]\niterations = 3\nsync = "none"\n[train]\nsync = "weights"\n')
    found = settings_file.Found(used=[(path, "named")])
    mapped = settings_file.default_map(app, found)
    assert mapped["loop"] == {"lora_rank": 8, "iterations": 3, "sync": "none"}
    assert mapped["train"]["sync"] == "weights" and mapped["train"]["lora_rank"] == 8
    path.write_text("[loop]\ndata = ['judged.jsonl']\n")  # the loop trains on what it judged itself
    with pytest.raises(settings_file.SettingsError, match=r"\[loop\] has no setting 'data'"):
        settings_file.default_map(app, found)
