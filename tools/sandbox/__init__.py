"""Sandboxes where the model runs Python and shell commands: E2B's cloud, or a local one.

The names the rest of the project uses; the work is in the modules, whose imports flow one way:
`config` (settings, `SandboxError`, shared constants) and `answers` (E2B's text shapes) at the bottom,
then the local backend's pieces (`system`, `seccomp`, `jail`, `budget`, `channel`, `files`, `probe`,
`box`, `program_runs`, `worker_lifecycle`), the backends (`local`, `e2b`) and `transfer`, and `manager`
(`Sandboxes`) on top. `worker` is apart: a script run inside each local sandbox, importing nothing of the
package.
"""

from nanbeige.tools.sandbox.manager import Sandboxes
from nanbeige.tools.sandbox.sandbox_config import ERROR_DETAIL_CHARS, SandboxConfig, SandboxError, config_from_env

__all__ = ["ERROR_DETAIL_CHARS", "SandboxConfig", "SandboxError", "Sandboxes", "config_from_env"]
