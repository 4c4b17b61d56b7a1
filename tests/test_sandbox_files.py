"""Files in and out of the local sandbox: uploads and downloads kept inside their folders, and a download
from the internet (a local web server here)."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_sandbox import new_id, sandboxes  # noqa: F401 (sandboxes: the fixture)

from nanbeige.tools.sandbox import SandboxError, Sandboxes


def test_upload_and_download_stay_inside_their_folders(sandboxes: Sandboxes, tmp_path: Path) -> None:
    config = sandboxes.config
    config.upload_dirs[0].mkdir(exist_ok=True)
    source = config.upload_dirs[0] / "data.csv"
    source.write_text("a,b\n1,2\n")
    sid = new_id(sandboxes)
    assert sandboxes.upload(sid, str(source)) == "File uploaded to /home/user/data.csv"
    assert sandboxes.upload(sid, str(source), "/home/user/in/") == "File uploaded to /home/user/in/data.csv"
    assert "Result('a,b" in sandboxes.run_python("open('/home/user/in/data.csv').read()", sid)
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (config.upload_dirs[0] / "link.txt").unlink(missing_ok=True)
    (config.upload_dirs[0] / "link.txt").symlink_to(outside)
    for bad in (str(outside), str(config.upload_dirs[0] / "link.txt"), str(config.upload_dirs[0] / ".." / "x")):
        with pytest.raises(SandboxError, match="cannot be uploaded"):
            sandboxes.upload(sid, bad)
    for bad in ("/etc/data.csv", "/home/user/../../data.csv", "../data.csv"):
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sandboxes.upload(sid, str(source), bad)

    sandboxes.run_python(
        "open('out.txt', 'w').write('result')\nimport os\nos.symlink('/etc/passwd', 'pw')\n"
        "os.makedirs('d')\nos.symlink('/etc', 'd/etc')",
        sid,
    )
    saved = sandboxes.download_to_local(sid, "/home/user/out.txt")
    assert saved == f"File downloaded successfully to: {os.path.realpath(config.download_dir)}/out.txt"
    assert (config.download_dir / "out.txt").read_text() == "result"
    with pytest.raises(SandboxError, match="not a file name inside the download folder"):
        sandboxes.download_to_local(sid, "/home/user/out.txt", "../../escaped.txt")
    with pytest.raises(SandboxError, match="Cannot read"):
        sandboxes.download_to_local(sid, "/home/user/pw")
    with pytest.raises(SandboxError, match="symbolic links are not followed"):
        sandboxes.download_to_local(sid, "/home/user/d/etc/passwd")
    with pytest.raises(SandboxError, match="outside the sandbox"):
        sandboxes.download_to_local(sid, "/etc/passwd")
    with pytest.raises(SandboxError, match="symbolic links are not followed"):
        sandboxes.upload(sid, str(source), "/home/user/d/etc/")


class FileHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/files/report%20v2.txt")
            self.end_headers()
            return
        body = b"x" * 3_000_000 if self.path == "/big.bin" else b"report body"
        self.send_response(200 if self.path.startswith(("/files/", "/big")) else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FileHandler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_from_the_internet(sandboxes: Sandboxes, file_server: str) -> None:
    local = Sandboxes(replace(sandboxes.config, allow_local_urls=True, max_download_mb=1), backend=sandboxes.backend)
    sid = new_id(local)
    assert local.download_url(sid, f"{file_server}/moved") == "File downloaded to /home/user/report v2.txt"
    assert (
        local.download_url(sid, f"{file_server}/files/a.txt", "/home/user/b.txt")
        == "File downloaded to /home/user/b.txt"
    )
    assert "stdout='report body'" in local.run_command("cat b.txt", sid)
    with pytest.raises(SandboxError, match="larger than 1 MB"):
        local.download_url(sid, f"{file_server}/big.bin")
    with pytest.raises(SandboxError, match="HTTP 404"):
        local.download_url(sid, f"{file_server}/nothing")
    with pytest.raises(SandboxError, match="Only http and https"):
        local.download_url(sid, "file:///etc/passwd")
    sid = new_id(sandboxes)
    with pytest.raises(SandboxError, match="local or private address"):
        sandboxes.download_url(sid, f"{file_server}/files/a.txt")
