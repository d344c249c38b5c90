"""What every part of the SQLite store shares: the clock, timestamps, text as SQLite stores it,
and the lock around the one connection."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlite_utils

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

    db: sqlite_utils.Database
    clock: Clock
    _lock: threading.RLock
    _secret: bytes

    @contextmanager
    def _locked(self, what: str) -> Iterator[sqlite_utils.Database]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as err:
                raise StoreError(f"store {what} failed: {err}") from err
