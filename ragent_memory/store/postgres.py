"""The PostgreSQL store (docs/design.md §10, many hosts): the same tables and contract as SQLite's, shared
by every host that points ``store.url`` at one database.

Connections come from a ``psycopg_pool`` pool, one per calling thread for the length of a store
call. Every write transaction first takes one transaction-scoped advisory lock, so writers are
serialised across hosts exactly as SQLite serialises them within a machine, and a read-check-
write (a compaction's commit against the generation it started from) cannot interleave with
another host's. Each statement is a named constant in each dialect (``base.Sql``): the
PostgreSQL text runs as written, nothing is rewritten on the way.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from ragent_memory.core.memo import Memo
from ragent_memory.errors import StoreError
from ragent_memory.settings import DEFAULT_LEASE_S
from ragent_memory.store.audit import AuditTable
from ragent_memory.store.base import Clock, Sql, utc_now
from ragent_memory.store.pg_schema import MIGRATIONS
from ragent_memory.store.recall_index import MEASURE_ROWS, MEASURED, IndexedTables
from ragent_memory.store.turns import TurnTables
from ragent_memory.store.vectors import VectorTables
from ragent_memory.text.keys import query_keys, text_terms
from ragent_memory.text.porter import stem

# The advisory lock every write transaction takes (any constant; "ragent" in ASCII).
WRITE_LOCK = 0x72_61_67_65_6E_74
STEM_CHARS = 2_000_000  # tokens whose stem is kept, by their length
# Rows indexed before keys were kept, or copied from SQLite (its FTS5 had no keys to copy).
UNMEASURED = (
    "SELECT m.id, m.content FROM recall_messages AS m LEFT JOIN recall_fts AS f"
    " ON f.rowid = m.id WHERE m.tokens IS NULL OR (f.rowid IS NOT NULL AND f.keys IS NULL)"
    " ORDER BY m.id LIMIT %s"
)
KEYED = "UPDATE recall_fts SET keys = %s WHERE rowid = %s"
MIGRATED = "SELECT 1 FROM _migrations WHERE name = %s"
_PHRASE = re.compile(r'"((?:[^"]|"")*)"')


def pg_text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: it becomes U+FFFD (originals that must come back
    exactly, the offloads, are BYTEA and never pass here as text)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class _Connection:
    """One pooled connection as the mixins use it: ``execute`` and ``atomic``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str | Sql, params: Any = ()) -> psycopg.Cursor[Any]:
        text = sql.postgres if isinstance(sql, Sql) else sql
        return self.conn.execute(text, [pg_text(p) for p in params] if params else None)

    def executemany(self, sql: str | Sql, rows: Iterable[Sequence[Any]]) -> None:
        text = sql.postgres if isinstance(sql, Sql) else sql
        with self.conn.cursor() as cursor:
            cursor.executemany(text, [[pg_text(p) for p in row] for row in rows])

    @contextmanager
    def atomic(self) -> Iterator[None]:
        is_outermost = not self.conn.info.transaction_status
        with self.conn.transaction():
            if is_outermost:
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [WRITE_LOCK])
            yield


class _ThreadConnection:
    """``store.db``: the connection the calling thread checked out in ``_locked``."""

    def __get__(self, store: PostgresStore, owner: type | None = None) -> _Connection:
        conn: _Connection | None = getattr(store._local, "conn", None)
        if conn is None:
            raise StoreError("store used outside a store call (no connection checked out)")
        return conn


