"""Offloads (docs/design.md §8): originals behind placeholders and previews, content-addressed
per session behind unguessable recall refs; they expire, and :meth:`gc` deletes them and
everything of a dropped session."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from datetime import timedelta

from ragent_memory.core.records import GCReport
from ragent_memory.store.base import Sql, StoreBase, id_key, iso

# What gc deletes, measured first: the count and UTF-8 size of the offloads (``content`` is
# TEXT or a BLOB on SQLite, BYTEA on PostgreSQL).
_DROPPED = "session_key IN (SELECT session_key FROM dropped_sessions)"
_MEASURE = "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(content AS BLOB))), 0) FROM offloads"
_MEASURE_PG = "SELECT COUNT(*), COALESCE(SUM(OCTET_LENGTH(content)), 0) FROM offloads"
EXPIRED_MEASURED = Sql(
    f"{_MEASURE} WHERE expires_at <= ? AND NOT {_DROPPED}",
    f"{_MEASURE_PG} WHERE expires_at <= %s AND NOT {_DROPPED}",
)
OF_DROPPED_MEASURED = Sql(f"{_MEASURE} WHERE {_DROPPED}", f"{_MEASURE_PG} WHERE {_DROPPED}")
OFFLOADS_COLLECTED = Sql(
    f"DELETE FROM offloads WHERE expires_at <= ? OR {_DROPPED}",
    f"DELETE FROM offloads WHERE expires_at <= %s OR {_DROPPED}",
)
OFFLOAD_KEPT = Sql(
    "INSERT INTO offloads (session_key, ref, sha256, content, chars, created_at,"
    " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, ref) DO UPDATE"
    " SET expires_at = excluded.expires_at",
    "INSERT INTO offloads (session_key, ref, sha256, content, chars, created_at,"
    " expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (session_key, ref) DO"
    " UPDATE SET expires_at = excluded.expires_at",
)

OFFLOAD_READ = Sql(
    "SELECT content FROM offloads WHERE session_key = ? AND ref = ? AND expires_at > ?"
    " AND NOT EXISTS (SELECT 1 FROM dropped_sessions WHERE session_key = ?)",
    "SELECT content FROM offloads WHERE session_key = %s AND ref = %s AND expires_at > %s"
    " AND NOT EXISTS (SELECT 1 FROM dropped_sessions WHERE session_key = %s)",
)

UNDROPPED = Sql(
    "DELETE FROM dropped_sessions WHERE session_key = ?",
    "DELETE FROM dropped_sessions WHERE session_key = %s",
)

SESSION_OFFLOADS_DELETED = Sql(
    "DELETE FROM offloads WHERE session_key = ?",
    "DELETE FROM offloads WHERE session_key = %s",
)

DROPPED_FORGOTTEN = Sql(
    "DELETE FROM dropped_sessions",
    "DELETE FROM dropped_sessions",
)

DROPPED_COUNT = Sql(
    "SELECT COUNT(*) FROM dropped_sessions",
    "SELECT COUNT(*) FROM dropped_sessions",
)


def _sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


class OffloadTables(StoreBase):
    def ref_for(self, session_id: str, content: str) -> str:
        """The recall ref of ``content`` in ``session_id``: stable per store, unguessable."""
        return self._ref(session_id, _sha256(content))

    def _ref(self, session_id: str, sha: str) -> str:
        mac = hmac.digest(self._secret, f"{session_id}\0{sha}".encode(), "sha256")
        return "rm-" + mac.hex()[:20]

    def _offload(self, session_id: str, contents: Sequence[str], ttl_days: float) -> None:
        """Store ``contents`` behind their refs in one statement. Stored once per session
        (content-addressed); storing again only extends the expiry."""
        if not contents:
            return
        now = self.clock()
        created, expires = iso(now), iso(now + timedelta(days=ttl_days))
        rows = []
        key = id_key(session_id)
        for content in contents:
            sha = _sha256(content)  # hashed once: the ref is a MAC of it
            ref = self._ref(session_id, sha)
            rows.append([key, ref, sha, self._storable(content), len(content), created, expires])
        self.db.executemany(
            OFFLOAD_KEPT,
            rows,
        )

    def read_offload(self, session_id: str, ref: str) -> str | None:
        """The original text behind ``ref`` in this session, or None (unknown, other session,
        expired, or the session was dropped)."""
        key = id_key(session_id)
        rows = self._fetch(
            OFFLOAD_READ,
            [key, ref, iso(self.clock()), key],
        )
        if not rows:
            return None
        content = rows[0][0]
        return content.decode("utf-8", "surrogatepass") if isinstance(content, bytes) else content

    def revive(self, session_id: str) -> None:
        """Start a new life for a session id that was dropped (no-op otherwise)."""
        with self._locked("write"), self.db.atomic():
            self._revive(session_id)

    def _revive(self, session_id: str) -> None:
        # A dropped session id used again starts a new life: what is left of the old one goes
        # now, so neither its refs nor the next gc touch the new life's offloads.
        key = id_key(session_id)
        cursor = self.db.execute(UNDROPPED, [key])
        if cursor.rowcount:
            self.db.execute(SESSION_OFFLOADS_DELETED, [key])

    def gc(self, *, vacuum: bool = False) -> GCReport:
        """Delete expired offloads and the offloads of dropped sessions, in one transaction,
        then hand the freed pages back to the disk (:meth:`_shrink`)."""
        before = self.file_bytes()
        now = iso(self.clock())
        with self._locked("gc"), self.db.atomic():
            expired, expired_bytes = self.db.execute(EXPIRED_MEASURED, [now]).fetchone()
            of_dropped, dropped_bytes = self.db.execute(OF_DROPPED_MEASURED).fetchone()
            (sessions,) = self.db.execute(DROPPED_COUNT).fetchone()
            self.db.execute(OFFLOADS_COLLECTED, [now])
            self.db.execute(DROPPED_FORGOTTEN)
        self._shrink(vacuum=vacuum)
        return GCReport(
            expired_offloads=int(expired),
            dropped_sessions=int(sessions),
            dropped_offloads=int(of_dropped),
            freed_bytes=int(expired_bytes) + int(dropped_bytes),
            file_bytes_before=before,
            file_bytes_after=self.file_bytes(),
        )

    def file_bytes(self) -> int:
        """The size of the store on disk (0 when it has no file)."""
        return 0

    def _shrink(self, *, vacuum: bool) -> None:
        """Give freed space back to the file system (a backend without a file has none)."""
