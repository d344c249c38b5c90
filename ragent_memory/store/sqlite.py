"""The SQLite store (docs/design.md §10): one file, WAL, migrations recorded in the database.

One connection shared by every thread, guarded by a lock (sqlite3 objects are not thread-safe),
and a second one, under its own lock, for the small reads made on every turn (``_read_now``)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlite_utils

from ragent_memory.core.logs import get_logger
from ragent_memory.errors import StoreError
from ragent_memory.settings import DEFAULT_LEASE_S
from ragent_memory.store.audit import AuditTable
from ragent_memory.store.base import Clock, Sql, key_of, utc_now
from ragent_memory.store.recall_index import IndexedTables
from ragent_memory.store.schema import MIGRATIONS
from ragent_memory.store.turns import TurnTables
from ragent_memory.store.vectors import VectorTables

log = get_logger(__name__)

BUSY_TIMEOUT_S = 30.0


class _Database(sqlite_utils.Database):
    """``atomic()`` opens its transaction with ``BEGIN IMMEDIATE``: a deferred ``BEGIN`` that
    reads, then writes after another process wrote, fails at once with ``database is locked``
    instead of waiting out the busy timeout; taking the write lock up front makes it wait."""

    def execute(self, sql: str | Sql, parameters: Any = None) -> sqlite3.Cursor:
        return super().execute(sql.sqlite if isinstance(sql, Sql) else sql, parameters)

    def executemany(self, sql: str | Sql, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        return self.conn.executemany(sql.sqlite if isinstance(sql, Sql) else sql, rows)

    @contextmanager
    def atomic(self) -> Iterator[sqlite_utils.Database]:
        if self.conn.in_transaction:  # nested: sqlite-utils' savepoints
            with super().atomic() as db:
                yield db
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.rollback()
            raise


def _make_private_dirs(directory: Path) -> None:
    """``mkdir -p`` with each directory it creates 0700 (``mkdir``'s mode is masked by the
    umask, hence the ``chmod``)."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for created in reversed(missing):
        with suppress(FileExistsError):  # another process made it meanwhile: theirs
            created.mkdir(mode=0o700)
            os.chmod(created, 0o700)


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
    # Migration 012 keys the ids a store already holds with it (schema.py).
    conn.create_function("id_key", 1, key_of, deterministic=True)
    return conn


class Store(IndexedTables, VectorTables, AuditTable, TurnTables):
    """The SQLite store. Thread-safe; use as a context manager or call :meth:`close`.
    Opening checks what every turn needs (directory, file, migrations, writable, every table)
    and raises a :class:`StoreError` naming the path and reason, not logged on every turn."""

    def __init__(
        self, path: str | Path, *, clock: Clock = utc_now, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        self.path = str(path)
        self.clock = clock
        self._start_host(lease_s)
        self._lock = threading.RLock()
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        self._check_path()
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(self.path)
            self.db = _Database(conn, execute_plugins=False)
            self._configure()
            self._apply_migrations(MIGRATIONS)
            self._check_tables(MIGRATIONS, "SELECT name FROM sqlite_master WHERE type = 'table'")
            self._check_writable()
            self._secret = self._load_secret()
            if self.path != ":memory:":
                self._reader = _connect(self.path)
        except (sqlite3.Error, StoreError) as err:
            if conn is not None:
                conn.close()
            if isinstance(err, StoreError):
                raise
            raise StoreError(f"cannot open store {self.path!r}: {err}") from err

    def _check_path(self) -> None:
        """The directory (made owner-only when this creates it) and the file, created
        owner-only whatever the umask: SQLite gives its -wal, -shm and -journal the file's
        mode, and the store holds every conversation, the facts and the scope secrets."""
        if self.path == ":memory:":
            return
        try:
            _make_private_dirs(Path(self.path).parent)
        except OSError as err:
            raise StoreError(
                f"cannot open store {self.path!r}: its directory cannot be created "
                f"({err.strerror or err})"
            ) from err
        if os.path.isdir(self.path):
            raise StoreError(f"cannot open store {self.path!r}: it is a directory")
        try:  # a new file only: SQLite opens (and judges) one that exists
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        except OSError as err:
            raise StoreError(f"cannot open store {self.path!r}: {err.strerror or err}") from err

    def _configure(self) -> None:
        self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if self.path == ":memory:":
            return
        if not self.db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            # A new file: let gc hand freed pages back to the file system.
            self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        self._enable_wal()
        self.db.execute("PRAGMA synchronous = NORMAL")

    def _enable_wal(self) -> None:
        """Switch a new file to WAL. The switch needs the file to itself: SQLite refuses it
        with ``database is locked`` at once, not waiting out the busy timeout, while another
        connection opens the same new file; retried with a backoff, within the busy timeout."""
        if self.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            return
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause = 0.001
        while True:
            try:
                self.db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _check_writable(self) -> None:
        """Fail now on a store every later write would fail on (a read-only file or
        directory): a write that is rolled back still needs the file to be writable."""
        conn = self.db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("UPDATE meta SET value = value WHERE key = 'secret'")
            finally:
                conn.rollback()
        except sqlite3.Error as err:
            raise StoreError(
                f"cannot open store {self.path!r}: it is not writable ({err})"
            ) from err

    def _read_now(self, sql: Sql, params: Sequence[Any]) -> list[Any]:
        """On the reading connection (in WAL a reader waits for no writer): a turn's checks,
        on ``serve``'s event loop too, never wait for the store lock that the recall indexer's
        write transaction holds, and see every connection's commits, this store's included."""
        with self._reader_lock:
            reader = self._reader  # None for ``:memory:`` (one connection) and once closed
            if reader is not None:
                try:
                    return reader.execute(sql.sqlite, params).fetchall()
                except sqlite3.Error as err:
                    raise StoreError(f"store read failed: {err}") from err
        return super()._read_now(sql, params)

    def file_bytes(self) -> int:
        """The size of the database on disk, its WAL included (0 for ``:memory:``)."""
        if self.path == ":memory:":
            return 0
        total = 0
        for name in (self.path, self.path + "-wal"):
            with suppress(OSError):
                total += os.path.getsize(name)
        return total

    def _shrink(self, *, vacuum: bool) -> None:
        """Free pages incrementally; a file created without ``auto_vacuum`` needs ``vacuum=True``
        once, which rewrites it and switches it to incremental vacuum."""
        with self._locked("vacuum"):
            if vacuum:
                self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self.db.execute("VACUUM")
            else:
                # One page per step: run it to completion (execute() would step only once).
                self.db.conn.executescript("PRAGMA incremental_vacuum;")
            self._truncate_wal()

    def _truncate_wal(self) -> None:
        """Copy the whole WAL into the file and truncate it (a no-op without a WAL); try again
        (bounded by the busy timeout) while another connection's checkpoint or reader holds it."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            if time.monotonic() > deadline:
                log.warning("store.wal_not_truncated", path=self.path)
                return
            time.sleep(0.01)

    def close(self) -> None:
        self._stop_host()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        with self._lock:
            self.db.close()
