"""Files that cross between a sandbox and the world: uploads from the local folders allowed, downloads
into the local download folder, and downloads from the internet, whose every connection goes through
the egress guard (`nanbeige.tools.egress`), so that the tool is no way into the local network
for code that has none."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from nanbeige.tools import egress
from nanbeige.tools.egress import BlockedAddress, FetchError, FetchPolicy, check_url
from nanbeige.tools.sandbox.files import inside
from nanbeige.tools.sandbox.sandbox_config import MB, SandboxConfig, SandboxError


def allowed_local_file(path: str, allowed: list[Path]) -> Path:
    real = Path(os.path.realpath(os.path.expanduser(path)))
    roots = [Path(os.path.realpath(d)) for d in allowed]
    if not any(inside(real, r) for r in roots):
        raise SandboxError(f"{path} cannot be uploaded: only files under {', '.join(map(str, roots))} can.")
    if not real.is_file():
        raise SandboxError(f"{path} does not exist or is not a file.")
    return real


def write_local_file(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.realpath(folder))
    target = Path(os.path.normpath(base / name))
    if not inside(target, base) or target == base:
        raise SandboxError(f"{name} is not a file name inside the download folder {base}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not inside(Path(os.path.realpath(target.parent)), base):
        raise SandboxError(f"{name} leads outside the download folder {base}.")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise SandboxError(f"Cannot write {target}: {exc.strerror}.") from None
    with open(fd, "wb") as f:
        f.write(data)
    return target


def fetch_url(url: str, config: SandboxConfig) -> tuple[bytes, str]:
    """The body of url (redirects followed, at most max_download_mb) and a file name for it.

    Every connection, redirects included, goes through the egress guard (`egress.get`): the sandbox has no
    network, and this tool must not become its way into the local network. Runs an event loop of
    its own, so call it from a thread without one (the server runs tools in worker threads)."""
    try:
        check_url(url)
    except FetchError:
        raise SandboxError(f"Only http and https URLs can be downloaded, not {url!r}.") from None
    policy = FetchPolicy(allow_private=config.allow_local_urls, max_bytes=config.max_download_mb * MB)
    try:
        reply = egress.get_blocking(url, policy, {"User-Agent": "nanbeige-sandbox/0.1"}, max_redirects=10)
    except BlockedAddress as exc:
        raise SandboxError(
            f"{url} leads to a local or private address ({str(exc).removeprefix('refused: ')}); "
            "only public addresses are allowed."
        ) from None
    except FetchError as exc:
        raise SandboxError(f"Download failed: {exc}.") from None
    if reply.status >= 400:
        raise SandboxError(f"Download failed: HTTP {reply.status} for {reply.url}.")
    if reply.truncated:
        raise SandboxError(f"Download stopped: {url} is larger than {config.max_download_mb} MB.")
    return reply.body, unquote(PurePosixPath(urlsplit(reply.url).path).name) or "downloaded_file"
