"""What the sandbox modules share, importing none of them: the settings (`SandboxConfig`, read from
`NANBEIGE_SANDBOX_*` by `config_from_env`), the error the model is answered with (`SandboxError`) and
the constants of the sandbox the model knows (its home folder, the placeholder ids)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_HOME = "/home/user"
ERROR_DETAIL_CHARS = 4000  # the reference server cut an error's details to this many characters
# Ids the model makes up instead of calling create_sandbox. Every tool that takes a sandbox_id answers
# one of these with invalid_id's text, as the reference server the model was trained with (MiroThinker
# v1.0) did: the model learned to create a sandbox then. The same ids, compared as that server did:
# exactly, case and spaces included (`None` or ` auto ` are not in it; they are looked up like any id).
PLACEHOLDER_IDS = frozenset(
    {
        "default",
        "sandbox1",
        "sandbox",
        "some_id",
        "new_sandbox",
        "python",
        "create_sandbox",
        "sandbox123",
        "temp",
        "sandbox-0",
        "sandbox-1",
        "sandbox_0",
        "sandbox_1",
        "new",
        "0",
        "auto",
        "default_sandbox",
        "none",
        "sandbox_12345",
        "dummy",
        "sandbox_01",
    }
)
MB = 1024 * 1024


class SandboxError(Exception):
    """Something the model can fix (a bad id, a timeout, a path outside the sandbox); the message is for it."""


@dataclass
class SandboxConfig:
    """Settings of the `tool-python` server; `config_from_env` fills them from `NANBEIGE_SANDBOX_*`."""

    backend: str = "local"
    """`local` or `e2b` (NANBEIGE_SANDBOX_BACKEND; default `e2b` when E2B_API_KEY is set)."""
    placeholder_ids: frozenset[str] = PLACEHOLDER_IDS
    """Ids every tool answers with `placeholder_text` (NANBEIGE_SANDBOX_PLACEHOLDER_IDS, a JSON list;
    `--reference` sets the reference server's own)."""
    placeholder_text: str | None = None
    """What a placeholder id is answered with after `[ERROR]: `, `{sandbox_id}` standing for the id
    (NANBEIGE_SANDBOX_PLACEHOLDER_TEXT; `--reference` sets the reference server's own). None:
    `invalid_id`'s text."""
    root: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / f"nanbeige-sandboxes-{os.getuid()}")
    """Folder holding one folder per local sandbox (NANBEIGE_SANDBOX_DIR; default
    `<temp dir>/nanbeige-sandboxes-<uid>`). Temporary by nature: sandboxes are deleted when they close."""
    timeout_s: float = 120.0
    """Wall-clock limit of one call (NANBEIGE_SANDBOX_TIMEOUT)."""
    cpu_seconds: int = 120
    """CPU time limit of one call (NANBEIGE_SANDBOX_CPU_SECONDS)."""
    memory_mb: int = 2048
    """Memory of all of a local sandbox's processes together (a cgroup, or a watch over their
    resident memory), and address space of each, RLIMIT_AS (NANBEIGE_SANDBOX_MEMORY_MB); numpy needs ~1 GB."""
    disk_mb: int = 2048
    """Disk a local sandbox's files may take, /home/user and /tmp together (a file system of its own
    as root, else a watch over the folder) (NANBEIGE_SANDBOX_DISK_MB)."""
    file_size_mb: int = 100
    """Largest file a sandbox may write, RLIMIT_FSIZE (NANBEIGE_SANDBOX_FILE_SIZE_MB); also caps
    uploads and downloads to local."""
    max_processes: int = 64
    """Processes and threads a sandbox may run at once (NANBEIGE_SANDBOX_MAX_PROCESSES)."""
    max_open_files: int = 1024
    """Open file descriptors per process, RLIMIT_NOFILE (NANBEIGE_SANDBOX_MAX_OPEN_FILES)."""
    max_output_chars: int = 20_000
    """Longest tool result; longer ones are cut with a marker (NANBEIGE_SANDBOX_MAX_OUTPUT_CHARS)."""
    idle_timeout_s: int = 600
    """A sandbox unused this long is closed; `create_sandbox(timeout=...)` may ask for less
    (NANBEIGE_SANDBOX_IDLE_TIMEOUT)."""
    max_sandboxes: int = 16
    """Open sandboxes per server; creating one more closes the least recently used
    (NANBEIGE_SANDBOX_MAX_SANDBOXES)."""
    network: bool = False
    """Let local sandboxed code use the network (NANBEIGE_SANDBOX_NETWORK=1); off where the OS can do it."""
    jail: bool = True
    """Run local sandboxes in a filesystem jail (bwrap) where it works here (NANBEIGE_SANDBOX_JAIL)."""
    drop_privileges: bool = True
    """When the server runs as root, run each local sandbox as its own unprivileged uid
    (NANBEIGE_SANDBOX_DROP_PRIVILEGES)."""
    python: str = sys.executable
    """Interpreter of local sandboxes (NANBEIGE_SANDBOX_PYTHON); its packages are what the code can import."""
    upload_dirs: list[Path] = field(default_factory=lambda: [Path.cwd()])
    """Local folders files may be uploaded from (NANBEIGE_SANDBOX_UPLOAD_DIRS, os.pathsep-separated)."""
    download_dir: Path | None = None
    """Local folder that receives files downloaded from sandboxes (NANBEIGE_SANDBOX_DOWNLOAD_DIR;
    default `root/downloads`)."""
    max_download_mb: int = 100
    """Largest file `download_file_from_internet_to_sandbox` fetches (NANBEIGE_SANDBOX_MAX_DOWNLOAD_MB)."""
    allow_local_urls: bool = False
    """Let internet downloads reach loopback and private addresses (NANBEIGE_SANDBOX_ALLOW_LOCAL_URLS=1; tests)."""
    hidden: tuple[str, ...] = ()
    """Folders inside the interpreter's that the jail shows empty: what the code run there must not read (BFCL
    hides its package's answers from the items it generates). Set by the program, not from the environment."""
    e2b_template: str | None = None
    """E2B template id (NANBEIGE_E2B_TEMPLATE); None uses E2B's code-interpreter default."""
    e2b_api_key: str | None = field(default=None, repr=False)
    """E2B API key (E2B_API_KEY)."""


