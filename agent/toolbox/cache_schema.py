"""The cache file's one table: its SQL in each format, and the check that a file holds exactly that table
and nothing else (a cache file is untrusted: a trigger, view or index in it could run on each write),
bringing an older format up to date."""

from __future__ import annotations

import re
import sqlite3

SCHEMA_VERSION = 3  # 2: the origin column; 3: the mac column

SCHEMA = """CREATE TABLE IF NOT EXISTS tool_results (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    text TEXT NOT NULL,
    is_error INTEGER NOT NULL,
    succeeded INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT '',
    mac TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (server, tool, arguments)
) WITHOUT ROWID"""
ADDED_COLUMNS = {2: "origin TEXT NOT NULL DEFAULT ''", 3: "mac TEXT NOT NULL DEFAULT ''"}
"""The columns each format added to the one before (SQLite writes an added column into the table's SQL
after the last one, so a file brought up to date holds the same SQL as one made new)."""


def squeezed(sql: str) -> str:
    return re.sub(r"\s+", "", sql).lower()


def table_sql(version: int) -> str:
    """The table's SQL as a file of that format holds it, white space and case aside."""
    sql = SCHEMA.replace("IF NOT EXISTS ", "")
    for newer in range(version + 1, SCHEMA_VERSION + 1):
        sql = sql.replace(f"    {ADDED_COLUMNS[newer]},\n", "")
    return squeezed(sql)


def check_schema(db: sqlite3.Connection, replay: bool) -> None:
    """Make a new file's table, or check that the file holds that table and nothing else, bringing an
    older format up to date. Anything else in a file (a trigger, a view, an index, another table, a
    table with checks or defaults of its own) could run each time a result is recorded: refused."""
    objects = db.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if not objects and not replay:
        db.execute(SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    tables = [sql for kind, name, sql in objects if (kind, name) == ("table", "tool_results")]
    if not tables:
        raise sqlite3.DatabaseError("it is another SQLite file, not a tool-result cache")
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"it was written by a newer nanbeige (format {version})")
    extra = [f"{kind} {name!r}" for kind, name, _ in objects if (kind, name) != ("table", "tool_results")]
    if extra:
        raise sqlite3.DatabaseError(
            f"it holds a {extra[0]}, which nanbeige never makes (a cache file is untrusted: "
            "nothing in it may run when a result is recorded); record a new cache"
        )
    if version < 1 or squeezed(tables[0]) != table_sql(version):
        raise sqlite3.DatabaseError(f"its table is not the one nanbeige makes (format {version}): record a new cache")
    for newer in range(version + 1, SCHEMA_VERSION + 1):  # older rows read as recorded from no server, unsigned
        db.execute(f"ALTER TABLE tool_results ADD COLUMN {ADDED_COLUMNS[newer]}")
    if version != SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
