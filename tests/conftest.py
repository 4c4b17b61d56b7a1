"""Shared test setup: asyncio for anyio tests, and no network beyond loopback."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

# A shell that starts pytest in the background (`pytest &` in a script) leaves SIGINT ignored, and an
# ignored signal stays ignored in every process started from it: the tests that press Ctrl-C on a
# command would get no Ctrl-C. Handled here, SIGINT is back to its default in each process a test starts.
signal.signal(signal.SIGINT, signal.default_int_handler)

USERS_TOOL_SETTINGS = ("SERPER_API_KEY", "SEARXNG_URL", "JINA_API_KEY", "E2B_API_KEY", "E2B_DOMAIN")

# The user's shell may hold nanbeige's settings and the tools' keys (a NANBEIGE_BASE_URL for their own server, a
# SERPER_API_KEY): the tests say what they need themselves, so none of those reach the commands they start.
# Kept: NANBEIGE_REQUIRE_VLLM, which the real-vLLM tier's runner sets to say vLLM must be there.
for name in [name for name in os.environ if name.startswith("NANBEIGE_") or name in USERS_TOOL_SETTINGS]:
    if name != "NANBEIGE_REQUIRE_VLLM":
        del os.environ[name]

# Each worker of the suite computes on one thread (torch's, through OpenMP): two workers a core already keep
# the cores busy, and a torch of two threads in each of four workers made their threads spin-wait for each
# other. Four files that run models, on four workers: 535 s of CPU and 4:32 with the default, 279 s and 2:31
# with one thread. Set before anything imports torch, which reads it once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

# The user's own config folder (their settings file, the settings files they trusted) is the suite's own: a
# developer's nanbeige.toml must not change what the tests see, nor a test trust a file on their behalf.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="nanbeige-config-")

# The user's cache folder is the suite's own as well, kept in the checkout between runs (git ignores it) and
# shared by the workers: what nanbeige keeps there (SmolLM2's de-quantized weights, about 30 s to make on two
# cores) is made once, not in each test that loads the small model. A test of the cache itself uses a folder
# of its own.
os.environ["XDG_CACHE_HOME"] = str(Path(__file__).parent.parent / ".pytest_cache" / "user-cache")


def jail_works() -> bool:
    """Whether bwrap is installed here and may make a jail's namespaces (a container may forbid them)."""
    bwrap = shutil.which("bwrap")
    return (
        bool(bwrap)
        and subprocess.run(
            [bwrap, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, check=False
        ).returncode
        == 0
    )


JAIL = jail_works()
"""The local sandbox runs no code without its jail unless its operator says NANBEIGE_SANDBOX_JAIL=0. Where
the jail cannot run, the tests of the jail itself are skipped (they say so), and the others, which use the
sandbox for something else, say it as an operator would: in the environment (for the commands and servers
they start) and with `jail=JAIL` where they build a `SandboxConfig` themselves."""
if not JAIL:
    os.environ["NANBEIGE_SANDBOX_JAIL"] = "0"

TESTS = Path(__file__).parent
TEST_SERVER = [sys.executable, str(TESTS / "mcp_test_server.py")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection to an address off this machine fails the test."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]  # type: ignore[index]
            if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
                raise AssertionError(f"test tried to reach {address}; tests use loopback only")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny test model's real (trained here) byte-level BPE tokenizer, with its chat template."""
    from tiny_model import make_tiny_model

    from nanbeige.agent.backends.token_mode import load_tokenizer

    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))[0]


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url: str, seconds: float = 10.0) -> None:
    """Return once something answers HTTP at `url` (any status)."""
    import time

    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(url, timeout=0.5)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---------------------------------------------------------------- the suite on several workers (pytest-xdist)

RAY_CLUSTER_FILES = {"test_cluster.py", "test_cluster_lost.py", "test_train_loop_ray.py"}
"""The files whose tests start a local Ray cluster (a head and two nodes, each several processes): two at
once on a small machine would starve each other past their timeouts, so they share one worker."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, the files that took longest in a measured run go first (`tests/file_durations.json`; a file
    not measured yet counts 20 s a slow test), the order within a file kept: the longest files start at once
    instead of last, so no worker is left running one long file while the others wait. Each worker collects
    the same order, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        measured = json.loads((TESTS / "file_durations.json").read_text())
        slow = Counter(item.path.name for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -measured.get(item.path.name, 20.0 * slow[item.path.name]))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers a core. A test spends about half its time waiting, not computing (on a slow
    fake model, a timeout it provokes, a process starting), and with one worker a core the cores sat idle
    that half: on two cores the suite took 13:50 on two workers and 10:14 to 12:08 on four (since then, with
    less work in the tests, 10:22 on three workers and 10:19 on four in the same state)."""
    return 2 * (os.cpu_count() or 1)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files that start a Ray cluster as one unit of work, handed out in the order
    the workers collected them (longest first, `pytest_collection_modifyitems`). xdist would otherwise
    reorder them by their number of tests, which left a file of three long tests to start last."""
    if config.getoption("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return "ray-cluster" if Path(file).name in RAY_CLUSTER_FILES else file

    return RayFilesTogether(config, log)