def config_from_env(env: Mapping[str, str] | None = None) -> SandboxConfig:
    env = os.environ if env is None else env
    config = SandboxConfig(e2b_api_key=env.get("E2B_API_KEY") or None)
    config.backend = env.get("NANBEIGE_SANDBOX_BACKEND") or ("e2b" if config.e2b_api_key else "local")
    if config.backend not in ("local", "e2b"):
        raise ValueError(f"NANBEIGE_SANDBOX_BACKEND must be local or e2b, not {config.backend!r}")
    for name, value in env.items():
        key = name.removeprefix("NANBEIGE_SANDBOX_").lower()
        if not name.startswith("NANBEIGE_SANDBOX_") or key in (
            "backend",
            "dir",
            "upload_dirs",
            "download_dir",
            "placeholder_ids",
            "placeholder_text",
        ):
            continue
        key = {"timeout": "timeout_s", "idle_timeout": "idle_timeout_s"}.get(key, key)
        if key not in SandboxConfig.__dataclass_fields__ or key == "hidden":  # `hidden` is the program's alone
            raise ValueError(f"unknown setting {name}")
        kind = type(getattr(config, key))
        setattr(config, key, value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value))
    if env.get("NANBEIGE_SANDBOX_DIR"):
        config.root = Path(env["NANBEIGE_SANDBOX_DIR"])
    if env.get("NANBEIGE_SANDBOX_UPLOAD_DIRS"):
        config.upload_dirs = [Path(p) for p in env["NANBEIGE_SANDBOX_UPLOAD_DIRS"].split(os.pathsep) if p]
    if env.get("NANBEIGE_SANDBOX_DOWNLOAD_DIR"):
        config.download_dir = Path(env["NANBEIGE_SANDBOX_DOWNLOAD_DIR"])
    config.e2b_template = env.get("NANBEIGE_E2B_TEMPLATE") or None
    if env.get("NANBEIGE_SANDBOX_PLACEHOLDER_IDS"):
        ids = json.loads(env["NANBEIGE_SANDBOX_PLACEHOLDER_IDS"])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("NANBEIGE_SANDBOX_PLACEHOLDER_IDS must be a JSON list of strings")
        config.placeholder_ids = frozenset(ids)
    config.placeholder_text = env.get("NANBEIGE_SANDBOX_PLACEHOLDER_TEXT") or None
    return config
