"""What only the SQLite store has: its migration history from older files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragent_memory.records import Substitution
from ragent_memory.store import MIGRATIONS, Store, substitution_key
from ragent_memory.store import sqlite as sqlite_backend


def test_substitution_keys_survive_the_rename_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite store written before migration 004 keeps its substitutions under ``key``."""
    path = tmp_path / "old.db"
    sub = Substitution(substitution_key(3, "abc"), "trim", "rm-1", {"role": "tool", "content": "x"})
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_backend, "MIGRATIONS", MIGRATIONS[:3])
        with Store(path) as old:
            old.db.execute(
                "INSERT INTO substitutions (session_id, digest, kind, ref, message, created_at)"
                " VALUES ('s1', ?, 'trim', 'rm-1', ?, '2025-01-01T00:00:00.000Z')",
                [sub.key, json.dumps(sub.message)],
            )
            old.db.conn.commit()
    with Store(path) as store:
        assert {sub.key: sub} == store.substitutions("s1")
        names = store.migrations()
        columns = [r[1] for r in store.db.execute("PRAGMA table_info(substitutions)")]
    assert [name for name, _ in MIGRATIONS] == names
    assert "key" in columns and "digest" not in columns
