"""A Ray cluster on this machine for the tests of `--ray`: a head that runs no shard and worker nodes, each
a raylet of its own (`ray.cluster_utils.Cluster`), so a node can be removed while a command runs.

Ray binds the machine's own address, which no test may use: the tests run their Ray part in a network
namespace of its own (`unshare -n`, or `unshare -rn` where not root), holding only its loopback interface,
where Ray binds 127.0.0.1. `run_in_own_network` runs a function of a test module there, in a process of
its own; the function and the test share the test's folder (the file system is the same).

Also what the tests of `--ray` share: a model whose verdicts do not depend on the node, and ways to watch a
command's progress so that a node can be removed half-way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI, Reply, mcp_answer

TESTS = Path(__file__).parent
NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def in_own_network(argv: list[str]) -> list[str]:
    """The command run in a new network namespace whose loopback is up."""
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    return [*unshare, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def run_in_own_network(module: str, function: str, folder: Path, timeout: float = 240) -> dict[str, Any]:
    """Call `module.function(folder)` in a process in a network namespace of its own; returns what the
    function returned (JSON), or fails with the process's output."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(TESTS)!r}); from pathlib import Path; import {module}; "
        f"found = {module}.{function}(Path({str(folder)!r})); "
        f"Path({str(folder / 'found.json')!r}).write_text(json.dumps(found))"
    )
    done = subprocess.run(
        in_own_network([sys.executable, "-c", code]), capture_output=True, text=True, timeout=timeout, env=command_env()
    )
    assert done.returncode == 0 and (folder / "found.json").exists(), done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((folder / "found.json").read_text())


def command_env() -> dict[str, str]:
    """The environment of the commands a test runs: no cluster of the machine's own, wide lines."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"COLUMNS": "300"}


@contextmanager
def local_cluster(nodes: int = 2) -> Iterator[tuple[Any, list[Any]]]:
    """A head without CPUs (it runs no shard) and `nodes` worker nodes of one CPU each; yields the cluster
    and the workers (`cluster.remove_node(worker)` takes one away, as a machine lost would)."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    # The cluster also writes its address to a file under Ray's default folder (RAY_TMPDIR, else /tmp/ray),
    # which a fresh machine does not have: kept in this cluster's own folder, it names no cluster to the
    # machine's other Ray programs either.
    os.environ["RAY_TMPDIR"] = temp
    # Ray starts its workers at niceness 15, below everything else on the machine: beside the suite's other
    # workers they got a few percent of a core, and a shard that starts in 5 s alone took 133 s (past the
    # tests' deadlines). The tests' cluster shares the machine with the suite, so its workers run at 0.
    os.environ["RAY_worker_niceness"] = "0"
    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": temp}
    )
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(nodes)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


# ---------------------------------------------------------------- shared by the tests of --ray


QUESTIONS = [(f"q{i}", f"What is {i} plus {i}?", str(2 * i)) for i in range(8)]


def answers_even_questions_right(delay_s: float) -> Any:
    """A model that takes `delay_s` a reply and answers the questions of even numbers right, the odd ones
    wrong: every run of a question has the same verdict, whichever node runs it and whenever."""

    def reply(request: dict[str, Any]) -> Reply:
        asked = request["messages"][1]["content"]
        number = next(int(q.split()[2]) for _, q, _ in QUESTIONS if asked.startswith(q))
        return Reply(content=mcp_answer(str(2 * number + number % 2)), delay_s=delay_s)

    return reply


def first_calls(server: FakeOpenAI) -> int:
    """Runs started: each run's first model call carries the system prompt and the question alone."""
    return sum(len(request["messages"]) == 2 for request in server.requests)


def wait_for(count: Any, wanted: int, process: subprocess.Popen) -> None:
    """Wait until `count()` reaches `wanted` (or the process ends, or two minutes pass)."""
    deadline = time.monotonic() + 120
    while count() < wanted and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def quiet(server: FakeOpenAI, for_s: float = 2.0) -> None:
    """Wait until the server has had no request for `for_s` seconds."""
    seen, since = -1, time.monotonic()
    while time.monotonic() - since < for_s:
        if len(server.requests) != seen:
            seen, since = len(server.requests), time.monotonic()
        time.sleep(0.1)


def ended(path: Path) -> int:
    """Trajectories ended in a trajectory file: what a command wrote so far."""
    return path.read_text().count('"type":"end"') if path.exists() else 0


SAYS_IF_RAY_LOADED = """
import atexit, sys
atexit.register(lambda: print("ray loaded" if "ray" in sys.modules else "ray not loaded"))
sys.argv = ["nanbeige", *sys.argv[1:]]
from nanbeige.agent.cli.entry import main
main()
"""
"""`python -c SAYS_IF_RAY_LOADED ARGS...` runs `nanbeige ARGS...` and prints at its exit whether Ray was loaded."""
