"""SIGTERM's answer where no event loop handles it: exit 143 at once. Imports nothing heavy, so that the
entry point sets it before anything else is imported."""

from __future__ import annotations

import os
import signal
from typing import Any


def _terminated(signum: int, frame: Any) -> None:
    # No trajectory is open where this handler is in place (the event loop's handler closes them), so
    # nothing is left to finish: end at once. An exception raised here instead (SystemExit) could land in
    # the middle of the import machinery, which swallows it, and the signal would be lost.
    os._exit(128 + signal.SIGTERM)


def exit_on_sigterm() -> None:
    """SIGTERM ends the program with 143 (where no event loop handles it)."""
    signal.signal(signal.SIGTERM, _terminated)
