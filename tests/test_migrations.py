"""Schema migrations are recorded in the database (DESIGN §10): each once, in order, atomically."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ragent_memory.errors import StoreError
from ragent_memory.store import MIGRATIONS, Store, iso
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