class PostgresStore(IndexedTables, VectorTables, AuditTable, TurnTables):
    """The PostgreSQL store. Thread-safe; use as a context manager or call :meth:`close`.

    ``url`` must not hold a password; give it as ``password`` (read from the environment by
    the settings). Error messages never contain it.
    """

    db = _ThreadConnection()
    _MEASURED_SINCE = "011_recall_keys"

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        clock: Clock = utc_now,
        pool_size: int = 8,
        lease_s: float = DEFAULT_LEASE_S,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.path = url
        self.clock = clock
        self._stems = Memo(stem, STEM_CHARS, len)  # Porter in Python: most of keying a row
        self._start_host(lease_s)
        self._password = password
        self._local = threading.local()
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": int(connect_timeout_s)}
        if password is not None:
            kwargs["password"] = password
        self._timeout_s = connect_timeout_s
        try:
            # One direct connection first: a refused login fails now, with the server's reason,
            # instead of the pool retrying in the background until its timeout.
            with psycopg.connect(url, **kwargs) as conn:
                self._local.conn = _Connection(conn)
                try:
                    self._apply_migrations(MIGRATIONS)
                    self._check_tables(
                        MIGRATIONS,
                        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()",
                    )
                    self._secret = self._load_secret()
                    self._measure_old_rows()
                finally:
                    self._local.conn = None
        except psycopg.Error as err:
            raise StoreError(f"cannot open store {url!r}: {self._scrub(err)}") from None
        self._pool = psycopg_pool.ConnectionPool(
            url, kwargs=kwargs, min_size=1, max_size=pool_size, open=True, name="ragent-memory"
        )

    def _scrub(self, err: BaseException) -> str:
        text = str(err).strip() or type(err).__name__
        return text.replace(self._password, "***") if self._password else text

    @contextmanager
    def _locked(self, what: str) -> Iterator[_Connection]:
        local = self._local
        if getattr(local, "conn", None) is not None:  # a store call inside another
            yield local.conn
            return
        try:
            with self._pool.connection(timeout=self._timeout_s) as conn:
                local.conn = _Connection(conn)
                try:
                    yield local.conn
                finally:
                    local.conn = None
        except psycopg.Error as err:
            raise StoreError(f"store {what} failed: {self._scrub(err)}") from None

    def close(self) -> None:
        self._stop_host()
        self._pool.close()

    def _storable(self, text: str) -> str | bytes:
        # BYTEA keeps any Python text, lone surrogates and NULs included.
        return text.encode("utf-8", "surrogatepass")

    def _summary_query(self, query: str) -> object:
        """The phrases of an FTS5 query of quoted phrases joined by ``OR`` (what
        ``terms.fts_query`` writes; the query itself when it quotes none)."""
        return [p.replace('""', '"') for p in _PHRASE.findall(query)] or [query]

    def _measure(self, content: str) -> tuple[int | None, list[list[str]]]:
        """The row's length and keys, as it is indexed: a search finds a row by its keys
        (``keys @>``), so they cannot wait for it; the length comes with them."""
        counts, length = text_terms(pg_text(content), self._stems.many)
        return length, [sorted(counts)]

    def _measure_searched(self, of_user: bool, owner: Sequence[bytes]) -> None:
        """Nothing: every row has its length from the start (``_measure``, ``_measure_old_rows``)."""

    def _measure_old_rows(self) -> None:
        """Give rows indexed before keys were kept (or copied from SQLite, whose FTS5 kept
        none) their length and keys, ``MEASURE_ROWS`` at a time, each batch in a transaction.
        Several openers at once write the same values."""
        applied = self.db.execute(MIGRATED, [self._MEASURED_SINCE]).fetchall()
        while applied:
            rows = self.db.execute(UNMEASURED, [MEASURE_ROWS]).fetchall()
            if not rows:
                return
            with self.db.atomic():
                for row_id, content in rows:
                    length, keys = self._measure(content)
                    self.db.execute(MEASURED, [length, row_id])
                    self.db.execute(KEYED, [*keys, row_id])
            if len(rows) < MEASURE_ROWS:
                return

    def _key_matches(
        self, terms: Sequence[str], session_id: str, user_id: str | None
    ) -> dict[str, object]:
        """Each key of ``terms`` and what finds its rows: the one-key array it overlaps."""
        return {key: [key] for key in query_keys(terms)}
