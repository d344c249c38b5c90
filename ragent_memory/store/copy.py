"""``ragent-memory migrate``: copy a SQLite store into an empty PostgreSQL one, in one
transaction, keeping ids, the secret (so every recall ref already handed out still resolves)
and the memory counters."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from ragent_memory.errors import StoreError
from ragent_memory.store.postgres import PostgresStore
from ragent_memory.store.schema import MIGRATIONS, tables_created
from ragent_memory.store.sqlite import Store

# Leases and last writers are per running host and start afresh.
PER_HOST = frozenset({"compaction_leases", "session_writes"})
# Copied in the order the migrations create them (a table before those referring to it).
TABLES = tuple(t for t in tables_created(MIGRATIONS) if t not in PER_HOST)
SKIPPED = frozenset({"_migrations", "sqlite_sequence", *PER_HOST})
# Their id sequences move on past the ids copied.
IDENTITIES = ("compactions", "memories", "memory_pending", "recall_messages")
_SELECT = MappingProxyType(
    {
        "memory_fts": "SELECT rowid, terms, excerpt, user_key, session_key FROM memory_fts",
        "recall_fts": "SELECT rowid, terms, scope FROM recall_fts",
    }
)
_BATCH = 500
# Statements the copy runs on the target (PostgreSQL's dialect).
META_COPIED = (
    "INSERT INTO meta (key, value) VALUES (%s, %s)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
SUPERSEDED_COPIED = "UPDATE memories SET superseded_by = %s WHERE id = %s"


def _tables(source: Store) -> set[str]:
    rows = source.db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    # FTS5 keeps its index in shadow tables named after it (memory_fts_data, …).
    virtual = {str(n) for n, sql in rows if str(sql).upper().startswith("CREATE VIRTUAL TABLE")}
    return {str(n) for n, _ in rows if not any(str(n).startswith(f"{v}_") for v in virtual)}


def copy_store(source: Store, target: PostgresStore) -> dict[str, int]:
    """Copy every table of ``source`` into ``target``; returns the rows copied per table.
    Raises ``StoreError`` (and copies nothing) when the target already holds data or the
    source has a table this version does not know."""
    with source._locked("read"):
        unknown = sorted(_tables(source) - set(TABLES) - SKIPPED)
        if unknown:
            raise StoreError(f"cannot copy {source.path!r}: unknown tables {', '.join(unknown)}")
        data = {}
        for table in TABLES:
            cursor = source.db.execute(_SELECT.get(table, f"SELECT * FROM {table}"))
            data[table] = ([d[0] for d in cursor.description], cursor.fetchall())
    counts: dict[str, int] = {}
    with target._locked("migrate"), target.db.atomic():
        for table in ("sessions", "compactions", "memories", "offloads"):
            (count,) = target.db.execute(f"SELECT COUNT(*) FROM {table}").fetchall()[0]
            if count:
                raise StoreError(f"cannot copy into {target.path!r}: its {table} are not empty")
        for table in TABLES:
            columns, rows = data[table]
            counts[table] = len(rows)
            _insert(target, table, columns, rows)
        target._measure_old_rows()  # the recall rows' keys (SQLite's FTS5 had none to copy)
        for table in IDENTITIES:
            target.db.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" COALESCE(MAX(id), 0) + 1, false) FROM {table}"
            )
    return counts


def _insert(target: PostgresStore, table: str, columns: list[str], rows: list[Any]) -> None:
    if table == "meta":  # the target made its own secret and counter: the source's win
        for key, value in rows:
            target.db.execute(META_COPIED, [key, value])
        return
    values = [list(row) for row in rows]  # the target's ``executemany`` applies ``pg_text``
    if table == "offloads":
        at = columns.index("content")
        for row in values:
            text = row[at]
            row[at] = text if isinstance(text, bytes) else target._storable(text)
    later: list[tuple[Any, Any]] = []
    if table == "memories":  # a row may point at a later one: link them after inserting all
        at, key = columns.index("superseded_by"), columns.index("id")
        later = [(row[at], row[key]) for row in values if row[at] is not None]
        for row in values:
            row[at] = None
    # The source's columns, whatever its tables hold: PostgreSQL's statement, made here.
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    for start in range(0, len(values), _BATCH):
        target.db.executemany(sql, values[start : start + _BATCH])
    if later:
        target.db.executemany(SUPERSEDED_COPIED, later)
