"""What every part of the store shares: the clock, timestamps, text as SQLite stores it, and
the lock around the connection.

The concern mixins write SQL both backends run (``?`` placeholders, ``ON CONFLICT`` upserts,
``RETURNING``); the few statements that differ are methods here, in SQLite's dialect, which the
PostgreSQL backend overrides.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from ..errors import StoreError

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _storable(text: str) -> str | bytes:
    """``text`` as SQLite can store it: lone surrogates (valid in a Python str, not in UTF-8)
    are kept as a BLOB so a recall still returns the original exactly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


def _json_text(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if isinstance(_storable(text), str) else json.dumps(value)


class StoreBase:
    """The connection, its lock and the clock; each concern's tables are a mixin over this."""

    db: Any  # sqlite_utils.Database, or the PostgreSQL connection of the calling thread
    clock: Clock
    _lock: threading.RLock
    _secret: bytes

    # The UTF-8 size of ``offloads.content`` in SQL.
    _OCTETS = "LENGTH(CAST(content AS BLOB))"

    @contextmanager
    def _locked(self, what: str) -> Iterator[Any]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as err:
                raise StoreError(f"store {what} failed: {err}") from err

    def _storable(self, text: str) -> str | bytes:
        """An offload's text as its ``content`` column keeps it."""
        return _storable(text)

    def _search_summaries(
        self, query: str, user_id: str, exclude_session: str, limit: int
    ) -> list[Any]:
        """``(excerpt,)`` rows of ``memory_fts`` matching the FTS5 ``query``, best first."""
        rows: list[Any] = self.db.execute(
            "SELECT excerpt FROM memory_fts WHERE memory_fts MATCH ? AND user_id = ?"
            " AND session_id != ? ORDER BY rank, rowid LIMIT ?",
            [query, user_id, exclude_session, limit],
        ).fetchall()
        return rows
