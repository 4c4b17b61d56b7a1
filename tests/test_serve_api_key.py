"""`nanbeige serve`'s API key is the one vLLM will use: an `--api-key` passed through after `--` wins over
ours, and an empty or blank key is no key, so that a server off loopback is never opened by a key that keeps
out no one, nor announced as keyed when it is not. Run against the fake `vllm serve` of test_serve.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_serve import NANBEIGE, fake_config, fake_record

from nanbeige.agent.cli.exposure import exposure_problem
from nanbeige.agent.cli.serve import serve

KEY = "k-" + "9" * 14


@pytest.fixture(autouse=True)
def no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("NANBEIGE_API_KEY", raising=False)


@pytest.mark.parametrize(
    ("api_key", "extra_args"),
    [
        (None, ["--api-key", ""]),
        (None, ["--api-key="]),
        (None, ["--api-key", " "]),
        (None, ["--api", "\t"]),  # an abbreviation, as argparse takes one
        (KEY, ["--api-key", ""]),  # after `--`, it replaces the key nanbeige hands vLLM
        (None, ["--api-key", KEY, "--max-num-seqs", "8", "--api-key="]),  # the last one wins
        (None, ["--api-key"]),  # no value: vLLM will not start, and no key is assumed
    ],
)
def test_an_empty_key_after_the_double_dash_is_no_key_off_loopback(api_key: str | None, extra_args: list[str]) -> None:
    problem = exposure_problem("0.0.0.0", weight_sync=False, api_key=api_key, no_api_key=False, extra_args=extra_args)
    assert problem is not None and "opens the server to the network" in problem


def test_an_empty_key_after_the_double_dash_undoes_one_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert exposure_problem("0.0.0.0", weight_sync=False, api_key=None, no_api_key=False, extra_args=[]) is None
    problem = exposure_problem("0.0.0.0", weight_sync=False, api_key=None, no_api_key=False, extra_args=["--api-key="])
    assert problem is not None and "--no-api-key" in problem


@pytest.mark.parametrize(
    "extra_args",
    [["--api-key", KEY], [f"--api-k={KEY}"], ["--api-key", "", "--api-key", KEY]],
)
def test_a_key_after_the_double_dash_is_a_key(extra_args: list[str]) -> None:
    assert exposure_problem("0.0.0.0", weight_sync=False, api_key=None, no_api_key=False, extra_args=extra_args) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize("key", ["", "   "])
def test_serve_refuses_an_empty_key_of_its_own(host: str, key: str) -> None:
    result = subprocess.run(
        [NANBEIGE, "serve", "--host", host, "--api-key", key],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "--api-key is empty" in error


def test_serve_refuses_a_key_undone_after_the_double_dash_and_starts_nothing(tmp_path: Path) -> None:
    config = fake_config(tmp_path, "--host=0.0.0.0", "--api-key", "", api_key=KEY)
    messages: list[str] = []
    assert serve(config, messages.append) == 2
    assert "opens the server to the network" in messages[0]
    assert not (tmp_path / "fake.json").exists()  # never started


def test_the_ready_line_says_no_key_when_the_double_dash_undoes_it(tmp_path: Path) -> None:
    # the fake binds loopback whatever --host says: no test listens beyond this machine
    extra = ["--host=0.0.0.0", "--api-key=", "--fake-bind", "127.0.0.1", "--fake-exit-after", "0.5"]
    config = fake_config(tmp_path, *extra, api_key=KEY, no_api_key=True)
    messages: list[str] = []
    assert serve(config, messages.append) == 4
    assert fake_record(tmp_path)["argv"][-len(extra) :] == extra  # vLLM got the empty key, last
    ready = next(text for text in messages if text.startswith("ready at"))
    assert "listening on every interface, no API key" in ready
