"""The first moments of a command, as a person meets them: stopped while it starts, asked its version."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (the kernel's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_sigterm_is_answered_before_the_command_line_code_is_even_imported(tmp_path: Path) -> None:
    # A hook the interpreter runs at start-up (sitecustomize) notes what SIGTERM would do at the moment
    # the program first imports its command-line library: the slow part of starting, where a SIGTERM
    # used to kill the process outright.
    (tmp_path / "sitecustomize.py").write_text(f"""
import signal, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            sys.meta_path.remove(self)
            handled = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            open({str(tmp_path / "seen")!r}, "w").write("handled" if handled else "default")
        return None
sys.meta_path.insert(0, Watch())
""")
    result = subprocess.run(
        [NANBEIGE, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "seen").read_text() == "handled"


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
def test_sigterm_at_any_moment_of_start_up_exits_143_with_the_trajectory_closed_or_never_made(
    tmp_path: Path, after_s: float
) -> None:
    path = tmp_path / "t.jsonl"
    with socket.socket() as silent:  # takes connections, never answers: start-up waits on the model probe
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        process = subprocess.Popen(
            [NANBEIGE, "ask", "q", "--base-url", url, "--trajectory", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # From the moment the program runs its own first line (before that the interpreter itself is
        # starting, and nothing but the kernel's default can answer a signal), at any moment after.
        deadline = time.monotonic() + 60
        while not catches_sigterm(process.pid) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(after_s)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    if path.exists():  # made before the signal came: closed, as an interrupted run
        assert json.loads(path.read_text().splitlines()[-1])["stop_reason"] == "interrupted"


# ---------------------------------------------------------------- the first run, on a machine without the model


def first_run_env(tmp_path: Path) -> dict[str, str]:
    """A machine that has never downloaded a model and cannot: an empty hub cache, offline."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "NANBEIGE_RUNS_DIR": str(tmp_path)}
    env.pop("NANBEIGE_BASE_URL", None)
    env.pop("NANBEIGE_MODEL", None)
    return env


def test_without_the_default_model_the_one_line_error_says_how_to_try_the_small_model(tmp_path: Path) -> None:
    result = subprocess.run(
        [NANBEIGE, "ask", "What is the capital of France?", "--backend", "transformers", "--no-default-servers"],
        capture_output=True,
        text=True,
        timeout=120,
        env=first_run_env(tmp_path),
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "--model smollm2 --dialect tool-call" in error


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_train_loop_and_token_mode_decide_at_once_that_a_hub_model_cannot_be_had(tmp_path: Path, hub: str) -> None:
    """As `ask` does: one line with the fixes (about 1.5 s here), never the Hub's retry lines for a minute."""
    from fake_openai import FakeOpenAI

    env = first_run_env(tmp_path)
    if hub == "unreachable":  # online, but nothing answers where the Hub would be
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            env = {**env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}"}
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "a", "question": "What is 2+2?", "answer": "4"}\n')
    commands = {
        "train": ["train", "--model", "Org/not-here", "--data", str(questions), "--out", str(tmp_path / "t")],
        "loop": ["loop", "--model", "Org/not-here", "--questions", str(questions), "--out", str(tmp_path / "l")]
        + ["--sync", "none", "--no-critic", "--no-default-servers"],
        "collect": ["collect", "--questions", str(questions), "--out", str(tmp_path / "c.jsonl"), "--token-mode"]
        + ["--model", "Org/not-here", "--tokenizer", "Org/not-here", "--no-default-servers"],
    }
    for name, args in commands.items():
        with FakeOpenAI([], vllm=True) as server:  # the model server is up; the tokenizer is what is missing
            result = subprocess.run(
                [NANBEIGE, *args, *(["--base-url", server.base_url] if name == "collect" else [])],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
        [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode != 0 and "'Org/not-here' is not downloaded here" in error, (name, result.stderr)
        assert "Retry" not in result.stderr and "huggingface.co" not in result.stderr, (name, result.stderr)


@pytest.mark.slow
def test_the_small_model_answers_in_process_with_cpu_sized_defaults_and_no_third_party_bars(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    result = subprocess.run(
        [
            NANBEIGE,
            "ask",
            "What is the capital of France? Answer in one word.",
            "--model",
            "smollm2",
            "--dialect",
            "tool-call",
            "--temperature",
            "0",
            "--backend",
            "transformers",
            "--no-default-servers",
            "--trajectory",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=first_run_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "on the CPU: --max-tokens 1024 and --max-turns 10" in result.stderr
    assert "de-quantizing" not in result.stderr and "it/s]" not in result.stderr  # no tqdm bars from the loading
    start = json.loads(path.read_text().splitlines()[0])
    assert start["sampling"]["max_tokens"] == 1024 and start["limits"]["max_turns"] == 10


# ---------------------------------------------------------------- what is installed and set up here


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = subprocess.run([NANBEIGE, "--version"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, f"nanbeige {version('nanbeige')}\n")


def test_the_command_list_gives_each_description_whole() -> None:
    result = subprocess.run(
        [NANBEIGE, "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"}
    )
    assert (
        "Continue a run cut short (killed, Ctrl-C, crashed, model server error) from its last complete turn, "
        "with its own settings; print the answer." in result.stdout
    )


def test_doctor_names_the_server_the_backends_and_the_keys_set_never_their_values(tmp_path: Path) -> None:
    from fake_openai import FakeOpenAI

    key = "serper-key-0123456789"
    env = {**first_run_env(tmp_path), "SERPER_API_KEY": key}
    with FakeOpenAI([], vllm=True) as server:
        result = subprocess.run(
            [NANBEIGE, "doctor", "--base-url", server.base_url, "--model", "fake-model"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "COLUMNS": "250"},
        )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"✓ model: fake-model at {server.base_url}: vLLM, context 32768 tokens" in lines
    assert "✓ search: Serper (SERPER_API_KEY set)" in lines
    assert any(line.startswith("✓ keys: set: SERPER_API_KEY") for line in lines)
    assert key not in result.stdout + result.stderr
    # scrape extracts with the run's own model, at the server given; that server is asked once for both
    assert f"✓ scrape: direct fetch here; extraction by fake-model at {server.base_url}" in lines
    assert server.gets.count("/v1/models") == 1, server.gets


def test_doctor_without_a_model_fails_and_says_how_to_get_one(tmp_path: Path) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"  # nothing listens there once closed
    result = subprocess.run(
        [NANBEIGE, "doctor", "--base-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**first_run_env(tmp_path), "COLUMNS": "250"},
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    model = lines.index(next(line for line in lines if line.startswith("✗ model: no server at")))
    assert lines[model + 1].strip().startswith("fix: ") and "--model smollm2" in lines[model + 1]
    assert any(line.startswith("✗ search: off") for line in lines)
    # scrape's extraction needs a server: a model run in this process is no use to the scrape server
    scrape = lines.index(next(line for line in lines if line.startswith("✗ scrape: ")))
    assert f"no extraction model answers at {url}" in lines[scrape]
    assert "NANBEIGE_SUMMARY_BASE_URL" in lines[scrape + 1] and lines[scrape + 1].strip().startswith("fix: ")
