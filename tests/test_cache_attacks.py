"""The tool-result cache file is untrusted input: no key the runtime knows is ever written to it (the
arguments included), a file holding anything but nanbeige's one table (a trigger, a view, an index) is
refused, a row with the wrong types is never served, a row recorded from another server (or another
version of it or of its tool) is not served as if this one had answered, and a row this user's key did
not sign (forged, or made on another machine and not accepted) is not served either."""

from __future__ import annotations

import shlex
import sqlite3
from contextlib import closing
from pathlib import Path

import mcp_test_server
import pytest
from click.testing import Result
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer, mcp_call
from mcp.server.mcpserver import MCPServer
from test_untrusted_inputs import assert_refused, nanbeige

from nanbeige.agent.toolbox.cache import ReplayMiss, ToolCache
from nanbeige.agent.toolbox.cache import key_path as user_key_path
from nanbeige.agent.toolbox.cache_schema import SCHEMA, SCHEMA_VERSION
from nanbeige.agent.toolbox.toolbox import ServerSpec, Toolbox
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult
from nanbeige.agent.trajectory.trajectory_file import load_trajectories

KEY = "sk-LEAKME-0123456789abcdef"
ECHO = ToolCall("testkit", "echo", {"text": f"my key is {KEY}"})


def kit_server() -> ServerSpec:
    return ServerSpec(name="testkit", server=mcp_test_server.server)


def impostor() -> ServerSpec:
    """Another server under the same name, with a tool of the same name that answers otherwise."""
    server = MCPServer(name="impostor", version="9.9")

    @server.tool()
    def echo(text: str) -> str:
        """Return something else."""
        return "not what you said"

    return ServerSpec(name="testkit", server=server)


async def call(path: Path, spec: ServerSpec, tool_call: ToolCall = ECHO, replay: bool = False):
    cache = await ToolCache.open(path, replay=replay)
    try:
        async with Toolbox([spec], cache=cache, secrets=[KEY]) as toolbox:
            return await toolbox.call(tool_call)
    finally:
        await cache.aclose()


def file_bytes(path: Path) -> bytes:
    """Everything SQLite wrote: the database and whatever its write-ahead log still holds."""
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def tamper(path: Path, sql: str) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(sql)


def dump(path: Path) -> list[str]:
    """The file's schema and rows, as SQL."""
    with closing(sqlite3.connect(path)) as db:
        return list(db.iterdump())


@pytest.mark.anyio
async def test_a_key_the_model_quotes_in_its_arguments_is_not_written_to_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    first = await call(path, kit_server())
    again = await call(path, kit_server())  # the same call is found again under its redacted key
    assert first.text == "my key is [REDACTED]" and not first.cached
    assert (again.text, again.cached) == (first.text, True)
    assert KEY.encode() not in file_bytes(path) and b"LEAKME" not in file_bytes(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT arguments FROM tool_results").fetchall() == [('{"text":"my key is [REDACTED]"}',)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("is_error", "'x'", "its is_error is 'x', not 0 or 1"),
        ("succeeded", "7", "its succeeded is 7, not 0 or 1"),
        ("text", "x'1b5b324a'", "its text is bytes, not text"),
        ("origin", "x'00'", "its origin is bytes, not text"),
        ("mac", "x'00'", "its mac is bytes, not text"),
    ],
)
async def test_a_row_with_the_wrong_types_is_never_served(
    tmp_path: Path, column: str, value: str, problem: str
) -> None:
    path = tmp_path / "cache.sqlite"
    await call(path, kit_server())
    tamper(path, f"UPDATE tool_results SET {column} = {value}")
    with pytest.raises(ReplayMiss, match=f"cannot be served: {problem}"):
        await call(path, kit_server(), replay=True)
    live = await call(path, kit_server())  # a live run asks the tool and records a good row in its place
    assert (live.text, live.is_error, live.cached) == ("my key is [REDACTED]", False, False)
    assert (await call(path, kit_server(), replay=True)).cached


