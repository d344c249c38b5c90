"""The SQLite store (DESIGN §10): one file, WAL, migrations recorded in the database.

One connection shared by every thread, guarded by a lock (sqlite3 objects are not thread-safe).
"""

from __future__ import annotations

import mmap
import os
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlite_utils

from ragent_memory.core.logs import get_logger
from ragent_memory.errors import StoreError
from ragent_memory.settings import DEFAULT_LEASE_S
from ragent_memory.store.audit import AuditTable
from ragent_memory.store.base import Clock, utc_now
from ragent_memory.store.recall_index import IndexedTables
from ragent_memory.store.schema import MIGRATIONS

log = get_logger(__name__)

BUSY_TIMEOUT_S = 30.0
# The WAL index (the ``-shm`` file, https://sqlite.org/walformat.html) starts with a 48-byte
# header whose first field is the format version and whose change counter moves with every
# commit, whichever connection or process made it.
WAL_INDEX_HEADER = 48
WAL_INDEX_VERSION = 3007000
WAL_INDEX_VERSION_BYTES = WAL_INDEX_VERSION.to_bytes(4, sys.byteorder)
WAL_INDEX_CHANGE = slice(8, 12)  # the header's commit counter (native order): +1 per commit
WAL_INDEX_FRAMES = slice(16, 20)  # its mxFrame: frames in the WAL (0 after a restart)
# A checkpoint is asked of the background checkpointer once the WAL holds this many frames
# (SQLite's own default for the committing connection); the connection itself checkpoints
# only past INLINE_CHECKPOINT_FRAMES, when the background one lags behind or fails.
CHECKPOINT_FRAMES = 1_000
INLINE_CHECKPOINT_FRAMES = 10_000
UNKNOWN = object()


def _commits(header: bytes) -> int:
    return int.from_bytes(header[WAL_INDEX_CHANGE], sys.byteorder)


def _frames(header: bytes) -> int:
    return int.from_bytes(header[WAL_INDEX_FRAMES], sys.byteorder)


class _Checkpointer:
    """Checkpoints the WAL on its own thread and connection, so no turn pays for one.

    SQLite checkpoints in the connection whose commit took the WAL past its threshold: the
    commit of a turn's substitutions then copied thousands of pages into the database file
    (5-15 ms of the calling thread's CPU, a slow-model session's worst turns). Here a commit
    past ``CHECKPOINT_FRAMES`` asks for a passive checkpoint instead, which waits for no
    reader or writer; the next write transaction restarts the WAL once it is all copied."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._wanted = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._busy = False  # a checkpoint is running
        self.runs = 0  # checkpoints run (tests)

    def request(self) -> None:
        with self._lock:
            if self._closing or self._wanted:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="ragent-checkpoint", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no checkpoint is wanted or running (``gc``'s truncation, tests); False
        on timeout."""
        with self._lock:
            return self._wake.wait_for(lambda: not self._wanted and not self._busy, timeout_s)

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._lock:
                    self._wake.wait_for(lambda: self._wanted or self._closing)
                    if self._closing:
                        return
                    self._wanted, self._busy = False, True
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.runs += 1
                except sqlite3.Error as err:  # the connection's own checkpoint is the fallback
                    log.warning("store.checkpoint_failed", path=self.path, error=repr(err))
                finally:
                    with self._lock:
                        self._busy = False
                        self._wake.notify_all()
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()


class _Database(sqlite_utils.Database):
    """``atomic()`` opens its transaction with ``BEGIN IMMEDIATE``.

    A deferred ``BEGIN`` that reads and then writes upgrades its lock mid-transaction; when
    another process wrote meanwhile, SQLite fails that upgrade at once with ``database is
    locked`` instead of waiting out the busy timeout. Taking the write lock up front makes a
    second writer wait its turn.
    """

    # Told of each transaction this connection opens and commits (``Store``'s WAL gate).
    began: Callable[[], bytes | None] | None = None
    committed: Callable[[bytes | None], None] | None = None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        """``sql`` once per row, in one C loop (the mixins' batched writes)."""
        return self.conn.executemany(sql, rows)

    @contextmanager
    def atomic(self) -> Iterator[sqlite_utils.Database]:
        if self.conn.in_transaction:  # nested: sqlite-utils' savepoints
            with super().atomic() as db:
                yield db
            return
        self.conn.execute("BEGIN IMMEDIATE")
        before = self.began() if self.began is not None else None
        try:
            yield self
        except BaseException:
            self.conn.rollback()
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.rollback()
            raise
        if self.committed is not None:
            self.committed(before)


