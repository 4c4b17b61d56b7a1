"""`pytest -q` passes whatever the user's shell holds: their nanbeige settings and tool keys never reach the
tests (tests/conftest.py takes them out), so a developer with a server of their own set up is tested the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_suite_ignores_the_users_nanbeige_settings_and_keys() -> None:
    shell = {
        **os.environ,
        "NANBEIGE_BASE_URL": "http://127.0.0.1:9/v1",
        "NANBEIGE_MODEL": "someone-elses-model",
        "NANBEIGE_API_KEY": "users-own-key-0123",
        "SERPER_API_KEY": "users-serper-key-0123",
    }
    # a test that reads the default server and model, and one that reads where the key goes
    tests = [
        "tests/test_resume_command.py::test_resume_names_the_runs_own_server_recorded_without_its_credentials",
        "tests/test_startup.py::test_doctor_without_a_model_fails_and_says_how_to_get_one",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=shell,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout
