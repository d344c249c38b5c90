"""The SQLite store (DESIGN §10): one file, WAL, migrations recorded in the database.

Tables:

- ``compactions``: the append-only audit, one row per compaction attempt (and invalidation).
- ``sessions``: per-session summary state (generation, summary, covered pointer, verbatim list).
- ``substitutions``: sticky per-message replacements (trim placeholders, truncation previews),
  keyed by a digest of the original message, so a prompt prefix stays byte-stable across turns.
- ``offloads``: originals of trimmed/truncated tool results, content-addressed per session;
  they expire after ``offload_ttl_days`` and :meth:`Store.gc` deletes them.
- ``dropped_sessions``: sessions the app dropped; their refs stop resolving at once and the next
  :meth:`Store.gc` deletes their offloads.
- ``meta``: the store's secret (recall refs are HMACs under it, so they are unguessable) and
  ``memory_seq``, the counter long-term memory versions are drawn from.
- ``memories``: long-term memory, per user: facts and copies of applied compaction summaries,
  each ``active``, ``superseded`` (``superseded_by`` links the replacement), ``retracted`` or
  ``evicted``; only ``forget`` deletes rows. ``memory_fts`` indexes the excerpts of active
  summaries (FTS5, rowid = memory id × 1024 + excerpt number).
- ``memory_pending``: user messages waiting for fact extraction, with their failed attempts.
- ``memory_cursors`` / ``memory_seen``: how far each session's history was read, and digests
  (no text) of the user messages already recorded, so ``after_turn`` is idempotent.
- ``memory_versions``: per user, bumped on every memory change (cached blocks compare it).

One connection shared by every thread, guarded by a lock (sqlite3 objects are not thread-safe).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import sqlite_utils

from .errors import StoreError
from .longterm import Fact, Plan

Clock = Callable[[], datetime]

COMPACTION_COLUMNS = (
    "id",
    "session_id",
    "user_id",
    "generation",
    "status",
    "reason",
    "model",
    "attempts",
    "material_messages",
    "material_chars",
    "summary_chars",
    "chars_before",
    "chars_after",
    "duration_ms",
    "summary",
    "error",
    "created_at",
)

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "001_core",
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE compactions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            user_id TEXT,
            generation INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('applied', 'failed', 'invalidated')),
            reason TEXT,
            model TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            material_messages INTEGER NOT NULL DEFAULT 0,
            material_chars INTEGER NOT NULL DEFAULT 0,
            summary_chars INTEGER NOT NULL DEFAULT 0,
            chars_before INTEGER NOT NULL DEFAULT 0,
            chars_after INTEGER NOT NULL DEFAULT 0,
            duration_ms INTEGER NOT NULL DEFAULT 0,
            summary TEXT,
            error TEXT,
            created_at TEXT NOT NULL
        );
        CREATE UNIQUE INDEX compactions_applied_generation
            ON compactions (session_id, generation) WHERE status = 'applied';
        CREATE INDEX compactions_session ON compactions (session_id, id);
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            user_id TEXT,
            generation INTEGER NOT NULL DEFAULT 0,
            last_generation INTEGER NOT NULL DEFAULT 0,
            summary TEXT NOT NULL DEFAULT '',
            body TEXT NOT NULL DEFAULT '',
            prefix_len INTEGER NOT NULL DEFAULT 0,
            covered INTEGER NOT NULL DEFAULT 0,
            covered_digest TEXT NOT NULL DEFAULT '',
            verbatim TEXT NOT NULL DEFAULT '[]',
            updated_at TEXT NOT NULL
        );
        CREATE TABLE substitutions (
            session_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('trim', 'truncate')),
            ref TEXT NOT NULL,
            message TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, digest)
        );
        CREATE TABLE offloads (
            session_id TEXT NOT NULL,
            ref TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            content TEXT NOT NULL,
            chars INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            PRIMARY KEY (session_id, ref)
        );
        CREATE INDEX offloads_expiry ON offloads (expires_at);
        """,
    ),
    (
        "002_dropped_sessions",
        """
        CREATE TABLE dropped_sessions (session_id TEXT PRIMARY KEY, dropped_at TEXT NOT NULL);
        DELETE FROM meta WHERE key LIKE 'dropped:%';
        """,
    ),
    (
        "003_long_term_memory",
        """
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('fact', 'summary')),
            content TEXT NOT NULL,
            status TEXT NOT NULL
                CHECK (status IN ('active', 'superseded', 'retracted', 'evicted')),
            session_id TEXT,
            generation INTEGER,
            superseded_by INTEGER REFERENCES memories (id),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX memories_user ON memories (user_id, kind, status, id);
        CREATE VIRTUAL TABLE memory_fts USING fts5 (
            terms, excerpt UNINDEXED, user_id UNINDEXED, session_id UNINDEXED,
            tokenize = 'unicode61 remove_diacritics 2'
        );
        CREATE TABLE memory_pending (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            raw_index INTEGER NOT NULL,
            digest TEXT NOT NULL,
            content TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        );
        CREATE INDEX memory_pending_user ON memory_pending (user_id, id);
        CREATE TABLE memory_cursors (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            seen INTEGER NOT NULL,
            last_digest TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (user_id, session_id)
        );
        CREATE TABLE memory_seen (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            PRIMARY KEY (user_id, session_id, digest)
        ) WITHOUT ROWID;
        CREATE TABLE memory_versions (user_id TEXT PRIMARY KEY, version INTEGER NOT NULL);
        INSERT OR IGNORE INTO meta (key, value) VALUES ('memory_seq', '0');
        """,
    ),
)

# FTS rows of a summary memory are numbered memory id × this + excerpt number, so they can be
# deleted by rowid range (FTS5 filters on UNINDEXED columns by scanning).
FTS_ROWS_PER_MEMORY = 1024


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.frozen
class SessionState:
    """What a session's compactions left behind; resumed by any engine on the same store."""

    session_id: str
    user_id: str | None = None
    generation: int = 0  # the current summary's generation; 0 = no summary
    last_generation: int = 0  # the highest generation ever applied (numbers never repeat)
    summary: str = ""  # as shown to the model: body plus the verbatim user requests
    body: str = ""  # as written by the summarizer; the next generation rewrites it
    prefix_len: int = 0
    covered: int = 0
    covered_digest: str = ""
    verbatim: tuple[dict[str, Any], ...] = ()


def substitution_key(position: int, digest: str) -> str:
    return f"{position}:{digest}"


@attrs.frozen
class Substitution:
    """A sticky replacement of one original message in the view.

    ``key`` is the message's position after the leading system messages plus its content
    digest (see :func:`substitution_key`): the same content at another position, such as a
    repeated search answered under a reused call id in the current turn, is not substituted.
    """

    key: str
    kind: str  # "trim" | "truncate"
    ref: str
    message: dict[str, Any]


@attrs.frozen
class PendingMessage:
    """A user message waiting for fact extraction."""

    id: int
    session_id: str
    raw_index: int
    content: str
    attempts: int


@attrs.frozen
class Forgotten:
    """What one :meth:`Store.forget` erased."""

    memories: int = 0
    pending: int = 0


@attrs.frozen
class GCReport:
    """What one :meth:`Store.gc` deleted."""

    expired_offloads: int = 0
    dropped_sessions: int = 0
    dropped_offloads: int = 0  # offloads of those sessions (expired or not)
    freed_bytes: int = 0  # UTF-8 bytes of the deleted originals


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


class Store:
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

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _locked(self, what: str) -> Iterator[sqlite_utils.Database]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as err:
                raise StoreError(f"store {what} failed: {err}") from err

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

    # ------------------------------------------------------------------ offloads

    def ref_for(self, session_id: str, content: str) -> str:
        """The recall ref of ``content`` in ``session_id``: stable per store, unguessable."""
        sha = hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()
        mac = hmac.new(self._secret, f"{session_id}\0{sha}".encode(), hashlib.sha256)
        return "rm-" + mac.hexdigest()[:20]

    def _offload_row(self, session_id: str, content: str, ttl_days: float) -> dict[str, Any]:
        now = self.clock()
        return {
            "session_id": session_id,
            "ref": self.ref_for(session_id, content),
            "sha256": hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest(),
            "content": _storable(content),
            "chars": len(content),
            "created_at": iso(now),
            "expires_at": iso(now + timedelta(days=ttl_days)),
        }

    def _offload(self, session_id: str, content: str, ttl_days: float) -> None:
        # Stored once per session (content-addressed); storing again only extends the expiry.
        self.db.execute(
            "INSERT INTO offloads (session_id, ref, sha256, content, chars, created_at,"
            " expires_at) VALUES (:session_id, :ref, :sha256, :content, :chars, :created_at,"
            " :expires_at) ON CONFLICT (session_id, ref) DO UPDATE SET"
            " expires_at = excluded.expires_at",
            self._offload_row(session_id, content, ttl_days),
        )

    def read_offload(self, session_id: str, ref: str) -> str | None:
        """The original text behind ``ref`` in this session, or None (unknown, other session,
        expired, or the session was dropped)."""
        with self._locked("read"):
            row = self.db.execute(
                "SELECT content FROM offloads WHERE session_id = ? AND ref = ? AND expires_at > ?"
                " AND NOT EXISTS (SELECT 1 FROM dropped_sessions WHERE session_id = ?)",
                [session_id, ref, iso(self.clock()), session_id],
            ).fetchone()
        if row is None:
            return None
        content = row[0]
        return content.decode("utf-8", "surrogatepass") if isinstance(content, bytes) else content

    def revive(self, session_id: str) -> None:
        """Start a new life for a session id that was dropped (no-op otherwise)."""
        with self._locked("write"), self.db.atomic():
            self._revive(session_id)

    def _revive(self, session_id: str) -> None:
        # A dropped session id used again starts a new life: what is left of the old one goes
        # now, so neither its refs nor the next gc touch the new life's offloads.
        dropped = self.db.execute(
            "SELECT 1 FROM dropped_sessions WHERE session_id = ?", [session_id]
        ).fetchone()
        if dropped is not None:
            self.db.execute("DELETE FROM offloads WHERE session_id = ?", [session_id])
            self.db.execute("DELETE FROM dropped_sessions WHERE session_id = ?", [session_id])

    # ------------------------------------------------------------------ substitutions

    def substitutions(self, session_id: str) -> dict[str, Substitution]:
        with self._locked("read"):
            rows = self.db.execute(
                "SELECT digest, kind, ref, message FROM substitutions WHERE session_id = ?",
                [session_id],
            ).fetchall()
        return {r[0]: Substitution(r[0], r[1], r[2], json.loads(r[3])) for r in rows}

    def save_substitutions(
        self,
        session_id: str,
        items: Sequence[tuple[Substitution, Sequence[str]]],
        *,
        ttl_days: float,
    ) -> None:
        """Record sticky replacements and offload their originals, in one transaction."""
        if not items:
            return
        now = iso(self.clock())
        with self._locked("write"), self.db.atomic():
            self._revive(session_id)
            for sub, originals in items:
                for original in originals:
                    self._offload(session_id, original, ttl_days)
                self.db.execute(
                    "INSERT OR REPLACE INTO substitutions (session_id, digest, kind, ref, message,"
                    " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        session_id,
                        sub.key,
                        sub.kind,
                        sub.ref,
                        _json_text(sub.message),
                        now,
                    ],
                )

    # ------------------------------------------------------------------ sessions

    def load_session(self, session_id: str) -> SessionState | None:
        with self._locked("read"):
            row = self.db.execute(
                "SELECT user_id, generation, last_generation, summary, body, prefix_len, covered,"
                " covered_digest, verbatim FROM sessions WHERE session_id = ?",
                [session_id],
            ).fetchone()
        if row is None:
            return None
        return SessionState(
            session_id=session_id,
            user_id=row[0],
            generation=row[1],
            last_generation=row[2],
            summary=row[3],
            body=row[4],
            prefix_len=row[5],
            covered=row[6],
            covered_digest=row[7],
            verbatim=tuple(json.loads(row[8])),
        )

    def save_session(self, state: SessionState) -> None:
        """Write a session's whole summary state in one transaction."""
        with self._locked("write"), self.db.atomic():
            self._write_session(state)

    def commit_generation(self, state: SessionState, previous: SessionState) -> bool:
        """Write ``state`` only if the stored session is still ``previous`` (same generation
        numbers) and was not dropped meanwhile; False when a late compaction lost the race to
        an invalidation, another compaction or a drop."""
        with self._locked("write"), self.db.atomic():
            dropped = self.db.execute(
                "SELECT 1 FROM dropped_sessions WHERE session_id = ?", [state.session_id]
            ).fetchone()
            row = self.db.execute(
                "SELECT generation, last_generation FROM sessions WHERE session_id = ?",
                [state.session_id],
            ).fetchone()
            current = tuple(row) if row is not None else (0, 0)
            if dropped is not None or current != (previous.generation, previous.last_generation):
                return False
            self._write_session(state)
            return True

    def _write_session(self, state: SessionState) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO sessions (session_id, user_id, generation,"
            " last_generation, summary, body, prefix_len, covered, covered_digest, verbatim,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                state.session_id,
                state.user_id,
                state.generation,
                state.last_generation,
                state.summary,
                state.body,
                state.prefix_len,
                state.covered,
                state.covered_digest,
                json.dumps(list(state.verbatim), ensure_ascii=False),
                iso(self.clock()),
            ],
        )

    # ------------------------------------------------------------------ audit

    def audit(self, row: dict[str, Any]) -> int:
        """Append one row to ``compactions``; returns its id."""
        unknown = set(row) - set(COMPACTION_COLUMNS)
        if unknown:
            raise StoreError(f"unknown compactions columns: {sorted(unknown)}")
        record = {**row, "created_at": row.get("created_at") or iso(self.clock())}
        with self._locked("audit write"):
            cursor = self.db.execute(
                f"INSERT INTO compactions ({', '.join(record)})"
                f" VALUES ({', '.join('?' * len(record))})",
                list(record.values()),
            )
            return int(cursor.lastrowid or 0)

    def compactions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(COMPACTION_COLUMNS)} FROM compactions"
        params: list[Any] = []
        if session_id is not None:
            sql += " WHERE session_id = ?"
            params.append(session_id)
        with self._locked("read"):
            rows = self.db.execute(sql + " ORDER BY id", params).fetchall()
        return [dict(zip(COMPACTION_COLUMNS, r, strict=True)) for r in rows]

    # ------------------------------------------------------------------ long-term memory

    def _bump_memory_version(self, user_id: str) -> None:
        # Versions come from one store-wide counter, never reused: a user forgotten and
        # remembered again can never match a block cached before the forget.
        self.db.execute(
            "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'memory_seq'"
        )
        self.db.execute(
            "INSERT INTO memory_versions (user_id, version) SELECT ?, CAST(value AS INTEGER)"
            " FROM meta WHERE key = 'memory_seq' ON CONFLICT (user_id) DO UPDATE SET"
            " version = excluded.version",
            [user_id],
        )

    def memory_version(self, user_id: str) -> int:
        """Changes with every change to the user's memories (0: none stored)."""
        with self._locked("read"):
            row = self.db.execute(
                "SELECT version FROM memory_versions WHERE user_id = ?", [user_id]
            ).fetchone()
        return int(row[0]) if row else 0

    def memory_cursor(self, user_id: str, session_id: str) -> tuple[int, str] | None:
        """How many messages of the session's history were read, and the last one's digest."""
        with self._locked("read"):
            row = self.db.execute(
                "SELECT seen, last_digest FROM memory_cursors WHERE user_id = ? AND session_id = ?",
                [user_id, session_id],
            ).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def record_user_messages(
        self,
        user_id: str,
        session_id: str,
        items: Sequence[tuple[int, str, str]],
        *,
        seen: int,
        last_digest: str,
    ) -> int:
        """Record ``(raw index, digest, text)`` user messages as pending, unless the session
        recorded that digest before, and move the cursor; returns the user's pending count."""
        now = iso(self.clock())
        with self._locked("write"), self.db.atomic():
            for raw_index, digest, content in items:
                cursor = self.db.execute(
                    "INSERT OR IGNORE INTO memory_seen (user_id, session_id, digest)"
                    " VALUES (?, ?, ?)",
                    [user_id, session_id, digest],
                )
                if cursor.rowcount == 1:
                    self.db.execute(
                        "INSERT INTO memory_pending (user_id, session_id, raw_index, digest,"
                        " content, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                        [user_id, session_id, raw_index, digest, content, now],
                    )
            self.db.execute(
                "INSERT INTO memory_cursors (user_id, session_id, seen, last_digest, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, session_id) DO UPDATE SET"
                " seen = excluded.seen, last_digest = excluded.last_digest,"
                " updated_at = excluded.updated_at",
                [user_id, session_id, seen, last_digest, now],
            )
            (count,) = self.db.execute(
                "SELECT COUNT(*) FROM memory_pending WHERE user_id = ?", [user_id]
            ).fetchone()
        return int(count)

    def pending_messages(self, user_id: str, *, limit: int) -> list[PendingMessage]:
        """The user's oldest pending messages, oldest first."""
        with self._locked("read"):
            rows = self.db.execute(
                "SELECT id, session_id, raw_index, content, attempts FROM memory_pending"
                " WHERE user_id = ? ORDER BY id LIMIT ?",
                [user_id, limit],
            ).fetchall()
        return [PendingMessage(*row) for row in rows]

    def fail_pending(self, user_id: str, ids: Sequence[int], *, max_attempts: int) -> int:
        """Count one more failed attempt for these pending messages; delete those that reached
        ``max_attempts`` and return how many were."""
        marks = ", ".join("?" * len(ids))
        with self._locked("write"), self.db.atomic():
            self.db.execute(
                f"UPDATE memory_pending SET attempts = attempts + 1"
                f" WHERE user_id = ? AND id IN ({marks})",
                [user_id, *ids],
            )
            cursor = self.db.execute(
                f"DELETE FROM memory_pending WHERE user_id = ? AND id IN ({marks})"
                f" AND attempts >= ?",
                [user_id, *ids, max_attempts],
            )
        return int(cursor.rowcount)

    def facts(self, user_id: str) -> list[Fact]:
        """The user's active facts, oldest first."""
        with self._locked("read"):
            rows = self.db.execute(
                "SELECT id, content, created_at FROM memories WHERE user_id = ? AND kind = 'fact'"
                " AND status = 'active' ORDER BY id",
                [user_id],
            ).fetchall()
        return [Fact(int(r[0]), r[1], r[2]) for r in rows]

    def memory_rows(self, user_id: str, *, kind: str | None = None) -> list[dict[str, Any]]:
        """Every memory row of the user, whatever its status, oldest first."""
        sql = (
            "SELECT id, kind, content, status, session_id, generation, superseded_by,"
            " created_at, updated_at FROM memories WHERE user_id = ?"
        )
        params: list[Any] = [user_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        with self._locked("read"):
            cursor = self.db.execute(sql + " ORDER BY id", params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _end_memory(
        self, user_id: str, memory_id: int, status: str, now: str, by: int | None
    ) -> None:
        cursor = self.db.execute(
            "UPDATE memories SET status = ?, superseded_by = ?, updated_at = ?"
            " WHERE id = ? AND user_id = ? AND kind = 'fact' AND status = 'active'",
            [status, by, now, memory_id, user_id],
        )
        if cursor.rowcount != 1:
            raise StoreError(f"fact {memory_id} is no longer active; the batch is stale")

    def commit_memories(
        self, user_id: str, pending_ids: Sequence[int], plan: Plan, *, session_id: str
    ) -> None:
        """Write one extraction batch in one transaction: the new facts, the status of the
        facts it ends, and the removal of its pending messages.

        Raises ``StoreError`` (and writes nothing) when the batch went stale meanwhile: its
        pending messages are gone (forgotten, or taken by another engine) or a fact it ends
        is no longer active.
        """
        now = iso(self.clock())
        marks = ", ".join("?" * len(pending_ids))
        with self._locked("memory write"), self.db.atomic():
            cursor = self.db.execute(
                f"DELETE FROM memory_pending WHERE user_id = ? AND id IN ({marks})",
                [user_id, *pending_ids],
            )
            if cursor.rowcount != len(pending_ids):
                raise StoreError("the batch's pending messages changed meanwhile; it is stale")
            for draft in plan.new:
                cursor = self.db.execute(
                    "INSERT INTO memories (user_id, kind, content, status, session_id,"
                    " created_at, updated_at) VALUES (?, 'fact', ?, 'active', ?, ?, ?)",
                    [user_id, draft.content, session_id, now, now],
                )
                for replaced in sorted(draft.replaces):
                    self._end_memory(user_id, replaced, "superseded", now, cursor.lastrowid)
            for memory_id in sorted(plan.retracted):
                self._end_memory(user_id, memory_id, "retracted", now, None)
            for memory_id in sorted(plan.evicted):
                self._end_memory(user_id, memory_id, "evicted", now, None)
            if plan.is_change:
                self._bump_memory_version(user_id)

    def record_summary(
        self,
        user_id: str,
        session_id: str,
        generation: int,
        summary: str,
        excerpts: Sequence[tuple[str, str]],
    ) -> int:
        """Keep an applied compaction summary as a ``summary`` memory of the user, searchable
        by its ``(terms, excerpt)`` pairs; it supersedes the session's previous one."""
        now = iso(self.clock())
        with self._locked("memory write"), self.db.atomic():
            previous = [
                int(r[0])
                for r in self.db.execute(
                    "SELECT id FROM memories WHERE user_id = ? AND session_id = ?"
                    " AND kind = 'summary' AND status = 'active'",
                    [user_id, session_id],
                ).fetchall()
            ]
            cursor = self.db.execute(
                "INSERT INTO memories (user_id, kind, content, status, session_id, generation,"
                " created_at, updated_at) VALUES (?, 'summary', ?, 'active', ?, ?, ?, ?)",
                [user_id, summary, session_id, generation, now, now],
            )
            memory_id = int(cursor.lastrowid or 0)
            for old in previous:
                self.db.execute(
                    "UPDATE memories SET status = 'superseded', superseded_by = ?, updated_at = ?"
                    " WHERE id = ?",
                    [memory_id, now, old],
                )
                self.db.execute(
                    "DELETE FROM memory_fts WHERE rowid >= ? AND rowid < ?",
                    [old * FTS_ROWS_PER_MEMORY, (old + 1) * FTS_ROWS_PER_MEMORY],
                )
            for number, (terms, excerpt) in enumerate(excerpts[:FTS_ROWS_PER_MEMORY]):
                self.db.execute(
                    "INSERT INTO memory_fts (rowid, terms, excerpt, user_id, session_id)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [memory_id * FTS_ROWS_PER_MEMORY + number, terms, excerpt, user_id, session_id],
                )
            self._bump_memory_version(user_id)
        return memory_id

    def search_summaries(
        self, user_id: str, query: str, *, exclude_session: str, limit: int
    ) -> list[str]:
        """The user's summary excerpts from other sessions that best match the FTS5
        ``query``, best first (BM25)."""
        with self._locked("search"):
            rows = self.db.execute(
                "SELECT excerpt FROM memory_fts WHERE memory_fts MATCH ? AND user_id = ?"
                " AND session_id != ? ORDER BY rank, rowid LIMIT ?",
                [query, user_id, exclude_session, limit],
            ).fetchall()
        return [str(r[0]) for r in rows]

    def forget(self, user_id: str) -> Forgotten:
        """Erase the user's memories (facts and summaries, whatever their status), their
        search index and pending messages, in one transaction.

        The per-session cursors and message digests stay (they hold no text): the app still
        holds those histories, and what was said before the forget must not be learnt again.
        """
        with self._locked("forget"), self.db.atomic():
            memories = self.db.execute("DELETE FROM memories WHERE user_id = ?", [user_id])
            self.db.execute("DELETE FROM memory_fts WHERE user_id = ?", [user_id])
            pending = self.db.execute("DELETE FROM memory_pending WHERE user_id = ?", [user_id])
            self.db.execute("DELETE FROM memory_versions WHERE user_id = ?", [user_id])
        return Forgotten(memories=int(memories.rowcount), pending=int(pending.rowcount))

    # ------------------------------------------------------------------ lifecycle

    def drop_session(self, session_id: str) -> None:
        """Drop a session: its summary state and substitutions go now (so the id, used again,
        starts fresh), its refs stop resolving at once, and :meth:`gc` deletes its offloads.
        Audit rows stay."""
        with self._locked("write"), self.db.atomic():
            for table in ("substitutions", "sessions"):
                self.db.execute(f"DELETE FROM {table} WHERE session_id = ?", [session_id])
            self.db.execute(
                "INSERT OR REPLACE INTO dropped_sessions (session_id, dropped_at) VALUES (?, ?)",
                [session_id, iso(self.clock())],
            )

    def gc(self) -> GCReport:
        """Delete expired offloads and the offloads of dropped sessions, in one transaction."""
        now = iso(self.clock())
        dropped = "session_id IN (SELECT session_id FROM dropped_sessions)"
        measure = "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(content AS BLOB))), 0) FROM offloads"
        with self._locked("gc"), self.db.atomic():
            expired, expired_bytes = self.db.execute(
                f"{measure} WHERE expires_at <= ? AND NOT {dropped}", [now]
            ).fetchone()
            of_dropped, dropped_bytes = self.db.execute(f"{measure} WHERE {dropped}").fetchone()
            (sessions,) = self.db.execute("SELECT COUNT(*) FROM dropped_sessions").fetchone()
            self.db.execute(f"DELETE FROM offloads WHERE expires_at <= ? OR {dropped}", [now])
            self.db.execute("DELETE FROM dropped_sessions")
        return GCReport(
            expired_offloads=int(expired),
            dropped_sessions=int(sessions),
            dropped_offloads=int(of_dropped),
            freed_bytes=int(expired_bytes) + int(dropped_bytes),
        )
