"""The `nanbeige` program's entry point. It sets up the answer to SIGTERM before anything else is
imported: a SIGTERM that came while the command was still starting (importing, reading its
settings) killed it outright, exit status -15, instead of exit 143 like every other moment. Once a
command's event loop runs, the loop's own handler takes over and closes the open trajectories first."""

from __future__ import annotations

import os
import sys

from nanbeige.agent.cli.sigterm import exit_on_sigterm


def main() -> None:
    exit_on_sigterm()
    if "--verbose" not in sys.argv:
        # tqdm reads this once, when it is first imported (torch imports it): so here, before anything.
        # Its bars (de-quantizing a GGUF, loading weights) would redraw over our stderr: noise in a log
        # file, and a broken live view in a terminal.
        os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        from nanbeige.agent.cli.program import main as run
    except KeyboardInterrupt:  # Ctrl-C while the program is still being read in: no traceback for that
        sys.stderr.write("interrupted while starting; nothing was written\n")
        sys.exit(130)
    run()
