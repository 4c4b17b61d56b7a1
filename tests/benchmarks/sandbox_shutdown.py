"""Benchmark: what local sandboxes leave behind when the MCP client closes busy `python` servers.

Starts SERVERS servers at once as stdio subprocesses over one sandbox root, as the agent's toolbox
does, opens SANDBOXES sandboxes in each, has each write MB megabytes to its disk and then spin in a
Python cell, and closes every client together the way the MCP SDK does (stdin closed, 2 s of grace,
SIGTERM to the process group, 2 s more, SIGKILL). Then prints how long the closes took and what was
left right after them: loop devices backed by files under the root, mounts under it, disk images
and sandbox folders; and again a second later, when a server killed mid-cleanup would show.

Loop devices and mounts are only made as root (a file system of its own per sandbox); elsewhere
the counts show folders only.

Run from the repository root:

    python tests/benchmarks/sandbox_shutdown.py [--servers 3] [--sandboxes 20] [--mb 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for sandbox_leftovers

from sandbox_leftovers import close_under_load, leftovers  # noqa: E402

from nanbeige.tools.sandbox.budget import sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=20, help="per server")
    parser.add_argument("--mb", type=int, default=30, help="written in each sandbox")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sandboxes"
        closes, loaded, setup = asyncio.run(close_under_load(root, args.servers, args.sandboxes, args.mb))
        after = leftovers(root)
        time.sleep(1.0)
        later = leftovers(root)
        swept = sweep_leftovers(root)
        swept_after = leftovers(root)
    print(
        f"{args.servers} servers x {args.sandboxes} sandboxes, {args.mb} MB each: {loaded} wrote their data; "
        f"setup {setup:.1f} s"
    )
    print("close took: " + ", ".join(f"{c:.2f} s" for c in closes) + f" (longest {max(closes):.2f} s)")
    for name, found in (("right after the closes", after), ("1 s later", later)):
        print(
            f"{name}: {len(found.loops)} loop devices, {len(found.mounts)} mounts, {len(found.images)} disk images, "
            f"{len(found.places)} sandbox folders"
        )
    print(
        f"the next server's sweep removed {swept} sandboxes; then {len(swept_after.loops)} loop devices, "
        f"{len(swept_after.mounts)} mounts, {len(swept_after.images)} disk images were left"
    )


def sweep_leftovers(root: Path) -> int:
    """What a server starting on the same root does first; also leaves nothing mounted in the temporary folder."""
    return sweep(root) if root.is_dir() else 0


if __name__ == "__main__":
    main()
