"""The commands as a person meets them: in a real pseudo-terminal, against a model that takes seconds
per reply, with the screen read back through a terminal emulator. A model that answers at once and a
stderr that is a pipe hide what a person sees (a live view that never redraws, a Ctrl-C that does
nothing), so these tests use neither."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, Reply, mcp_answer, mcp_call
from terminal import Terminal
from test_eval_runner import scripted_model, write_gaia

# real terminals and whole commands against models that take seconds: 4 to 40 s a test
pytestmark = pytest.mark.slow
NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
TESTKIT = "testkit=" + shlex.join(TEST_SERVER)
SLOW = 2.0  # seconds a reply takes: longer than the live view's refresh, as with any real model


def slow(*replies: str) -> list[Reply]:
    return [Reply(content=text, delay_s=SLOW) for text in replies]


def ask(server: FakeOpenAI, path: Path, *extra: str) -> list[str]:
    return [
        NANBEIGE,
        "ask",
        "What is the capital of Mongolia?",
        "--base-url",
        server.base_url,
        "--mcp",
        TESTKIT,
        "--no-default-servers",
        "--trajectory",
        str(path),
        *extra,
    ]


def end_record(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().splitlines()[-1])


def test_ask_in_a_terminal_shows_the_wait_the_turns_and_the_answer(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    replies = slow(
        mcp_call("testkit", "echo", {"text": "Mongolia"}), mcp_answer("Ulaanbaatar"), mcp_answer("Ulaanbaatar")
    )
    with FakeOpenAI(replies) as server, Terminal(ask(server, path)) as term:
        assert term.shows("waiting for the model", 30), term.screen_text()
        assert term.wait(60) == 0, term.screen_text()
    screen = term.screen_text()
    assert "testkit/echo" in screen or "echo(text=Mongolia)" in screen, screen
    assert "\nUlaanbaatar\n" in screen + "\n", screen
    assert "answered after" in screen and "Traceback" not in screen
    assert end_record(path)["stop_reason"] == "answered"


def test_ctrl_c_in_a_terminal_while_the_model_thinks_exits_130_with_the_resume_hint(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    replies = slow(mcp_call("testkit", "echo", {"text": "a"})) + [Reply(content="never", delay_s=60)]
    with FakeOpenAI(replies) as server, Terminal(ask(server, path)) as term:
        assert term.shows("turn 2/", 30), term.screen_text()
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    screen = term.screen_text()
    assert "interrupted" in screen and f"nanbeige resume {path}" in screen, screen
    assert end_record(path)["stop_reason"] == "interrupted"


def test_sigterm_in_a_terminal_while_the_model_thinks_exits_143_and_closes_the_run(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with FakeOpenAI([Reply(content="never", delay_s=60)]) as server, Terminal(ask(server, path)) as term:
        assert term.shows("waiting for the model", 30), term.screen_text()
        term.process.send_signal(signal.SIGTERM)
        assert term.wait(30) == 143, term.screen_text()
    assert end_record(path)["stop_reason"] == "interrupted"


def test_timeout_fires_in_a_terminal_while_the_model_thinks(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with (
        FakeOpenAI([Reply(content="never", delay_s=60)]) as server,
        Terminal(ask(server, path, "--timeout", "3")) as term,
    ):
        assert term.wait(30) == 1, term.screen_text()
    assert "stop reason timeout" in term.screen_text(), term.screen_text()
    assert end_record(path)["stop_reason"] == "timeout"


def test_research_in_a_terminal_with_a_slow_model_answers(tmp_path: Path) -> None:
    replies = slow(mcp_answer("Ulaanbaatar"), mcp_answer("Ulaanbaatar"))
    env = {"NANBEIGE_RUNS_DIR": str(tmp_path)}
    with (
        FakeOpenAI(replies, default=Reply(content=mcp_answer("Ulaanbaatar"), delay_s=SLOW)) as server,
        Terminal(
            [
                NANBEIGE,
                "research",
                "What is the capital of Mongolia?",
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--attempts",
                "1",
                "--trajectory",
                str(tmp_path / "run.jsonl"),
            ],
            env=env,
            cwd=str(tmp_path),
        ) as term,
    ):
        assert term.shows("waiting for the model", 30), term.screen_text()
        assert term.wait(60) == 0, term.screen_text()
    assert "Ulaanbaatar" in term.screen_text()


def test_eval_in_a_terminal_with_a_slow_model_draws_progress_and_the_report(tmp_path: Path) -> None:
    data, out = write_gaia(tmp_path / "gaia"), tmp_path / "out"
    with (
        FakeOpenAI(scripted_model(delay_s=SLOW / 2)) as server,
        Terminal(
            [
                NANBEIGE,
                "eval",
                "gaia",
                "--grader",
                "official",
                "--data",
                str(data),
                "--out",
                str(out),
                "-k",
                "1",
                "--concurrency",
                "2",
                "--base-url",
                server.base_url,
                "--no-default-servers",
            ],
            env={**os.environ},
        ) as term,
    ):
        assert term.shows("running", 30), term.screen_text()
        assert term.wait(90) == 0, term.screen_text()
    screen = term.screen_text()
    assert "4/4 runs" in screen and "accuracy" in screen.lower(), screen


# ---------------------------------------------------------------- no terminal: a log file, CI, nohup


def test_ask_without_a_terminal_prints_a_plain_progress_line_while_the_model_thinks(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    replies = [Reply(content=mcp_answer("Ulaanbaatar"), delay_s=3), mcp_answer("Ulaanbaatar")]
    with FakeOpenAI(replies) as server:
        result = subprocess.run(
            ask(server, path),
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NANBEIGE_PROGRESS_EVERY": "0.5"},
        )
    assert result.returncode == 0, result.stderr
    waits = [line for line in result.stderr.splitlines() if "waiting for the model" in line]
    assert len(waits) >= 2, result.stderr  # a 3 s wait, a line every 0.5 s
    assert waits[0].startswith("turn 1/600 · ") and "elapsed" in waits[0]
    assert "\x1b" not in result.stderr and "\r" not in result.stderr  # nothing a log file would show as noise
    assert result.stdout == "Ulaanbaatar\n"


def test_eval_without_a_terminal_prints_plain_progress_lines_and_the_last_count(tmp_path: Path) -> None:
    data, out = write_gaia(tmp_path / "gaia"), tmp_path / "out"
    with FakeOpenAI(scripted_model(delay_s=0.5)) as server:
        result = subprocess.run(
            [
                NANBEIGE,
                "eval",
                "gaia",
                "--grader",
                "official",
                "--data",
                str(data),
                "--out",
                str(out),
                "-k",
                "1",
                "--concurrency",
                "1",
                "--base-url",
                server.base_url,
                "--no-default-servers",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NANBEIGE_PROGRESS_EVERY": "0.5"},
        )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("gaia: ")]
    assert len(lines) >= 3, result.stderr
    assert "running" in lines[0] and "ETA" in lines[0] and "elapsed" in lines[0]
    assert lines[-1].startswith("gaia: 4/4 runs · 0 running · accuracy ")
    assert "\x1b" not in result.stderr and "\r" not in result.stderr


def test_ctrl_c_in_a_terminal_stops_research_and_eval_with_130(tmp_path: Path) -> None:
    never = Reply(content="never", delay_s=60)
    with (
        FakeOpenAI([], default=never) as server,
        Terminal(
            [
                NANBEIGE,
                "research",
                "What is the capital of Mongolia?",
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "research.jsonl"),
            ],
            cwd=str(tmp_path),
        ) as term,
    ):
        assert term.shows("waiting for the model", 30), term.screen_text()
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    assert "interrupted" in term.screen_text()
    data, out = write_gaia(tmp_path / "gaia"), tmp_path / "out"
    with (
        FakeOpenAI([], default=never) as server,
        Terminal(
            [
                NANBEIGE,
                "eval",
                "gaia",
                "--grader",
                "official",
                "--data",
                str(data),
                "--out",
                str(out),
                "-k",
                "1",
                "--base-url",
                server.base_url,
                "--no-default-servers",
            ]
        ) as term,
    ):
        assert term.shows("running", 30), term.screen_text()
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    assert "interrupted; finished runs are kept in" in term.screen_text()


def test_collect_and_judge_in_a_terminal_with_slow_models_draw_progress_and_finish(tmp_path: Path) -> None:
    from test_collect import questions_file
    from test_judge_down import graded_by_a_judge

    questions, rollouts = questions_file(tmp_path), tmp_path / "rollouts.jsonl"
    with (
        FakeOpenAI([], default=Reply(content=mcp_answer("4"), delay_s=SLOW / 2)) as server,
        Terminal(
            [
                NANBEIGE,
                "collect",
                "--questions",
                str(questions),
                "-G",
                "2",
                "--limit",
                "1",
                "--out",
                str(rollouts),
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--allow-inexact",
                "--concurrency",
                "1",
            ]
        ) as term,
    ):
        assert term.shows("running", 30), term.screen_text()
        assert term.wait(60) == 0, term.screen_text()
    assert "1/1 questions · 2/2 rollouts" in term.screen_text()
    verdict = "Correct"  # the reference harness's "equivalent" judge answers with one word
    with (
        FakeOpenAI([], default=Reply(content=verdict, delay_s=SLOW / 2)) as judge,
        Terminal(
            [
                NANBEIGE,
                "judge",
                str(graded_by_a_judge(tmp_path, count=3)),
                "--out",
                str(tmp_path / "j.jsonl"),
                "--no-critic",
                "--judge-base-url",
                judge.base_url,
                "--concurrency",
                "1",
            ]
        ) as term,
    ):
        assert term.shows("judge 0/3 trajectories", 30), term.screen_text()
        assert term.wait(60) == 0, term.screen_text()
    assert "Traceback" not in term.screen_text()


@pytest.mark.parametrize("cols", [80, 120])
def test_notes_on_stderr_are_wrapped_at_words_to_the_terminals_width(tmp_path: Path, cols: int) -> None:
    """A note longer than the terminal is wrapped between words, not cut mid-word by the terminal's fold (at 80
    columns "--mcp NAME=COMMAND" was broken in two); where stderr is no terminal each note stays one line."""
    command = [NANBEIGE, "ask", "What is the capital of Mongolia?", "--no-default-servers"]
    command += ["--trajectory", str(tmp_path / "run.jsonl")]
    with FakeOpenAI([mcp_answer("Ulaanbaatar")]) as server:
        with Terminal([*command, "--base-url", server.base_url], cols=cols) as term:
            assert term.wait(60) == 0, term.screen_text()
        with term.lock:
            lines = [*term.screen.display]
        piped = subprocess.run([*command, "--base-url", server.base_url], capture_output=True, text=True)
    note = "no tools available: the model answers from its own knowledge. Add MCP servers with --mcp NAME=COMMAND."
    # the note's lines end before the terminal's edge (nothing folded), and its words are all whole
    start = next(i for i, line in enumerate(lines) if line.startswith("no tools available"))
    held = [line.rstrip() for line in lines[start : start + 2]]
    assert all(len(line) < cols for line in held), "\n".join(lines)
    assert note in " ".join(" ".join(held).split()), "\n".join(lines)
    assert note in piped.stderr.splitlines()  # one line, as written


SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")  # rich's "dots" frames, which `console.status` draws


def rows(term: Terminal) -> list[str]:
    """Every row the terminal drew, scrolled off or on screen, as the terminal holds it (folds not joined)."""
    with term.lock:
        width = range(term.screen.columns)
        above = ["".join(row[x].data for x in width) for row in term.screen.history.top]
        return above + [*term.screen.display]


def live_line_rows(screen: list[str], start: str) -> list[str]:
    """The rows of the live line that begins with `start`: its first row and the indented rows it folds onto."""
    first = next((i for i, row in enumerate(screen) if start in row), len(screen))
    folded = itertools.takewhile(lambda row: row.strip() and row.startswith(" "), screen[first + 1 :])
    return screen[first : first + 1] + list(folded)


@pytest.mark.parametrize("cols", [80, 120])
def test_ctrl_c_leaves_no_spinner_frame_on_screen_at_any_width(tmp_path: Path, cols: int) -> None:
    """The terminal echoes Ctrl-C as `^C` at the cursor; after a live line as wide as the terminal that wrapped
    onto a new row, the spinner erased one row too few and its last frame stayed above the resume hint."""
    path = tmp_path / "run.jsonl"
    replies = slow(mcp_call("testkit", "echo", {"text": "a"})) + [Reply(content="never", delay_s=60)]
    with FakeOpenAI(replies) as server, Terminal(ask(server, path), cols=cols) as term:
        assert term.shows("turn 2/", 30), term.screen_text()
        time.sleep(1)  # the spinner redrawn a few times
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    assert not SPINNER & set(term.screen_text()), term.screen_text()
    assert "waiting for the model" not in term.screen_text()
    assert f"nanbeige resume {path}" in term.screen_text()


@pytest.mark.parametrize("cols", [80, 120])
def test_collects_live_line_stays_within_the_width_and_stops_whole_on_ctrl_c(tmp_path: Path, cols: int) -> None:
    from test_collect import questions_file

    command = [NANBEIGE, "collect", "--questions", str(questions_file(tmp_path)), "-G", "2", "--limit", "1"]
    command += ["--out", str(tmp_path / "rollouts.jsonl"), "--no-default-servers", "--allow-inexact"]
    command += ["--concurrency", "1"]
    with FakeOpenAI([], default=Reply(content=mcp_answer("4"), delay_s=60)) as server:
        with Terminal([*command, "--base-url", server.base_url], cols=cols) as term:
            assert term.shows("1 running", 30), term.screen_text()
            time.sleep(1.5)  # redrawn a few times
            drawn = rows(term)
            term.ctrl_c()
            assert term.wait(30) == 130, term.screen_text()
    for screen in (drawn, rows(term)):
        # The live line's rows, not the messages around it: a path longer than the terminal wraps at its edge.
        live = live_line_rows(screen, "collect ━")
        assert live and all(len(row.rstrip()) < cols for row in live), "\n".join(screen)  # none reached the edge
    assert term.screen_text().count("collect ━") == 1, term.screen_text()  # its last frame once, not a copy
    assert "interrupted; finished rollouts are kept in" in term.screen_text()
