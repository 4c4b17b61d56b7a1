"""The errors a person is shown derive from one base, `NanbeigeError` (tools/errors.py), and the command
line says each in one place: one `error:` line on stderr, no traceback, the class's exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from nanbeige.agent.backends.model_server import (
    ContextOverflow,
    EndpointUnavailable,
    ModelError,
    ModelUnavailable,
    UnusableReply,
)
from nanbeige.agent.backends.pool import PoolError
from nanbeige.agent.backends.refusals import RetryableStatus
from nanbeige.agent.cli.question import QuestionError
from nanbeige.agent.cli.running import Program
from nanbeige.agent.cli.settings_file import SettingsError
from nanbeige.agent.cli.trust import TrustError
from nanbeige.agent.cluster import ClusterError
from nanbeige.agent.setup.setup_checks import SetupError
from nanbeige.agent.toolbox.cache import CacheError, ReplayMiss
from nanbeige.agent.toolbox.toolbox import ToolboxError
from nanbeige.agent.trajectory.records import NotATrajectoryFile
from nanbeige.evals.eval_config import EvalError
from nanbeige.evals.judges import JudgeUnavailable
from nanbeige.evals.tasks import LoadError
from nanbeige.tools.documents import IndexBuildError
from nanbeige.tools.errors import NanbeigeError, ServiceUnavailable
from nanbeige.tools.index import IndexNotFound
from nanbeige.tools.search_config import SearchUnavailable
from nanbeige.trainer.code_rewards import CodeJudgeError
from nanbeige.trainer.collect import CollectError
from nanbeige.trainer.critic import CriticUnavailable, MalformedCritique
from nanbeige.trainer.graph import SynthError
from nanbeige.trainer.judge_config import JudgeError
from nanbeige.trainer.loop_config import LoopError
from nanbeige.trainer.model import TrainError
from nanbeige.trainer.sync import SyncError
from nanbeige.trainer.train_report import ReportError

NANBEIGE = str(Path(sys.executable).parent / "nanbeige")

USER_FACING = {  # the class and its exit code
    SetupError: 1,
    SettingsError: 2,
    TrustError: 1,
    QuestionError: 2,
    CacheError: 1,
    PoolError: 1,
    ClusterError: 1,
    ToolboxError: 1,
    NotATrajectoryFile: 1,
    IndexBuildError: 1,
    IndexNotFound: 1,
    EvalError: 1,
    LoadError: 1,
    TrainError: 1,
    ReportError: 1,
    CollectError: 1,
    JudgeError: 1,
    SynthError: 1,
    LoopError: 1,
    SyncError: 1,
    CodeJudgeError: 1,
    CriticUnavailable: 1,
}
# signals between parts of the code, caught there: never said to the user as they are
INTERNAL = [RetryableStatus, ReplayMiss, ModelError, ContextOverflow, MalformedCritique]


@pytest.mark.parametrize("error", USER_FACING, ids=lambda error: error.__name__)
def test_every_user_facing_error_is_a_nanbeige_error_with_its_exit_code(error: type[Exception]) -> None:
    assert issubclass(error, NanbeigeError)
    assert error("x").exit_code == USER_FACING[error]


@pytest.mark.parametrize("error", INTERNAL, ids=lambda error: error.__name__)
def test_internal_signals_are_not(error: type[Exception]) -> None:
    assert not issubclass(error, NanbeigeError)


SERVICES = [
    EndpointUnavailable,
    ModelUnavailable,
    UnusableReply,
    JudgeUnavailable,
    CriticUnavailable,
    SearchUnavailable,
]
"""A service we call that cannot be used: a model server, a judge, a critic, a search backend."""


@pytest.mark.parametrize("error", SERVICES, ids=lambda error: error.__name__)
def test_a_service_that_cannot_be_used_has_one_base_whatever_the_service(error: type[Exception]) -> None:
    """Four words (unreachable, unavailable, down) and three bases before; one word and one base now, which
    the command line says in one line like any error the user must fix."""
    assert issubclass(error, ServiceUnavailable) and issubclass(error, NanbeigeError)
    assert error.__name__.endswith("Unavailable") or error is UnusableReply
    assert error("x").exit_code == 1


def test_a_setup_error_for_a_bad_value_is_a_usage_error() -> None:
    assert SetupError("--backend must be one of ...", usage=True).exit_code == 2


def test_errors_that_were_value_errors_still_are() -> None:
    assert issubclass(NotATrajectoryFile, ValueError)


def test_the_program_says_a_raised_error_in_one_line_with_its_exit_code() -> None:
    class Refused(NanbeigeError):
        exit_code = 3

    app = typer.Typer(cls=Program)

    @app.command()
    def go() -> None:
        raise Refused("no such thing: name another")

    @app.command()
    def other() -> None:
        """A second command, so that `go` is a subcommand as the program's are."""

    result = CliRunner().invoke(app, ["go"])
    assert (result.exit_code, result.output) == (3, "error: no such thing: name another\n")


def nanbeige(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NANBEIGE, *args], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200", **env}
    )


def assert_said(result: subprocess.CompletedProcess, code: int, line: str) -> None:
    assert (result.returncode, result.stderr) == (code, line + "\n")
    assert result.stdout == ""


def test_a_settings_error_before_the_command_runs(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    assert_said(
        nanbeige("--config", str(missing), "index", "search", str(tmp_path), "q"),
        2,
        f"error: cannot read the settings file {missing}: No such file or directory",
    )


def test_an_error_a_command_raises(tmp_path: Path) -> None:
    assert_said(
        nanbeige("index", "search", str(tmp_path), "q"),
        1,
        f"error: no index in {tmp_path}; build one with `nanbeige index build SOURCES... --out {tmp_path}`",
    )


def test_usage_errors_commands_raise() -> None:
    assert_said(
        nanbeige("ask", "q", "--backend", "nope", "--no-default-servers"),
        2,
        "error: --backend must be one of auto, openai, transformers, not 'nope'",
    )  # a SetupError
    assert_said(nanbeige("ask", ""), 2, "error: the question is empty")  # a QuestionError


def test_debug_adds_the_traceback_before_the_line(tmp_path: Path) -> None:
    result = nanbeige("index", "search", str(tmp_path), "q", NANBEIGE_DEBUG="1")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "IndexNotFound" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: no index in ")
