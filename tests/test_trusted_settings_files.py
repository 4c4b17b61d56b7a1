"""A trusted settings file is trusted for its content at its own place: a symbolic link named `nanbeige.toml`
never has its target's trust, a file trusted in one folder is not obeyed in the folders below unless it was
trusted for its tree, the relative paths in it are its own folder's, `nanbeige trust` shows every value it
agrees to and asks before recording it, a settings file over the size cap is refused unread, and the bytes whose
trust is checked are the bytes parsed. Each attack runs the real command in real folders, with scripts that
leave a marker file when they run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, mcp_answer
from test_cli import NANBEIGE, assert_one_line_error
from test_untrusted_folders import run_in

from nanbeige.agent.cli import settings_file
from nanbeige.agent.cli.program import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's projects folder; their config folder (their own settings, their trust list) lies beside it,
    the same for every folder they run nanbeige in."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The command run from `folder` by the user `home` belongs to."""
    return run_in(folder, *args, env={"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]})


def script(path: Path, marker: Path) -> None:
    """An executable that leaves `marker` when it runs (and is no MCP server: the run fails after it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(0o755)


def ask(folder: Path, server: FakeOpenAI, *more: str) -> tuple[int, str]:
    result = run(folder, "ask", "q", "--base-url", server.base_url, "--no-default-servers", *more)
    assert "Traceback" not in result.stderr
    return result.returncode, result.stderr


def max_turns(folder: Path, server: FakeOpenAI) -> int:
    """The max_turns an `ask` run in `folder` was started with, from its trajectory's first line."""
    (folder / "t.jsonl").unlink(missing_ok=True)
    ask(folder, server, "--trajectory", "t.jsonl")
    return json.loads((folder / "t.jsonl").read_text().splitlines()[0])["limits"]["max_turns"]


def test_a_link_to_a_trusted_file_is_a_file_of_its_own_and_never_trusted(home: Path) -> None:
    mine, cloned = home / "mine", home / "cloned"
    mine.mkdir()
    cloned.mkdir()
    marker = home / "ran"
    (mine / "nanbeige.toml").write_text(f"mcp = [\"x=sh -c 'touch {marker}'\"]\n")
    assert run(mine, "trust", "--yes").returncode == 0
    (cloned / "nanbeige.toml").symlink_to(mine / "nanbeige.toml")
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        code, said = ask(cloned, server)
    assert code == 0 and not marker.exists()  # the trusted file's command did not run through the link
    assert "ignoring the settings file ./nanbeige.toml: it is a symbolic link" in said
    assert_one_line_error(run(cloned, "trust"), "is a symbolic link")  # nor can the link be trusted
    assert str(cloned) not in run(cloned, "trust", "--list").stdout


def test_a_trusted_file_is_obeyed_in_its_own_folder_alone_unless_trusted_for_its_tree(home: Path) -> None:
    (home / "nanbeige.toml").write_text("max_turns = 3\n")
    clone = home / "cloned" / "src"
    clone.mkdir(parents=True)
    assert run(home, "trust", "--yes").returncode == 0
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        assert max_turns(home, server) == 3  # trusted where it lies
        assert max_turns(clone, server) != 3  # not in a folder below it
        _, said = ask(clone, server)
        assert f"it is trusted in {home} alone, not in the folders below it" in said
        assert f"`nanbeige trust --tree {home / 'nanbeige.toml'}`" in said

        trusted = run(clone, "trust", "--yes", "--tree", str(home / "nanbeige.toml"))
        assert trusted.returncode == 0 and f"in {home} and every folder below it" in trusted.stdout
        assert max_turns(clone, server) == 3
    assert "(and the folders below)" in run(home, "trust", "--list").stdout


def test_an_mcp_command_in_a_settings_file_starts_in_the_files_folder(home: Path) -> None:
    (home / "nanbeige.toml").write_text('mcp = ["x=tools/x.sh"]\n')
    script(home / "tools" / "x.sh", home / "own-ran")
    clone = home / "cloned"
    script(clone / "tools" / "x.sh", home / "clone-ran")  # the clone's own script of the same name
    trusted = run(home, "trust", "--yes", "--tree")
    assert f'mcp[0] = "x=env -C {home} tools/x.sh"' in trusted.stdout  # shown as it will run
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        ask(clone, server)
    assert (home / "own-ran").exists() and not (home / "clone-ran").exists()


def test_a_path_in_a_settings_file_is_taken_from_the_files_folder(home: Path) -> None:
    (home / "nanbeige.toml").write_text('reference = "./MiroThinker"\n')
    clone = home / "cloned"
    module = clone / "MiroThinker" / "apps" / "miroflow-agent" / "src" / "utils" / "prompt_utils.py"
    module.parent.mkdir(parents=True)
    module.write_text(f"open({str(home / 'clone-ran')!r}, 'w').write('x')\n")
    run(home, "trust", "--yes", "--tree")
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        code, said = ask(clone, server)
    assert code != 0 and str(home / "MiroThinker") in said  # the file's own folder has no checkout
    assert not (home / "clone-ran").exists()


def test_a_model_or_tokenizer_folder_in_a_settings_file_is_taken_from_the_files_folder(home: Path) -> None:
    (home / "nanbeige.toml").write_text(
        'model = "./weights"\n[ask]\ntokenizer = "../shared/tokenizer"\n[serve]\nmodel = "Nanbeige/Nanbeige4.1-3B"\n'
    )
    trusted = run(home, "trust", "--yes", "--tree")
    assert f'  model = "{home / "weights"}"' in trusted.stdout.splitlines()
    assert f'  ask.tokenizer = "{home / ".." / "shared" / "tokenizer"}"' in trusted.stdout.splitlines()
    assert '  serve.model = "Nanbeige/Nanbeige4.1-3B"' in trusted.stdout.splitlines()  # an id stays an id
    clone = home / "cloned"
    (clone / "weights").mkdir(parents=True)  # the clone's own folder of the same name
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        code, said = ask(clone, server)
    assert code == 0, said
    assert {request["model"] for request in server.requests} == {str(home / "weights")}


def unasked(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`nanbeige trust` run from `folder` with no one to answer its question, as in a script (input closed)."""
    return run_in(
        folder, "trust", *args, env={"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]}, stdin=subprocess.DEVNULL
    )


def answer(folder: Path, reply: str, *args: str) -> subprocess.CompletedProcess:
    """`nanbeige trust` run from `folder`, the user typing `reply` at its question (stderr in stdout, to read
    in order what was shown and what was asked)."""
    return subprocess.run(
        [NANBEIGE, "trust", *args],
        input=reply,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        cwd=folder,
        env={**os.environ, "COLUMNS": "200", "XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]},
    )


def test_trust_shows_every_value_it_agrees_to_then_asks_before_recording(home: Path) -> None:
    (home / "nanbeige.toml").write_text(
        'max_turns = 3\nmcp = ["docs=http://127.0.0.1:9000/mcp", "x=python3 server.py --root data"]\n'
        '[ask]\nbase_url = "http://127.0.0.1:8123/v1"\nreference = "ref"\nsystem_prompt = "hi\\u001b[8m"\n'
        '[index.build]\nout = "/srv/index"\n[eval]\ndata = "~/gaia"\nmcp = []\n'
    )
    shown = answer(home, "y\n")
    assert shown.returncode == 0, shown.stdout
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{home / 'nanbeige.toml'} sets:"
    assert lines[1:10] == [
        "  max_turns = 3",
        '  mcp[0] = "docs=http://127.0.0.1:9000/mcp"',
        f'  mcp[1] = "x=env -C {home} python3 server.py --root data"',
        '  ask.base_url = "http://127.0.0.1:8123/v1"',
        f'  ask.reference = "{home / "ref"}"',
        '  ask.system_prompt = "hi\\u001b[8m"',  # a control character is written out, never sent to the terminal
        '  index.build.out = "/srv/index"',
        '  eval.data = "~/gaia"',  # a path from the home folder is the home folder's
        "  eval.mcp = []",
    ]
    # asked after all of it, and recorded on yes alone
    assert lines[10].startswith(f"Trust it? [y/N]: trusted {home / 'nanbeige.toml'} (sha256 ")
    assert lines[10].endswith(f"in {home} alone")


@pytest.mark.parametrize("reply", ["n\n", "\n", "whatever\nno\n"])  # no is the default
def test_trust_records_nothing_unless_the_user_says_yes(home: Path, reply: str) -> None:
    (home / "nanbeige.toml").write_text("max_turns = 3\n")
    declined = answer(home, reply)
    assert declined.returncode == 1 and "Trust it? [y/N]" in declined.stdout
    assert declined.stdout.rstrip().endswith("nothing trusted") and "  max_turns = 3" in declined.stdout
    assert run(home, "trust", "--list").stdout.strip() == ""
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        assert max_turns(home, server) != 3
        assert answer(home, "y\n").returncode == 0
        assert max_turns(home, server) == 3


def test_trust_with_no_one_to_answer_records_nothing_and_says_how_to_script_it(home: Path) -> None:
    (home / "nanbeige.toml").write_text("max_turns = 3\n")
    unanswered = unasked(home)
    assert_one_line_error(unanswered, "no answer, nothing trusted", "--yes")
    assert "  max_turns = 3" in unanswered.stdout  # shown all the same
    assert run(home, "trust", "--list").stdout.strip() == ""
    scripted = unasked(home, "-y")
    assert scripted.returncode == 0 and "Trust it?" not in scripted.stderr
    assert str(home / "nanbeige.toml") in run(home, "trust", "--list").stdout


def test_a_settings_file_over_the_size_cap_is_refused_unread(home: Path) -> None:
    huge = home / "nanbeige.toml"
    with huge.open("wb") as file:
        os.truncate(file.fileno(), 8 * 1024**3)  # 8 GB, sparse: reading it whole would exhaust memory
    below = home / "cloned"
    below.mkdir()
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        code, said = ask(below, server)
        assert code == 0 and "it is not trusted" in said
        assert_one_line_error(run(below, "trust", str(huge)), "is 8192.0 MiB, more than the 1.0 MiB it may be")
        assert_one_line_error(run(below, "--config", str(huge), "ask", "q"), "more than the 1.0 MiB")

        huge.unlink()
        huge.write_text("max_turns = 3\n")
        assert run(home, "trust", "--yes").returncode == 0
        with huge.open("r+b") as file:  # the trusted file grown past the cap: refused, not read to be hashed
            os.truncate(file.fileno(), 8 * 1024**3)
        code, said = ask(home, server)
    assert code == 0 and "is 8192.0 MiB, more than the 1.0 MiB it may be" in said


def test_the_bytes_whose_trust_was_checked_are_the_bytes_parsed(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = home / "nanbeige.toml"
    settings.write_text("max_turns = 3\n")
    assert run(home, "trust", "--yes").returncode == 0
    monkeypatch.chdir(home)
    monkeypatch.delenv("NANBEIGE_CONFIG", raising=False)
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))

    found = settings_file.find()  # the trust check: the file is read here, once
    settings.write_text(f"max_turns = 3\nmcp = [\"x=sh -c 'touch {home / 'ran'}'\"]\n")  # swapped after it
    mapped = settings_file.default_map(app, found)

    assert mapped["ask"]["max_turns"] == 3 and "mcp" not in mapped["ask"]  # what was checked is what counts
    assert opened.count(str(settings)) == 1  # the parse did not open the file again


def test_a_trust_list_from_before_trusts_each_file_in_its_own_folder(home: Path) -> None:
    (home / "nanbeige.toml").write_text("max_turns = 3\n")
    sha = hashlib.sha256(b"max_turns = 3\n").hexdigest()
    store = Path(os.environ["XDG_CONFIG_HOME"]) / "nanbeige" / "trusted.json"
    store.parent.mkdir(parents=True)
    store.write_text(json.dumps({"files": {str(home / "nanbeige.toml"): sha}}))  # path -> sha256, as it was
    below = home / "cloned"
    below.mkdir()
    with FakeOpenAI([], default=mcp_answer("ok")) as server:
        assert max_turns(home, server) == 3
        assert max_turns(below, server) != 3
