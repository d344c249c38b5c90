"""The SQLite store (DESIGN §10): one file, WAL, migrations recorded in the database.

One connection shared by every thread, guarded by a lock (sqlite3 objects are not thread-safe).
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from pathlib import Path

import sqlite_utils

from ..errors import StoreError
from .audit import AuditTable
from .base import Clock, iso, utc_now
from .memories import MemoryTables
from .schema import MIGRATIONS
from .sessions import SessionTables


class Store(SessionTables, MemoryTables, AuditTable):
    """The SQLite store. Thread-safe; use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | Path, *, clock: Clock = utc_now) -> None:
        self.path = str(path)
        self.clock = clock
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self.db = sqlite_utils.Database(conn, execute_plugins=False)
            self.db.execute("PRAGMA busy_timeout = 30000")
            if self.path != ":memory:":
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
            self._secret = self._load_secret()
        except sqlite3.Error as err:
            raise StoreError(f"cannot open store {self.path!r}: {err}") from err

    def _migrate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS _migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        done = {row[0] for row in self.db.execute("SELECT name FROM _migrations").fetchall()}
        for version, (name, sql) in enumerate(MIGRATIONS, start=1):
            if name in done:
                continue
            with self.db.atomic():
                for statement in sql.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.table("_migrations").insert(
                    {"version": version, "name": name, "applied_at": iso(self.clock())}
                )

    def _load_secret(self) -> bytes:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()
        if row is None:
            self.db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('secret', ?)",
                [secrets.token_hex(32)],
            )
            row = self.db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()
        return bytes.fromhex(row[0])

    def migrations(self) -> list[str]:
        with self._locked("read"):
            return [r[0] for r in self.db.execute("SELECT name FROM _migrations ORDER BY version")]

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
