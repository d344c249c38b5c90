"""Schema migrations are recorded in the database (docs/design.md §10): each once, in order, atomically."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import PASSWORD_ENV

from ragent_memory import StoreSettings
from ragent_memory.errors import StoreError
from ragent_memory.store import MIGRATIONS, Store, iso
from ragent_memory.store import open_store as open_backend
from ragent_memory.store import sqlite as sqlite_backend

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
T1 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def recorded(db_path: str) -> list[tuple[int, str, str]]:
    """The ``_migrations`` table, read straight from the SQLite file."""
    with sqlite3.connect(db_path) as db:
        found = db.execute("SELECT version, name, applied_at FROM _migrations ORDER BY version")
        rows = [(int(version), str(name), str(at)) for version, name, at in found]
    db.close()
    return rows


def tables(db_path: str) -> set[str]:
    with sqlite3.connect(db_path) as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    return names


def open_store(db_path: str, now: datetime) -> None:
    Store(db_path, clock=lambda: now).close()


def test_a_new_store_records_every_migration_once(db_path: str) -> None:
    """A new file gets every migration, numbered from 1 in list order, stamped when applied."""
    open_store(db_path, T0)
    expected = [(k, name, iso(T0)) for k, (name, _sql) in enumerate(MIGRATIONS, start=1)]
    assert expected == recorded(db_path)
    assert "compactions" in tables(db_path)


def test_reopening_applies_nothing_again(db_path: str) -> None:
    """Opening an up-to-date store later changes neither the record nor the data."""
    open_store(db_path, T0)
    before = recorded(db_path)
    with sqlite3.connect(db_path) as db:
        db.execute("INSERT INTO meta (key, value) VALUES ('probe', 'kept')")
    db.close()
    open_store(db_path, T1)
    assert before == recorded(db_path)
    with sqlite3.connect(db_path) as db:
        assert [("kept",)] == db.execute("SELECT value FROM meta WHERE key = 'probe'").fetchall()
    db.close()


def test_an_older_store_gets_only_the_missing_migrations(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written by an older release (first migration only) is brought up to date on
    open: the old record stays, the new migrations are added after it."""
    assert len(MIGRATIONS) >= 2
    monkeypatch.setattr(sqlite_backend, "MIGRATIONS", MIGRATIONS[:1])
    open_store(db_path, T0)
    monkeypatch.setattr(sqlite_backend, "MIGRATIONS", MIGRATIONS)
    open_store(db_path, T1)
    expected = [(1, MIGRATIONS[0][0], iso(T0))] + [
        (k, name, iso(T1)) for k, (name, _sql) in enumerate(MIGRATIONS[1:], start=2)
    ]
    assert expected == recorded(db_path)


