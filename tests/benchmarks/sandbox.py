"""Benchmark: overhead of one local-sandbox call, measured through `Sandboxes` (no MCP).

- warm python: one sandbox whose Python worker is already running; each timed call is
  `run_python("print(1)", id)` (a JSON line to the worker and back, plus the sweep for
  processes left behind).
- warm command: `run_command("true", id)` in the same sandbox (a new process chain per call:
  unshare, setpriv where used, the worker's limits, /bin/sh).
- throwaway: `run_python("print(1)", "default")`, which creates a sandbox (folder, uid), starts its
  worker, runs, then kills it and deletes the folder.

Run from the repository root:

    python tests/benchmarks/sandbox.py [--calls 200] [--throwaway-calls 30]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nanbeige.tools.sandbox import SandboxConfig, Sandboxes

EXPECTED = "Execution(Results: [], Logs: Logs(stdout: ['1\\n'], stderr: []), Error: None)"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(call: Callable[[], str], expected: str, n: int) -> list[float]:
    """Milliseconds per call."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000)
        assert result.startswith(expected), result
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--throwaway-calls", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        sandboxes = Sandboxes(SandboxConfig(root=Path(root) / "sandboxes"))
        try:
            sandbox_id = sandboxes.create().split(": ")[1]
            sandboxes.run_python("print(1)", sandbox_id)  # starts the worker; not timed
            print(f"isolation: {sandboxes.backend.isolation}")
            rows = [
                ("warm python print(1)", timed(lambda: sandboxes.run_python("print(1)", sandbox_id), EXPECTED,
                                               args.calls)),
                ("warm command true", timed(lambda: sandboxes.run_command("true", sandbox_id), "CommandResult(",
                                            args.calls // 4)),
                ("throwaway python print(1)", timed(lambda: sandboxes.run_python("print(1)", "default"), EXPECTED,
                                                    args.throwaway_calls)),
            ]
        finally:
            sandboxes.close()
    for name, times in rows:
        print(f"{name:28s} n={len(times):4d}  p50 {pct(times, 0.5):7.2f} ms  p95 {pct(times, 0.95):7.2f} ms")


if __name__ == "__main__":
    main()