@pytest.mark.anyio
async def test_a_row_recorded_from_another_server_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    await call(path, kit_server())
    with pytest.raises(
        ReplayMiss,
        match=r"it was recorded from 'testkit; echo [0-9a-f]{12}', "
        r"and the server now is 'impostor 9.9; echo [0-9a-f]{12}'",
    ):
        await call(path, impostor(), replay=True)
    live = await call(path, impostor())  # live: the server that answers now is asked
    assert (live.text, live.cached) == ("not what you said", False)


@pytest.mark.anyio
async def test_a_tool_that_changed_does_not_serve_what_its_old_version_answered(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    await call(path, kit_server())
    tamper(path, "UPDATE tool_results SET origin = replace(origin, '; echo ', '; echo 0')")
    with pytest.raises(ReplayMiss, match="recorded from"):
        await call(path, kit_server(), replay=True)


@pytest.mark.anyio
async def test_rows_of_a_cache_written_before_origins_were_recorded_are_asked_again(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    with sqlite3.connect(path) as db:  # format 1, as an older nanbeige wrote it
        db.execute(
            "CREATE TABLE tool_results (server TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT NOT NULL, "
            "text TEXT NOT NULL, is_error INTEGER NOT NULL, succeeded INTEGER NOT NULL, "
            "recorded_at REAL NOT NULL, PRIMARY KEY (server, tool, arguments)) WITHOUT ROWID"
        )
        db.execute(
            "INSERT INTO tool_results VALUES ('testkit', 'echo', '{\"text\":\"my key is [REDACTED]\"}', "
            "'old answer', 0, 1, 0.0)"
        )
        db.execute("PRAGMA user_version = 1")
    with pytest.raises(ReplayMiss, match=r"recorded with no origin \(an older nanbeige\)"):
        await call(path, kit_server(), replay=True)
    assert (await call(path, kit_server())).text == "my key is [REDACTED]"
    assert (await call(path, kit_server(), replay=True)).cached


# ---------------------------------------------------------------- through `ask`: the file's schema and signatures

TESTKIT = "testkit=" + shlex.join(TEST_SERVER)
ATTACKER = "the attacker's words"


def echo_then_answer(request: dict) -> str:
    """The model calls testkit's echo once, then answers."""
    called = any("<use_mcp_tool>" in str(m.get("content")) for m in request["messages"] if m["role"] == "assistant")
    return mcp_answer("done") if called else mcp_call("testkit", "echo", {"text": "hello"})


def ask(server: FakeOpenAI, cache: Path, trajectory: Path, *flags: str) -> Result:
    return nanbeige(
        "ask",
        "Say hello.",
        "--base-url",
        server.base_url,
        "--no-default-servers",
        "--mcp",
        TESTKIT,
        "--cache",
        cache,
        "--trajectory",
        trajectory,
        *flags,
    )


def echoed(trajectory: Path) -> ToolResult:
    [result] = load_trajectories(trajectory)[0].turns[0].tool_results
    return result


SCHEMA_EXTRAS = {
    "a trigger": f"CREATE TRIGGER rewrite AFTER INSERT ON tool_results BEGIN "
    f"UPDATE tool_results SET text = '{ATTACKER.replace(chr(39), chr(39) * 2)}'; END",
    "a view": "CREATE VIEW everything AS SELECT * FROM tool_results",
    "an index": "CREATE INDEX by_text ON tool_results (text)",
    "another table": "CREATE TABLE notes (x)",
}


@pytest.mark.parametrize("extra", SCHEMA_EXTRAS)
def test_a_cache_whose_schema_holds_more_than_nanbeige_makes_is_refused_before_anything_runs(
    tmp_path: Path, extra: str
) -> None:
    """A trigger in the file would run on each write: here it would rewrite every fresh recording."""
    cache = tmp_path / "cache.sqlite"
    with FakeOpenAI(echo_then_answer) as server:
        assert ask(server, cache, tmp_path / "first.jsonl").exit_code == 0
        tamper(cache, SCHEMA_EXTRAS[extra])
        before = dump(cache)
        asked = len(server.requests)
        result = ask(server, cache, tmp_path / "second.jsonl")
        assert len(server.requests) == asked  # the model was never asked
    assert_refused(result, cache, None, "nanbeige never makes")
    assert dump(cache) == before and not (tmp_path / "second.jsonl").exists()


def test_a_cache_table_with_a_check_of_its_own_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache.sqlite"
    with sqlite3.connect(cache) as db:  # nanbeige's columns, and a check that runs on every write
        db.execute(SCHEMA.replace("PRIMARY KEY", "CHECK (length(randomblob(1000000000))),\n    PRIMARY KEY"))
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    with FakeOpenAI(echo_then_answer) as server:
        result = ask(server, cache, tmp_path / "t.jsonl")
    assert_refused(result, cache, None, "its table is not the one nanbeige makes")


def test_a_forged_row_copying_the_live_origin_is_not_served_and_a_replay_stops(tmp_path: Path) -> None:
    """The origin is public (the server's name and version, a digest of the tool's description): anyone
    who can write the file can copy it. The signature they cannot make without the user's key."""
    cache = tmp_path / "cache.sqlite"
    with FakeOpenAI(echo_then_answer) as server:
        assert ask(server, cache, tmp_path / "first.jsonl").exit_code == 0
        tamper(cache, f"UPDATE tool_results SET text = '{ATTACKER.replace(chr(39), chr(39) * 2)}'")
        replayed = ask(server, cache, tmp_path / "replay.jsonl", "--replay")
        live = ask(server, cache, tmp_path / "live.jsonl")
    assert replayed.exit_code == 1 and "not recorded by this user on this machine" in replayed.output
    assert "nanbeige cache accept" in replayed.output
    assert live.exit_code == 0, live.output
    [said] = [line for line in live.output.splitlines() if "holds rows not recorded here" in line]
    assert f"nanbeige cache accept {cache}" in said
    assert (echoed(tmp_path / "live.jsonl").text, echoed(tmp_path / "live.jsonl").cached) == ("hello", False)
    assert ATTACKER.encode() not in file_bytes(cache)  # the tool's real answer, signed, in its place


@pytest.mark.anyio
async def test_a_signature_that_is_not_even_ascii_is_refused_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    await call(path, kit_server())
    tamper(path, "UPDATE tool_results SET mac = 'é'")
    with pytest.raises(ReplayMiss, match="not recorded by this user on this machine"):
        await call(path, kit_server(), replay=True)


def test_a_cache_made_on_another_machine_is_replayed_once_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, elsewhere, here = tmp_path / "cache.sqlite", tmp_path / "their-config", tmp_path / "my-config"
    with FakeOpenAI(echo_then_answer) as server:
        monkeypatch.setenv("XDG_CONFIG_HOME", str(elsewhere))
        assert ask(server, cache, tmp_path / "theirs.jsonl").exit_code == 0
        monkeypatch.setenv("XDG_CONFIG_HOME", str(here))
        refused = ask(server, cache, tmp_path / "refused.jsonl", "--replay")
        accepted = nanbeige("cache", "accept", cache)
        replayed = ask(server, cache, tmp_path / "replayed.jsonl", "--replay")
    assert refused.exit_code == 1 and f"accept it with `nanbeige cache accept {cache}`" in refused.output
    assert accepted.exit_code == 0 and f"accepted {cache}: 1 row signed with your key" in accepted.output
    assert replayed.exit_code == 0, replayed.output
    assert (echoed(tmp_path / "replayed.jsonl").text, echoed(tmp_path / "replayed.jsonl").cached) == ("hello", True)
    key = here / "nanbeige" / "cache.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text().strip().encode() not in file_bytes(cache)


def test_a_key_other_users_can_read_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = user_key_path()
    key.parent.mkdir(parents=True)
    key.write_text("0" * 64 + "\n")
    key.chmod(0o644)
    with FakeOpenAI(echo_then_answer) as server:
        result = ask(server, tmp_path / "cache.sqlite", tmp_path / "t.jsonl")
    assert_refused(result, key, None, f"can be read by other users: chmod 600 {key}")