def test_a_failing_migration_leaves_no_trace(db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration that fails halfway is rolled back whole and not recorded; opening fails
    with a StoreError naming the file."""
    open_store(db_path, T0)
    before, schema = recorded(db_path), tables(db_path)
    broken = ("999_broken", "CREATE TABLE half_done (x TEXT); CREATE TABLE oops (")
    monkeypatch.setattr(sqlite_backend, "MIGRATIONS", (*MIGRATIONS, broken))
    with pytest.raises(StoreError, match=Path(db_path).name):
        open_store(db_path, T1)
    assert (before, schema) == (recorded(db_path), tables(db_path))


# ------------------------------------------------------------------ ids kept once (SQLite 012)

OLD_ROWS = (
    "INSERT INTO sessions (session_id, user_id, generation, last_generation, summary,"
    " updated_at) VALUES ('s1', 'u1', 1, 1, 'sum', 't')",
    "INSERT INTO substitutions (session_id, key, kind, ref, message, created_at)"
    """ VALUES ('s1', '3:abc', 'trim', 'rm-x', '{"role": "tool", "content": "x"}', 't')""",
    "INSERT INTO dropped_sessions (session_id, dropped_at) VALUES ('gone', 't')",
    "INSERT INTO memories (id, user_id, kind, content, status, session_id, generation,"
    " created_at, updated_at) VALUES (5, 'u1', 'summary', 'Lisbon offsite', 'active', 's1', 1,"
    " 't', 't')",
    "INSERT INTO memory_fts (rowid, terms, excerpt, user_id, session_id)"
    " VALUES (5120, 'lisbon offsite', 'Lisbon offsite', 'u1', 's1')",
    "INSERT INTO memory_pending (id, user_id, session_id, raw_index, digest, content,"
    " created_at) VALUES (4, 'u1', 's1', 2, 'd', 'I like tea', 't')",
    "INSERT INTO memory_cursors (user_id, session_id, seen, last_digest, updated_at)"
    " VALUES ('u1', 's1', 3, 'd', 't')",
    "INSERT INTO memory_seen (user_id, session_id, digest) VALUES ('u1', 's1', 'd')",
    "INSERT INTO memory_versions (user_id, version) VALUES ('u1', 7)",
    "INSERT INTO session_writes (session_id, writer, stamp) VALUES ('s1', 'host', 3)",
    "INSERT INTO compaction_leases (session_id, owner, expires_at)"
    " VALUES ('s1', 'host', '9999-01-01T00:00:00.000Z')",
    "INSERT INTO recall_messages (id, user_id, session_id, position, role, content, digest,"
    " created_at) VALUES (9, 'u1', 's1', 1, 'user', 'where is the offsite', 'dg', 't')",
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_store_from_before_keyed_ids_keeps_everything(
    backend: str, db_path: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written before ids were keyed is migrated in place: every session, memory,
    pending message, cursor, offload and index row reads back under its ids, counters go on
    past the ids kept, and no table but ``ids`` and the audit keeps an id's text."""
    if backend == "sqlite":
        module, settings = sqlite_backend, StoreSettings(path=db_path)
    else:
        from ragent_memory.store import postgres as module

        settings = StoreSettings(
            url=request.getfixturevalue("fresh_pg_url"), password_env=PASSWORD_ENV
        )
    keyed = [name for name, _ in module.MIGRATIONS].index(
        "012_keyed_ids" if backend == "sqlite" else "008_keyed_ids"
    )
    every = module.MIGRATIONS
    monkeypatch.setattr(module, "MIGRATIONS", every[:keyed])
    with open_backend(settings) as old:
        ref = old.ref_for("s1", "the original")
        with old._locked("test"), old.db.atomic():
            for sql in OLD_ROWS:
                old.db.execute(sql)
            mark = "?" if backend == "sqlite" else "%s"  # each backend runs its own dialect
            old.db.execute(
                "INSERT INTO offloads (session_id, ref, sha256, content, chars, created_at,"
                f" expires_at) VALUES ('s1', {mark}, 'x', {mark}, 12, 't',"
                " '9999-01-01T00:00:00.000Z')",
                [ref, old._storable("the original")],
            )
    monkeypatch.setattr(module, "MIGRATIONS", every)
    with open_backend(settings) as store:
        state = store.load_session("s1")
        assert state is not None and ("u1", 1, "sum") == (
            state.user_id,
            state.generation,
            state.summary,
        )
        assert ["3:abc"] == list(store.substitutions("s1"))
        assert "the original" == store.read_offload("s1", ref)
        assert ["Lisbon offsite"] == store.search_summaries(
            "u1", '"lisbon"', exclude_session="s9", limit=5
        )
        assert [("s1", "I like tea")] == [
            (p.session_id, p.content) for p in store.pending_messages("u1", limit=5)
        ]
        assert (3, "d") == store.memory_cursor("u1", "s1")
        assert 7 == store.memory_version("u1")
        assert ("host", 3) == store.last_write("s1")
        assert not store.compaction_leased("s1")  # leases start afresh
        [row] = store.indexed_at("s1", [1])
        assert ("s1", "where is the offsite") == (row.session_id, row.content)
        assert ["s1"] == [r["session_id"] for r in store.memory_rows("u1")]
        new_id = store.record_summary("u1", "s2", 1, "more", [])
        assert 1 == store.gc().dropped_sessions
        if backend == "sqlite":  # (PostgreSQL changes its columns in place, ids untouched)
            assert new_id > 5
        assert {("compactions", "session_id"), ("compactions", "user_id")} == id_columns(store)


def id_columns(store: Any) -> set[tuple[str, str]]:
    """The (table, column) pairs named ``session_id`` or ``user_id``."""
    with store._locked("test"):
        if isinstance(store, Store):
            names = [r[0] for r in store.db.execute("SELECT name FROM sqlite_master")]
            return {
                (table, column[1])
                for table in names
                if not table.startswith("sqlite_")
                for column in store.db.execute(f"PRAGMA table_info('{table}')")
                if column[1] in ("session_id", "user_id")
            }
        found = store.db.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND column_name IN ('session_id', 'user_id')"
        )
        return {(str(table), str(column)) for table, column in found.fetchall()}
