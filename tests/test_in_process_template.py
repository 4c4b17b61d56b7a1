"""The in-process backend renders prompts with the chat template it is told (`--chat-template`), as token mode
does, and says so in the trajectory; a template that leaves out the tools offered in the tool-call dialect is
said in one line naming the fix (the model would never see its tools: SmolLM2's own template drops them)."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from tiny_model import CHAT_TEMPLATE, make_tiny_model

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
# the tiny model's own ChatML, with a line before the conversation and the tools shown in it
SHOWS_TOOLS = "<|im_start|>system\nTEMPLATE-OF-THE-USER {{ (tools or []) | tojson }}<|im_end|>\n" + CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def ask(tiny: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [NANBEIGE, "ask", "--model", str(tiny), "--backend", "transformers", "--max-tokens", "4"]
    command += ["--max-turns", "1", "--no-default-servers", "--mcp", "testkit=" + shlex.join(TEST_SERVER)]
    command += ["--trajectory", str(tmp_path / "run.jsonl"), *flags, "What is 2+2?"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_in_process_backend_renders_with_the_chat_template_it_is_given(tiny: Path, tmp_path: Path) -> None:
    template = tmp_path / "shows-tools.jinja"
    template.write_text(SHOWS_TOOLS)
    done = ask(tiny, tmp_path, "--dialect", "tool-call", "--chat-template", str(template))
    assert done.returncode in (0, 1), done.stderr  # the tiny model's noise may give no answer
    [run] = load_trajectories(tmp_path / "run.jsonl")
    assert run.chat_template is not None
    assert run.chat_template["sha256"] == hashlib.sha256(SHOWS_TOOLS.encode()).hexdigest()
    assert "left out the" not in done.stderr


@pytest.mark.slow
def test_a_template_that_drops_the_tools_is_said_in_one_line(tiny: Path, tmp_path: Path) -> None:
    done = ask(tiny, tmp_path, "--dialect", "tool-call")  # the tiny model's own ChatML shows no tools
    said = [line for line in done.stderr.splitlines() if "left out the 13 tools" in line]
    assert len(said) == 1, done.stderr
    assert "--chat-template" in said[0]