class _Probe(Exception):
    """Rolls back the write probe of :meth:`Store._check_writable`."""


class Store(IndexedTables, AuditTable):
    """The SQLite store. Thread-safe; use as a context manager or call :meth:`close`.

    Opening checks the store can do what every turn needs: its directory exists or can be
    created, the file opens, migrates and can be written, and every table is there. Anything
    else is a :class:`StoreError` naming the path and the reason, raised here rather than
    logged on every later turn.
    """

    def __init__(
        self, path: str | Path, *, clock: Clock = utc_now, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        self.path = str(path)
        self.clock = clock
        self._start_host(lease_s)
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(
                f"cannot open store {self.path!r}: its directory cannot be created "
                f"({err.strerror or err})"
            ) from err
        if self.path != ":memory:" and os.path.isdir(self.path):
            raise StoreError(f"cannot open store {self.path!r}: it is a directory")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
            self.db = _Database(conn, execute_plugins=False)
            self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if self.path != ":memory:":
                if not self.db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
                    # A new file: let gc hand freed pages back to the file system.
                    self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self._enable_wal()
                self.db.execute("PRAGMA synchronous = NORMAL")
            self._wal = (
                self.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                and self.path != ":memory:"
            )
            self._checkpointer: _Checkpointer | None = None
            if self._wal:
                self._checkpointer = _Checkpointer(self.path)
                self.db.execute(f"PRAGMA wal_autocheckpoint = {INLINE_CHECKPOINT_FRAMES}")
            self._shm: int | None = None  # a read-only descriptor of the -shm file
            self._header: mmap.mmap | None = None  # its WAL index header, mapped
            self._shm_lock = threading.Lock()  # opening them (read without the store lock)
            self._writes_mark: bytes | None = None
            self._writes: dict[str, tuple[str, int] | None] = {}
            self._versions: dict[str, int] = {}  # memory_version's answers, as of that mark
            self._touched_users: set[str] = set()  # memories changed in the open transaction
            self._recall_marked: tuple[bytes, tuple[int, str]] | None = None
            self._touched: set[str] = set()  # sessions written in the open transaction
            # recall rows the open transaction added, up to this id (0: none; -1: rows went)
            self._recall_top = 0
            self._migrate()
            self._check_schema()
            self._secret = self._load_secret()
            self._check_writable()
            self.db.began, self.db.committed = self._began, self._committed
        except (sqlite3.Error, StoreError) as err:
            if conn is not None:
                conn.close()
            if isinstance(err, StoreError):
                raise
            raise StoreError(f"cannot open store {self.path!r}: {err}") from err

    def _enable_wal(self) -> None:
        """Switch a new file to WAL; a file already in WAL stays as it is.

        The switch needs the file to itself, and SQLite refuses it with ``database is
        locked`` at once, without waiting out the busy timeout, while another connection is
        opening the same new file. Retried with a short backoff, for at most the busy timeout.
        """
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

    def _migrate(self) -> None:
        self._apply_migrations(MIGRATIONS)

    def _check_schema(self) -> None:
        self._check_tables(MIGRATIONS, "SELECT name FROM sqlite_master WHERE type = 'table'")

    def _check_writable(self) -> None:
        """Fail now on a store every later write would fail on (a read-only file or
        directory): a write that is rolled back still needs the file to be writable."""
        try:
            with self.db.atomic():
                self.db.execute("UPDATE meta SET value = value WHERE key = 'secret'")
                raise _Probe
        except _Probe:
            pass
        except sqlite3.Error as err:
            raise StoreError(
                f"cannot open store {self.path!r}: it is not writable ({err})"
            ) from err

    def file_bytes(self) -> int:
        """The size of the database on disk, its write-ahead log included (0 for
        ``:memory:``)."""
        if self.path == ":memory:":
            return 0
        total = 0
        for name in (self.path, self.path + "-wal"):
            with suppress(OSError):
                total += os.path.getsize(name)
        return total

    def _shrink(self, *, vacuum: bool) -> None:
        """Stores created by this version free pages incrementally; an older file (created
        without ``auto_vacuum``) needs ``vacuum=True`` once, which rewrites the whole file and
        switches it to incremental vacuum for later runs."""
        with self._locked("vacuum"):
            if vacuum:
                self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self.db.execute("VACUUM")
            else:
                # One page per step: run it to completion (execute() would step only once).
                self.db.conn.executescript("PRAGMA incremental_vacuum;")
            if self.path != ":memory:":
                self._truncate_wal()

    def _truncate_wal(self) -> None:
        """Copy the whole WAL into the file and truncate it. A checkpoint running on the
        background checkpointer would make it give up at once: wait that one out first, and
        try again (bounded by the busy timeout) while another connection holds one."""
        if self._checkpointer is not None:
            self._checkpointer.wait_idle(BUSY_TIMEOUT_S)
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            if time.monotonic() > deadline:
                log.warning("store.wal_not_truncated", path=self.path)
                return
            time.sleep(0.01)

    def _load_secret(self) -> bytes:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()
        if row is None:
            self.db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('secret', ?)",
                [secrets.token_hex(32)],
            )
            row = self.db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()
        return bytes.fromhex(row[0])

    def last_write(self, session_id: str) -> tuple[str, int] | None:
        """As the base class says, but asked of the database only when something was
        committed since it was last asked (the WAL index header moved) by another connection
        or process, or by this one's own write of that session (``_committed``): the per-turn
        check that no other process or host moved the session on reads 48 mapped bytes.

        A known answer is given without the store lock: the recall indexer's write
        transaction (tens of ms for a large batch) holds it, and its uncommitted rows do not
        move the header, so the answer (as of the last commit) still holds meanwhile."""
        mark = self._wal_mark()
        if mark is not None and mark == self._writes_mark:
            known = self._writes.get(session_id, UNKNOWN)
            if known is not UNKNOWN:
                return known  # type: ignore[return-value]
        with self._lock:
            mark = self._marked()
            if (known := self._writes.get(session_id, UNKNOWN)) is not UNKNOWN:
                return known  # type: ignore[return-value]
            written = super().last_write(session_id)
            if mark is not None and len(self._writes) < 10_000:
                self._writes[session_id] = written
            return written

    def _marked(self) -> bytes | None:
        """The WAL index header now, the answers kept for an older one dropped (under the
        store lock)."""
        mark = self._wal_mark()
        if mark is None or mark != self._writes_mark:
            self._writes.clear()
            self._versions.clear()
            self._writes_mark = mark
        return mark

    def memory_version(self, user_id: str) -> int:
        """As the base class says, kept as ``last_write``'s answers are (asked each turn a
        user is named, for the memory block): this connection's own commits drop only the
        users whose memories they changed."""
        mark = self._wal_mark()
        if mark is not None and mark == self._writes_mark:
            known = self._versions.get(user_id)
            if known is not None:
                return known
        with self._lock:
            mark = self._marked()
            if (known := self._versions.get(user_id)) is not None:
                return known
            version = super().memory_version(user_id)
            if mark is not None and len(self._versions) < 10_000:
                self._versions[user_id] = version
            return version

    def _memories_moved(self, user_id: str) -> None:
        self._touched_users.add(user_id)

    def recall_mark(self) -> tuple[int, str]:
        """As the base class says, asked of the database only when something was committed
        since (the WAL index header moved) by another connection or process, or by this
        one's own commit that deleted recall rows; this one's other commits carry the answer
        forward (``_committed``: a turn's session write, the indexer's rows, whose highest
        id it knows). Without the store lock when known (see ``last_write``)."""
        mark = self._wal_mark()
        marked = self._recall_marked
        if mark is not None and marked is not None and marked[0] == mark:
            return marked[1]
        with self._lock:
            mark = self._wal_mark()  # read first: the answer is at least as new as it
            answer = super().recall_mark()
            self._recall_marked = None if mark is None else (mark, answer)
            return answer

    def _mark_written(self, session_id: str) -> None:
        super()._mark_written(session_id)
        self._touched.add(session_id)

    def _recall_moved(self, top: int | None) -> None:
        if top is None or self._recall_top < 0:
            self._recall_top = -1
        else:
            self._recall_top = max(self._recall_top, top)

    def _began(self) -> bytes | None:
        """The WAL index header as this connection's write transaction starts: under the
        write lock, so it shows every other connection's commits."""
        self._touched = set()
        self._touched_users = set()
        self._recall_top = 0
        return self._wal_mark()

    def _committed(self, before: bytes | None) -> None:
        """After this connection's own commit: when nothing else was committed since
        ``last_write`` last asked (the header before the commit is the one it saw) and the
        header's commit counter moved by exactly one (this commit), its answers still hold
        but for the sessions this commit wrote, and ``memory_version``'s but for the users
        whose memories it changed. Else the next call asks again.
        ``recall_mark``'s answer is carried so too: as it was, or with the highest id of the
        rows this commit added; one that deleted rows leaves the next call to ask.
        A WAL of ``CHECKPOINT_FRAMES`` or more is handed to the background checkpointer."""
        touched, self._touched = self._touched, set()
        users, self._touched_users = self._touched_users, set()
        moved, self._recall_top = self._recall_top, 0
        after = self._wal_mark()
        if (
            after is not None
            and self._checkpointer is not None
            and _frames(after) >= CHECKPOINT_FRAMES
        ):
            self._checkpointer.request()
        if before is None or after is None or _commits(after) != (_commits(before) + 1) % 2**32:
            return
        marked = self._recall_marked
        if marked is not None and marked[0] == before and moved >= 0:
            top, epoch = marked[1]
            self._recall_marked = (after, (max(top, moved), epoch))
        if before != self._writes_mark:
            return
        for session_id in touched:
            self._writes.pop(session_id, None)
        for user_id in users:
            self._versions.pop(user_id, None)
        self._writes_mark = after

    def _wal_mark(self) -> bytes | None:
        """The WAL index header as it is now; None when it cannot be read (not in WAL mode,
        no index yet), and then every ``last_write`` asks the database.

        Read from a read-only mapping of the ``-shm`` file: no system call a turn (a ``pread``
        and an ``fstat`` were a tenth of a quiet turn's CPU). The mapping cannot fault: while
        this store's connection is open, SQLite neither truncates nor deletes that file (a
        connection holds a shared lock on the database file and on the index's
        "dead-man switch" byte for its whole life; the index is reset only by a connection
        that finds no other holding them, removed only by the last one to close). Those are
        POSIX locks, which a process loses when it closes *any* descriptor of the file, so
        the descriptor and the mapping (which holds a duplicate of it) stay open until
        ``close`` has closed the connection: an earlier mapping closed its file at once and
        let another process reset the index under it."""
        header = self._header
        if header is None:
            header = self._map_header()
            if header is None:
                return None
        try:
            mark = header[:WAL_INDEX_HEADER]
        except ValueError:  # closed meanwhile (``close``)
            return None
        return mark if mark[:4] == WAL_INDEX_VERSION_BYTES else None

    def _map_header(self) -> mmap.mmap | None:
        with self._shm_lock:
            if self._header is not None or not self._wal:
                return self._header
            if self._shm is None:
                try:
                    self._shm = os.open(self.path + "-shm", os.O_RDONLY)
                except OSError:
                    return None
            try:  # refused while the file is shorter than the header (not initialised yet)
                self._header = mmap.mmap(self._shm, WAL_INDEX_HEADER, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return None  # the descriptor stays open: closing it would drop SQLite's locks
            return self._header

    def migrations(self) -> list[str]:
        with self._locked("read"):
            return [r[0] for r in self.db.execute("SELECT name FROM _migrations ORDER BY version")]

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()  # first: a checkpoint running finishes
        with self._lock, self._shm_lock:
            self._wal = False
            self.db.close()  # first: closing the -shm descriptors drops the connection's locks
            if self._header is not None:
                self._header.close()
                self._header = None
            if self._shm is not None:
                os.close(self._shm)
                self._shm = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
