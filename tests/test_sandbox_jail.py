"""The local sandbox's jail against hostile code, run for real: what sandboxed code can see of the host
and of other sandboxes, which sockets it can reach, and what the create answer says with and without a jail.
Each assertion fails if containment does."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from jailed_sandboxes import JAILED, boxes, make_boxes, new_id, value  # noqa: F401 (boxes: the fixture)

from nanbeige.tools.sandbox import SandboxError, Sandboxes
from nanbeige.tools.sandbox.system import UID_LOCKS

NO_JAIL = "no filesystem jail"
# --- the host is out of sight ------------------------------------------------------------------


@JAILED
def test_the_hosts_secrets_home_and_project_are_out_of_sight(boxes: Sandboxes) -> None:
    """/etc/shadow is unreadable, /root holds only the folders leading to the interpreter, and
    neither this project's files nor any of the host's processes (this one among them) exist."""
    sid = new_id(boxes)
    assert "name='PermissionError'" in boxes.run_python("open('/etc/shadow').read()", sid)
    interpreter = boxes.backend.isolation.jail.read_only  # type: ignore[union-attr]
    # every folder leading to the interpreter's folders, and nothing else, is seen on the way there
    seen = value(
        boxes,
        sid,
        f"import os\nkeep = {[*interpreter, '/home/user']!r}\nseen = []\n"
        "for top in ('/root', '/work', '/home', '/run'):\n"
        "    for path, dirs, files in os.walk(top):\n"
        "        dirs[:] = [d for d in dirs if os.path.join(path, d) not in keep]\n"
        "        seen += [os.path.join(path, n) for n in dirs + files]\nseen",
    )
    leading = {str(p) for folder in interpreter for p in (PurePosixPath(folder), *PurePosixPath(folder).parents)}
    assert set(seen) - leading <= {"/home/user", "/run/sandbox", "/run/sandbox/worker.py"}, seen
    project = Path(__file__).resolve().parents[1]
    ours = [
        str(p)
        for p in (
            Path(__file__).resolve(),
            project / "README.md",
            project / "pyproject.toml",
            project / "tools" / "sandbox" / "local.py",
            Path.home() / ".bashrc",
        )
        if p.exists()
    ]
    assert ours and value(boxes, sid, f"import os\n[p for p in {ours!r} if os.path.exists(p)]") == []
    uid = boxes.backend._box(sid).uid
    visible = value(
        boxes,
        sid,
        "import os\n[(int(p), open(f'/proc/{p}/comm').read().strip(), "
        "int(open(f'/proc/{p}/status').read().split('Uid:')[1].split()[1])) "
        "for p in os.listdir('/proc') if p.isdigit()]",
    )
    assert os.getpid() not in {pid for pid, _, _ in visible}
    # the jail's own init (bwrap, as root) and the sandbox's processes: no server, no host process
    assert visible and all(name == "bwrap" or owner == uid for _, name, owner in visible), visible
    assert re.search("PermissionError", boxes.run_python("import os\nos.listdir('/proc/1/root')", sid))


@JAILED
def test_another_sandboxs_files_cannot_be_found_or_read_by_any_path(boxes: Sandboxes) -> None:
    """Even a file its owner opened to everyone: B's /home/user is its own, and A's folder is not in
    B's world at all, neither at A's host path nor through /proc."""
    a, b = new_id(boxes), new_id(boxes)
    secret = f"secret-{secrets.token_hex(8)}"
    boxes.run_python(
        f"import os\nos.makedirs('/home/user/private', mode=0o700)\n"
        f"open('/home/user/private/{secret}.txt', 'w').write({secret!r})",
        a,
    )
    assert value(boxes, a, f"open('/home/user/private/{secret}.txt').read()") == secret
    # now A opens everything up: only the jail keeps B out
    boxes.run_python(
        f"import os\nfor p in ('/home/user', '/home/user/private'): os.chmod(p, 0o777)\n"
        f"os.chmod('/home/user/private/{secret}.txt', 0o666)",
        a,
    )
    host_file = boxes.backend._box(a).folder / "private" / f"{secret}.txt"
    assert host_file.read_text() == secret
    tries = [str(host_file), str(host_file.parent), str(boxes.config.root), f"/home/user/private/{secret}.txt"]
    assert value(boxes, b, f"import os\n[p for p in {tries!r} if os.path.exists(p)]") == []
    # a search of everything B can see that is not system or interpreter files
    skip = ["/proc", "/sys", "/dev", "/usr", *boxes.backend.isolation.jail.read_only]  # type: ignore[union-attr]
    found = value(
        boxes,
        b,
        f"import glob, os\nskip = {skip!r}\nfound = []\n"
        "for path, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(path, d) not in skip]\n"
        f"    found += [os.path.join(path, f) for f in files if {secret!r} in f]\n"
        f"found + glob.glob('/proc/*/root/home/user/private/*') + glob.glob('/proc/*/cwd/private')",
    )
    assert found == []
    assert secret not in boxes.run_command("ls -laR /home/user /tmp", b)


def test_uploads_and_downloads_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO or a folder where a file is expected, or a NUL in a path, is an error the model can read,
    not a hang of the server or an unexpected failure (with or without a jail)."""
    boxes = make_boxes(tmp_path)
    try:
        sid = new_id(boxes)
        source = tmp_path / "up.txt"
        source.write_text("hello")
        boxes.run_command("mkfifo pipe.txt; mkdir folder.txt", sid)
        for call, error in (
            (lambda: boxes.upload(sid, str(source), "/home/user/pipe.txt"), "Cannot write"),
            (lambda: boxes.download_to_local(sid, "/home/user/pipe.txt"), "not a regular file"),
            (lambda: boxes.download_to_local(sid, "/home/user/folder.txt"), "not a regular file"),
            (lambda: boxes.download_to_local(sid, "/home/user/a\0b.txt"), "NUL character"),
        ):
            with pytest.raises(SandboxError, match=error):
                call()
        assert boxes.upload(sid, str(source), "/home/user/ok.txt") == "File uploaded to /home/user/ok.txt"
    finally:
        boxes.close()


