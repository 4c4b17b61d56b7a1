"""Tool servers live no longer than the runtime that started them.

A stdio server is started through a few lines of Python that ask the kernel (Linux's
`PR_SET_PDEATHSIG`) to send it SIGTERM when its parent, this process, dies, and then exec the
server's own command line, which keeps the request. So a runtime that is killed outright
(`kill -9`, the OOM killer) takes its servers with it at once, instead of leaving them running
until their calls in flight end by themselves. SIGTERM rather than SIGKILL lets a server clean up
(the python server removes its sandboxes); the sandbox's own processes watch the server in turn
(`tools/sandbox/worker.py`), so they end even if the server is killed outright.

The kernel sends the signal when the *thread* that started the child ends: the toolbox starts its
servers from the event loop's thread, which lives as long as the toolbox.
"""

from __future__ import annotations

import os
import shutil
import sys

# argv: the parent's pid, then the server's command line. If the parent died before the request
# was made, the signal would never come: the launcher then stops at once.
LAUNCHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"cannot start {sys.argv[2]}: {exc.strerror}", file=sys.stderr)
    sys.exit(127)
"""


def tied_to_this_process(command: list[str]) -> list[str]:
    """`command`, started so that it ends when this process does. Unchanged where the OS has no
    parent-death signal, or when the program cannot be found (the error then names it as usual)."""
    if sys.platform != "linux" or not command or shutil.which(command[0]) is None:
        return command
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, str(os.getpid()), *command]
