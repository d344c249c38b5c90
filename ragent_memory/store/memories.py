"""Long-term memory (docs/design.md §9): facts and summaries per user, their search index, pending
user messages and the cursors that keep ``after_turn`` idempotent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ragent_memory.core.names import MemoryKind, MemoryStatus
from ragent_memory.core.records import Fact, Forgotten, PendingMessage, Plan
from ragent_memory.errors import StoreError
from ragent_memory.store.base import IN_JSON, IN_JSON_PG, Sql, StoreBase, id_key, iso, key_of
from ragent_memory.store.schema import FTS_ROWS_PER_MEMORY

# The user's summary excerpts from other sessions best matching a query of quoted phrases
# joined by OR (``terms.fts_query``): FTS5's rank; PostgreSQL's ``ts_rank`` of any phrase.
SUMMARIES_FOUND = Sql(
    "SELECT excerpt FROM memory_fts WHERE memory_fts MATCH ? AND user_key = ?"
    " AND session_key != ? ORDER BY rank, rowid LIMIT ?",
    "SELECT f.excerpt FROM memory_fts AS f, (SELECT string_agg(p.query::text, ' | ')::tsquery"
    " AS query FROM unnest(%s::text[]) AS phrase, phraseto_tsquery('simple', phrase) AS p"
    " (query) WHERE numnode(p.query) > 0) AS q WHERE f.tsv @@ q.query AND f.user_key = %s"
    " AND f.session_key != %s ORDER BY ts_rank(f.tsv, q.query) DESC, f.rowid LIMIT %s",
)
PENDING_FAILED = Sql(
    f"UPDATE memory_pending SET attempts = attempts + 1 WHERE user_key = ? AND id {IN_JSON}",
    f"UPDATE memory_pending SET attempts = attempts + 1 WHERE user_key = %s AND id {IN_JSON_PG}",
)
PENDING_GIVEN_UP = Sql(
    f"DELETE FROM memory_pending WHERE user_key = ? AND id {IN_JSON} AND attempts >= ?",
    f"DELETE FROM memory_pending WHERE user_key = %s AND id {IN_JSON_PG} AND attempts >= %s",
)
PENDING_DONE = Sql(
    f"DELETE FROM memory_pending WHERE user_key = ? AND id {IN_JSON}",
    f"DELETE FROM memory_pending WHERE user_key = %s AND id {IN_JSON_PG}",
)
MEMORIES_DELETED = Sql(
    f"DELETE FROM memories WHERE id {IN_JSON}", f"DELETE FROM memories WHERE id {IN_JSON_PG}"
)
_MEMORY_ROWS = (
    "SELECT m.id, m.kind, m.content, m.status, s.value AS session_id, m.generation,"
    " m.superseded_by, m.created_at, m.updated_at FROM memories AS m"
    " LEFT JOIN ids AS s ON s.key = m.session_key WHERE m.user_key = "
)
MEMORY_ROWS = Sql(f"{_MEMORY_ROWS}? ORDER BY m.id", f"{_MEMORY_ROWS}%s ORDER BY m.id")
MEMORY_ROWS_OF_KIND = Sql(
    f"{_MEMORY_ROWS}? AND m.kind = ? ORDER BY m.id",
    f"{_MEMORY_ROWS}%s AND m.kind = %s ORDER BY m.id",
)
MEMORY_SEQ_NEXT = Sql(
    "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'memory_seq'",
    "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'memory_seq'",
)

MEMORY_VERSION_SET = Sql(
    "INSERT INTO memory_versions (user_key, version) SELECT ?, CAST(value AS INTEGER)"
    " FROM meta WHERE key = 'memory_seq' ON CONFLICT (user_key) DO UPDATE SET version ="
    " excluded.version",
    "INSERT INTO memory_versions (user_key, version) SELECT %s, CAST(value AS INTEGER)"
    " FROM meta WHERE key = 'memory_seq' ON CONFLICT (user_key) DO UPDATE SET version ="
    " excluded.version",
)

MEMORY_VERSION = Sql(
    "SELECT version FROM memory_versions WHERE user_key = ?",
    "SELECT version FROM memory_versions WHERE user_key = %s",
)

MEMORY_CURSOR = Sql(
    "SELECT seen, last_digest FROM memory_cursors WHERE user_key = ? AND session_key = ?",
    "SELECT seen, last_digest FROM memory_cursors WHERE user_key = %s AND session_key = %s",
)

PENDING_OF_USER = Sql(
    "SELECT p.id, s.value, p.raw_index, p.content, p.attempts FROM memory_pending AS p"
    " JOIN ids AS s ON s.key = p.session_key WHERE p.user_key = ? ORDER BY p.id LIMIT ?",
    "SELECT p.id, s.value, p.raw_index, p.content, p.attempts FROM memory_pending AS p"
    " JOIN ids AS s ON s.key = p.session_key WHERE p.user_key = %s ORDER BY p.id LIMIT %s",
)

ACTIVE_FACTS = Sql(
    "SELECT id, content, created_at FROM memories WHERE user_key = ? AND kind = 'fact'"
    " AND status = 'active' ORDER BY id",
    "SELECT id, content, created_at FROM memories WHERE user_key = %s AND kind = 'fact'"
    " AND status = 'active' ORDER BY id",
)

FACT_RETIRED = Sql(
    "UPDATE memories SET status = ?, superseded_by = ?, updated_at = ? WHERE id = ? AND"
    " user_key = ? AND kind = 'fact' AND status = 'active'",
    "UPDATE memories SET status = %s, superseded_by = %s, updated_at = %s WHERE id = %s"
    " AND user_key = %s AND kind = 'fact' AND status = 'active'",
)

CURSOR_MOVED = Sql(
    "INSERT INTO memory_cursors (user_key, session_key, seen, last_digest, updated_at)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_key, session_key) DO UPDATE SET seen ="
    " excluded.seen, last_digest = excluded.last_digest, updated_at = excluded.updated_at",
    "INSERT INTO memory_cursors (user_key, session_key, seen, last_digest, updated_at)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (user_key, session_key) DO UPDATE SET seen"
    " = excluded.seen, last_digest = excluded.last_digest, updated_at ="
    " excluded.updated_at",
)

SUMMARY_ADDED = Sql(
    "INSERT INTO memories (user_key, kind, content, status, session_key, generation,"
    " created_at, updated_at) VALUES (?, 'summary', ?, 'active', ?, ?, ?, ?) RETURNING id",
    "INSERT INTO memories (user_key, kind, content, status, session_key, generation,"
    " created_at, updated_at) VALUES (%s, 'summary', %s, 'active', %s, %s, %s, %s)"
    " RETURNING id",
)

USER_MEMORIES_DELETED = Sql(
    "DELETE FROM memories WHERE user_key = ?",
    "DELETE FROM memories WHERE user_key = %s",
)

USER_TERMS_DELETED = Sql(
    "DELETE FROM memory_fts WHERE user_key = ?",
    "DELETE FROM memory_fts WHERE user_key = %s",
)

USER_PENDING_DELETED = Sql(
    "DELETE FROM memory_pending WHERE user_key = ?",
    "DELETE FROM memory_pending WHERE user_key = %s",
)

USER_VERSION_DELETED = Sql(
    "DELETE FROM memory_versions WHERE user_key = ?",
    "DELETE FROM memory_versions WHERE user_key = %s",
)

MESSAGE_SEEN = Sql(
    "INSERT INTO memory_seen (user_key, session_key, digest) VALUES (?, ?, ?) ON CONFLICT"
    " DO NOTHING",
    "INSERT INTO memory_seen (user_key, session_key, digest) VALUES (%s, %s, %s) ON"
    " CONFLICT DO NOTHING",
)

FACT_ADDED = Sql(
    "INSERT INTO memories (user_key, kind, content, status, session_key, created_at,"
    " updated_at) VALUES (?, 'fact', ?, 'active', ?, ?, ?) RETURNING id",
    "INSERT INTO memories (user_key, kind, content, status, session_key, created_at,"
    " updated_at) VALUES (%s, 'fact', %s, 'active', %s, %s, %s) RETURNING id",
)

SUMMARY_TERMS_DELETED = Sql(
    "DELETE FROM memory_fts WHERE rowid >= ? AND rowid < ?",
    "DELETE FROM memory_fts WHERE rowid >= %s AND rowid < %s",
)

SUMMARY_TERMS_ADDED = Sql(
    "INSERT INTO memory_fts (rowid, terms, excerpt, user_key, session_key) VALUES (?, ?, ?, ?, ?)",
    "INSERT INTO memory_fts (rowid, terms, excerpt, user_key, session_key) VALUES (%s,"
    " %s, %s, %s, %s)",
)

PENDING_ADDED = Sql(
    "INSERT INTO memory_pending (user_key, session_key, raw_index, digest, content,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?)",
    "INSERT INTO memory_pending (user_key, session_key, raw_index, digest, content,"
    " created_at) VALUES (%s, %s, %s, %s, %s, %s)",
)

PENDING_COUNT = Sql(
    "SELECT COUNT(*) FROM memory_pending WHERE user_key = ?",
    "SELECT COUNT(*) FROM memory_pending WHERE user_key = %s",
)

SUMMARIES_SUPERSEDED = Sql(
    "UPDATE memories SET status = 'superseded', superseded_by = ?, updated_at = ? WHERE"
    " user_key = ? AND session_key = ? AND kind = 'summary' AND status = 'active' AND id"
    " != ? RETURNING id",
    "UPDATE memories SET status = 'superseded', superseded_by = %s, updated_at = %s WHERE"
    " user_key = %s AND session_key = %s AND kind = 'summary' AND status = 'active' AND"
    " id != %s RETURNING id",
)

FACT_CHAIN = Sql(
    "WITH RECURSIVE chain (id) AS (SELECT id FROM memories WHERE id = ? AND user_key = ?"
    " AND kind = 'fact' AND status = 'active' UNION SELECT m.id FROM memories AS m JOIN"
    " chain ON m.superseded_by = chain.id WHERE m.user_key = ?) SELECT id FROM chain",
    "WITH RECURSIVE chain (id) AS (SELECT id FROM memories WHERE id = %s AND user_key ="
    " %s AND kind = 'fact' AND status = 'active' UNION SELECT m.id FROM memories AS m"
    " JOIN chain ON m.superseded_by = chain.id WHERE m.user_key = %s) SELECT id FROM"
    " chain",
)


class MemoryTables(StoreBase):
    def _bump_memory_version(self, user_id: str) -> None:
        # Versions come from one store-wide counter, never reused: a user forgotten and
        # remembered again can never match a block cached before the forget.
        self.db.execute(MEMORY_SEQ_NEXT)
        self.db.execute(
            MEMORY_VERSION_SET,
            [id_key(user_id)],
        )

    def memory_version(self, user_id: str) -> int:
        """Changes with every change to the user's memories (0: none stored)."""
        rows = self._read_now(MEMORY_VERSION, [id_key(user_id)])
        return int(rows[0][0]) if rows else 0

    def memory_cursor(self, user_id: str, session_id: str) -> tuple[int, str] | None:
        """How many messages of the session's history were read, and the last one's digest."""
        rows = self._fetch(
            MEMORY_CURSOR,
            [id_key(user_id), id_key(session_id)],
        )
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

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
        user, session = id_key(user_id), id_key(session_id)
        with self._locked("write"), self.db.atomic():
            self._keep_ids(session_id)
            for raw_index, digest, content in items:
                cursor = self.db.execute(
                    MESSAGE_SEEN,
                    [user, session, digest],
                )
                if cursor.rowcount == 1:
                    self.db.execute(
                        PENDING_ADDED,
                        [user, session, raw_index, digest, content, now],
                    )
            self.db.execute(
                CURSOR_MOVED,
                [user, session, seen, last_digest, now],
            )
            (count,) = self.db.execute(PENDING_COUNT, [user]).fetchone()
        return int(count)

    def pending_messages(self, user_id: str, *, limit: int) -> list[PendingMessage]:
        """The user's oldest pending messages, oldest first."""
        rows = self._fetch(
            PENDING_OF_USER,
            [id_key(user_id), limit],
        )
        return [PendingMessage(*row) for row in rows]

    def fail_pending(self, user_id: str, ids: Sequence[int], *, max_attempts: int) -> int:
        """One more failed attempt for these pending messages; deletes (and counts) those that
        reached ``max_attempts``."""
        listed = json.dumps(list(ids))
        with self._locked("write"), self.db.atomic():
            self.db.execute(PENDING_FAILED, [id_key(user_id), listed])
            cursor = self.db.execute(PENDING_GIVEN_UP, [id_key(user_id), listed, max_attempts])
        return int(cursor.rowcount)

    def facts(self, user_id: str) -> list[Fact]:
        """The user's active facts, oldest first."""
        rows = self._fetch(
            ACTIVE_FACTS,
            [id_key(user_id)],
        )
        return [Fact(int(r[0]), r[1], r[2]) for r in rows]

    def memory_rows(self, user_id: str, *, kind: MemoryKind | None = None) -> list[dict[str, Any]]:
        """Every memory row of the user, whatever its status, oldest first."""
        params: list[Any]
        if kind is None:
            sql, params = MEMORY_ROWS, [id_key(user_id)]
        else:
            sql, params = MEMORY_ROWS_OF_KIND, [id_key(user_id), kind]
        with self._locked("read"):
            cursor = self.db.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _end_memory(
        self, user_id: str, memory_id: int, status: MemoryStatus, now: str, by: int | None
    ) -> None:
        cursor = self.db.execute(
            FACT_RETIRED,
            [status, by, now, memory_id, id_key(user_id)],
        )
        if cursor.rowcount != 1:
            raise StoreError(f"fact {memory_id} is no longer active; the batch is stale")

    def commit_memories(
        self, user_id: str, pending_ids: Sequence[int], plan: Plan, *, session_id: str
    ) -> None:
        """Write one extraction batch in one transaction: new facts, the facts it ends, its
        pending messages removed. ``StoreError`` (nothing written) when it went stale meanwhile:
        its pending messages are gone (forgotten, taken by another engine) or a fact it ends is."""
        now = iso(self.clock())
        with self._locked("memory write"), self.db.atomic():
            self._keep_ids(session_id)
            cursor = self.db.execute(
                PENDING_DONE,
                [id_key(user_id), json.dumps(list(pending_ids))],
            )
            if cursor.rowcount != len(pending_ids):
                raise StoreError("the batch's pending messages changed meanwhile; it is stale")
            for draft in plan.new:
                cursor = self.db.execute(
                    FACT_ADDED,
                    [id_key(user_id), draft.content, key_of(session_id), now, now],
                )
                new_id = int(cursor.fetchall()[0][0])
                for replaced in sorted(draft.replaces):
                    self._end_memory(user_id, replaced, "superseded", now, new_id)
            ends: tuple[tuple[MemoryStatus, frozenset[int]], ...] = (
                ("retracted", plan.retracted),
                ("evicted", plan.evicted),
            )
            for status, ended in ends:
                for memory_id in sorted(ended):
                    self._end_memory(user_id, memory_id, status, now, None)
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
        user, session = id_key(user_id), id_key(session_id)
        with self._locked("memory write"), self.db.atomic():
            self._keep_ids(session_id)
            cursor = self.db.execute(
                SUMMARY_ADDED,
                [user, summary, session, generation, now, now],
            )
            memory_id = int(cursor.fetchall()[0][0])
            previous = self.db.execute(
                SUMMARIES_SUPERSEDED,
                [memory_id, now, user, session, memory_id],
            ).fetchall()
            for (old,) in previous:
                self.db.execute(
                    SUMMARY_TERMS_DELETED,
                    [old * FTS_ROWS_PER_MEMORY, (old + 1) * FTS_ROWS_PER_MEMORY],
                )
            for number, (terms, excerpt) in enumerate(excerpts[:FTS_ROWS_PER_MEMORY]):
                self.db.execute(
                    SUMMARY_TERMS_ADDED,
                    [memory_id * FTS_ROWS_PER_MEMORY + number, terms, excerpt, user, session],
                )
            self._bump_memory_version(user_id)
        return memory_id

    def search_summaries(
        self, user_id: str, query: str, *, exclude_session: str, limit: int
    ) -> list[str]:
        """The user's summary excerpts from other sessions best matching FTS5 ``query`` (BM25)."""
        rows = self._fetch(
            SUMMARIES_FOUND,
            [self._summary_query(query), id_key(user_id), id_key(exclude_session), limit],
            what="search",
        )
        return [str(r[0]) for r in rows]

    def _summary_query(self, query: str) -> object:
        """What ``SUMMARIES_FOUND`` takes for an FTS5 query: on SQLite, the query."""
        return query

    def forget_fact(self, user_id: str, fact_id: int) -> int:
        """Delete one active fact of the user and the earlier versions it superseded, in one
        transaction; how many rows went (0: the user has no such active fact)."""
        with self._locked("forget"), self.db.atomic():
            found = self.db.execute(
                FACT_CHAIN,
                [fact_id, id_key(user_id), id_key(user_id)],
            ).fetchall()
            ids = [int(row[0]) for row in found]
            if ids:
                self.db.execute(MEMORIES_DELETED, [json.dumps(ids)])
                self._bump_memory_version(user_id)
        return len(ids)

    def forget(self, user_id: str) -> Forgotten:
        """Erase the user's memories (any kind and status), their index and pending messages, in
        one transaction. Cursors and digests stay (no text): the app still holds those histories,
        and what was said before the forget must not be learnt again."""
        user = id_key(user_id)
        with self._locked("forget"), self.db.atomic():
            memories = self.db.execute(USER_MEMORIES_DELETED, [user])
            self.db.execute(USER_TERMS_DELETED, [user])
            pending = self.db.execute(USER_PENDING_DELETED, [user])
            self.db.execute(USER_VERSION_DELETED, [user])
        return Forgotten(memories=int(memories.rowcount), pending=int(pending.rowcount))