# --- sockets -----------------------------------------------------------------------------------


@JAILED
def test_host_unix_sockets_cannot_be_reached(boxes: Sandboxes) -> None:
    """A socket file under the host's /tmp (open to everyone) does not exist in the jail, an abstract
    socket belongs to the host's network namespace, and nothing reaches either listener."""
    name = f"nanbeige-jail-{secrets.token_hex(6)}"
    path = Path("/tmp") / f"{name}.sock"
    with socket.socket(socket.AF_UNIX) as on_path, socket.socket(socket.AF_UNIX) as abstract:
        on_path.bind(str(path))
        os.chmod(path, 0o777)
        abstract.bind("\0" + name)
        for listener, address in ((on_path, str(path)), (abstract, "\0" + name)):
            listener.listen()
            with socket.socket(socket.AF_UNIX) as check:  # both do listen, on the host
                check.connect(address)
                listener.accept()[0].close()
            listener.setblocking(False)
        try:
            sid = new_id(boxes)
            addresses = {"path": str(path), "abstract": "\0" + name}
            reached = value(
                boxes,
                sid,
                f"import socket\nreached = {{}}\n"
                f"for kind, address in {addresses!r}.items():\n"
                "    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(2)\n"
                "    try:\n        s.connect(address)\n        s.sendall(b'hello')\n"
                "        reached[kind] = 'connected'\n"
                "    except OSError as e:\n        reached[kind] = type(e).__name__\n"
                "    s.close()\nreached",
            )
            assert reached == {"path": "FileNotFoundError", "abstract": "ConnectionRefusedError"}
            for listener in (on_path, abstract):
                with pytest.raises(BlockingIOError):
                    listener.accept()
        finally:
            path.unlink()
    # no other way out either: only a loopback of its own, and no host runtime folders with sockets
    assert value(boxes, sid, "import socket\nsocket.if_nameindex()") == [(1, "lo")]
    assert value(
        boxes, sid, "import os\n(os.path.exists('/var'), os.path.exists('/run/dbus'), os.listdir('/run'))"
    ) == (False, False, ["sandbox"])


# --- without a jail ----------------------------------------------------------------------------


def test_without_a_jail_the_create_answer_carries_the_notice(tmp_path: Path) -> None:
    """The fallback is said, not hidden: the backend's notice and the create answer name the missing
    jail and why, and what they say the code can reach is true."""
    boxes = make_boxes(tmp_path, jail=False)
    try:
        answer = boxes.create()
        notice = boxes.backend.notice
        assert NO_JAIL in notice and "NANBEIGE_SANDBOX_JAIL=0" in notice and notice in answer
        sid = re.search(r"sandbox_id: ([0-9a-f]+)", answer)[1]  # type: ignore[index]
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "secret.txt").write_text("s3cret")
        os.chmod(private / "secret.txt", 0o600)
        text = boxes.run_python(f"open({str(private / 'secret.txt')!r}).read()", sid)
        isolation = boxes.backend.isolation
        if isolation.own_uid and not isolation.read_all:
            assert "world-readable" in notice and "PermissionError" in text
        else:  # it keeps CAP_DAC_READ_SEARCH, or runs as the server's user
            assert ("every file" in notice or "server's user" in notice) and "s3cret" in text
    finally:
        boxes.close()


@pytest.mark.skipif(
    not (sys.platform == "linux" and os.geteuid() == 0 and shutil.which("setpriv")), reason="needs root and setpriv"
)
def test_without_a_jail_what_the_sandbox_left_in_the_shared_tmp_goes_with_it(tmp_path: Path) -> None:
    """Outside a jail the code can write to the host's /tmp; as its uid owns only what it made, those
    files and folders are removed with the sandbox, and so is its uid lock."""
    boxes = make_boxes(tmp_path, jail=False)
    try:
        sid = new_id(boxes)
        name = f"left-{secrets.token_hex(4)}"
        boxes.run_command(f"echo x > /tmp/{name}.txt; mkdir -p /tmp/{name}/deep; touch /tmp/{name}/deep/f", sid)
        uid = boxes.backend._box(sid).uid
        assert uid is not None and Path(f"/tmp/{name}.txt").exists() and Path(f"/tmp/{name}/deep/f").exists()
    finally:
        boxes.close()
    assert not Path(f"/tmp/{name}.txt").exists() and not Path(f"/tmp/{name}").exists()
    assert not (UID_LOCKS / str(uid)).exists()


@JAILED
def test_an_interpreter_in_a_virtual_environment_under_tmp_is_jailed_and_works(tmp_path: Path) -> None:
    """The sandbox's own /tmp must not hide an interpreter that lives under the host's /tmp."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    assert str(venv).startswith("/tmp/")
    boxes = make_boxes(tmp_path, python=str(venv / "bin" / "python"))
    try:
        sid = new_id(boxes)
        assert boxes.backend.isolation.jail is not None and boxes.backend.notice == ""
        assert value(boxes, sid, "import sys\nsys.prefix") == str(venv)
        assert "stdout='ok\\n'" in boxes.run_command("echo ok > /tmp/x && cat /tmp/x", sid)
    finally:
        boxes.close()


@JAILED
def test_with_the_jail_the_create_answer_claims_nothing_missing(boxes: Sandboxes) -> None:
    answer = boxes.create()
    assert boxes.backend.notice == ""
    assert re.fullmatch(r"Sandbox created with sandbox_id: [0-9a-f]+", answer)
