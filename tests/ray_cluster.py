"""A Ray cluster on this machine for the tests of `--ray`: a head that runs no shard and worker nodes, each
a raylet of its own (`ray.cluster_utils.Cluster`), so a node can be removed while a command runs.

Ray binds the machine's own address, which no test may use: the tests run their Ray part in a network
namespace of its own (`unshare -n`, or `unshare -rn` where not root), holding only its loopback interface,
where Ray binds 127.0.0.1. `run_in_own_network` runs a function of a test module there, in a process of
its own; the function and the test share the test's folder (the file system is the same).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
NANBEIGE = str(Path(sys.executable).parent / "nanbeige")


def in_own_network(argv: list[str]) -> list[str]:
    """The command run in a new network namespace whose loopback is up."""
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    return [*unshare, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def run_in_own_network(module: str, function: str, folder: Path, timeout: float = 240) -> dict[str, Any]:
    """Call `module.function(folder)` in a process in a network namespace of its own; returns what the
    function returned (JSON), or fails with the process's output."""
    code = (f"import json, sys; sys.path.insert(0, {str(TESTS)!r}); from pathlib import Path; import {module}; "
            f"found = {module}.{function}(Path({str(folder)!r})); "
            f"Path({str(folder / 'found.json')!r}).write_text(json.dumps(found))")
    done = subprocess.run(in_own_network([sys.executable, "-c", code]), capture_output=True, text=True,
                          timeout=timeout, env=command_env())
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
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "temp_dir": temp})
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(nodes)]
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
