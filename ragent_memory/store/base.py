"""What every part of the store shares: the clock, timestamps, text as SQLite stores it, and
the lock around the connection. The concern mixins write SQL both backends run (``?`` placeholders, ``ON CONFLICT`` upserts,
``RETURNING``), in SQLite's dialect where they must choose; the PostgreSQL backend overrides the
few that differ (the two searches, how offloads are stored and measured)."""

from __future__ import annotations

import abc
import hashlib
import json
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple, Self

from ragent_memory.errors import StoreError
from ragent_memory.store.schema import tables_created

Clock = Callable[[], datetime]


# A JSON array of ids (or positions) as a set of integers, in each dialect: one statement
# whatever the number of values.
IN_JSON = "IN (SELECT value FROM json_each(?))"
IN_JSON_PG = "IN (SELECT value::bigint FROM jsonb_array_elements_text(%s::jsonb) AS value)"


class Sql(NamedTuple):
    """One statement in each backend's dialect (``?`` for SQLite, ``%s`` for psycopg), named
    by a module constant; each backend's connection runs its own text, as written."""

    sqlite: str
    postgres: str


KEEP_ID = Sql(
    "INSERT INTO ids (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
    "INSERT INTO ids (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
)

NEW_META = Sql(
    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
    "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
)

MIGRATIONS_IN_ORDER = Sql(
    "SELECT name FROM _migrations ORDER BY version",
    "SELECT name FROM _migrations ORDER BY version",
)

MIGRATIONS_TABLE = Sql(
    "CREATE TABLE IF NOT EXISTS _migrations (version INTEGER PRIMARY KEY, name TEXT NOT"
    " NULL, applied_at TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS _migrations (version INTEGER PRIMARY KEY, name TEXT NOT"
    " NULL, applied_at TEXT NOT NULL)",
)

MIGRATION_RECORDED = Sql(
    "INSERT INTO _migrations (version, name, applied_at) VALUES (?, ?, ?)",
    "INSERT INTO _migrations (version, name, applied_at) VALUES (%s, %s, %s)",
)

META_VALUE = Sql(
    "SELECT value FROM meta WHERE key = ?",
    "SELECT value FROM meta WHERE key = %s",
)

MIGRATION_DONE = Sql(
    "SELECT 1 FROM _migrations WHERE name = ?",
    "SELECT 1 FROM _migrations WHERE name = %s",
)

MIGRATIONS_DONE = Sql(
    "SELECT name FROM _migrations",
    "SELECT name FROM _migrations",
)


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def id_key(value: str) -> bytes:
    """The 16 bytes a session or user id is kept under (the first half of its SHA-256): every
    table but ``ids``, which maps a key back to its id, and the ``compactions`` audit."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()[:16]


def key_of(value: str | None) -> bytes | None:
    """``id_key`` of an optional id (None stays None)."""
    return None if value is None else id_key(value)


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


class StoreBase(abc.ABC):
    """The connection, its lock and the clock; each concern's tables are a mixin over this."""

    db: Any  # sqlite_utils.Database, or the PostgreSQL connection of the calling thread
    path: str
    clock: Clock
    _lock: threading.RLock
    _secret: bytes

    @contextmanager
    def _locked(self, what: str) -> Iterator[Any]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as err:
                raise StoreError(f"store {what} failed: {err}") from err

    def _apply_migrations(self, migrations: tuple[tuple[str, str], ...]) -> None:
        """Apply the migrations ``_migrations`` does not record yet, each with its record in
        one transaction. Each is checked again under the write lock: two processes (or hosts)
        opening a new store at once apply it once."""
        with self.db.atomic():
            self.db.execute(MIGRATIONS_TABLE)
            done = {row[0] for row in self.db.execute(MIGRATIONS_DONE).fetchall()}
        for version, (name, sql) in enumerate(migrations, start=1):
            if name in done:
                continue
            with self.db.atomic():
                if self.db.execute(MIGRATION_DONE, [name]).fetchone():
                    continue
                for statement in sql.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(
                    MIGRATION_RECORDED,
                    [version, name, iso(self.clock())],
                )

    def _keep_ids(self, *values: str | None) -> None:
        """Inside a write transaction: keep each id once, under its key, for the reads that
        give it back (a recall hit's session, a pending message's session, a session's user)."""
        rows = [[id_key(value), value] for value in dict.fromkeys(values) if value is not None]
        self.db.executemany(KEEP_ID, rows)

    def _load_secret(self, key: str = "secret") -> bytes:
        """A secret made by the store's first opener: for recall refs, or ``scope_secret``."""
        self.db.execute(
            NEW_META,
            [key, secrets.token_hex(32)],
        )
        ((value,),) = self.db.execute(META_VALUE, [key]).fetchall()
        return bytes.fromhex(value)

    def scope_secret(self) -> bytes:
        """The key of the proxy's scopes when ``serve.secret_env`` names none."""
        with self._locked("secret read"):
            return self._load_secret("scope_secret")

    def migrations(self) -> list[str]:
        """The names of the schema migrations applied, oldest first."""
        rows = self._fetch(MIGRATIONS_IN_ORDER)
        return [str(r[0]) for r in rows]

    @abc.abstractmethod
    def close(self) -> None:
        """Close the backend's connections (each backend owns its own)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_tables(self, migrations: tuple[tuple[str, str], ...], listing: str) -> None:
        """Refuse a store whose migrations are recorded but whose tables (``listing``: SQL
        naming them) are not all there, instead of failing on every later call."""
        present = {row[0] for row in self.db.execute(listing).fetchall()}
        missing = sorted(set(tables_created(migrations)) - present)
        if missing:
            raise StoreError(
                f"cannot open store {self.path!r}: its migrations are recorded but tables "
                f"{', '.join(missing)} are missing (a damaged or foreign database)"
            )

    def _fetch(
        self, sql: Sql, params: Sequence[Any] | Mapping[str, Any] = (), *, what: str = "read"
    ) -> list[Any]:
        with self._locked(what):
            rows: list[Any] = self.db.execute(sql, params).fetchall()
        return rows

    def _read_now(self, sql: Sql, params: Sequence[Any]) -> list[Any]:
        """The rows of a small read a turn makes (who wrote a session last, a memory
        version, the recall mark), as last committed."""
        return self._fetch(sql, params)

    _storable = staticmethod(_storable)  # an offload's text as its ``content`` column keeps it
