"""The recall index (docs/design.md §9b): every message that left a view, or that ``after_turn`` saw,
searchable by its user and session with FTS5 (BM25).

``recall_messages`` holds one row per message (session, user, position in the history, role,
text, the date stamp in force, a content digest); ``recall_fts`` (rowid = that row's id) holds
its search terms (``terms.index_terms``, Porter-stemmed) and a scope: hashed tokens of its
session and user, so a search reads only the caller's own doclists and the SQL filter on the
joined row is exact. PostgreSQL: a ``tsvector`` over the same terms, the scope as a column.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence

import attrs
import sqlite_utils

from ragent_memory.core.records import Forgotten, IndexedMessage
from ragent_memory.store.base import id_key, iso, key_of
from ragent_memory.store.memories import MemoryTables
from ragent_memory.store.offloads import OffloadTables
from ragent_memory.store.sessions import SessionTables

# In the order of ``IndexedMessage``'s fields (a search adds the score): ``IndexedMessage(*row)``,
# read from ``ROWS`` (the session's id is kept once, in ``ids``).
COLUMNS = "s.value, m.position, m.role, m.content, m.dated, m.digest, m.id"
NAMED = "JOIN ids AS s ON s.key = m.session_key"
ROWS = f"recall_messages AS m {NAMED}"


def scope_token(kind: str, value: str) -> str:
    """The FTS token standing for a user (``kind`` "u") or a session ("s")."""
    return kind + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def unindex(db: sqlite_utils.Database, column: str, value: str) -> None:
    """Delete the index rows whose ``column`` (``user_id`` or ``session_id``) is ``value``;
    the caller holds the lock and the transaction."""
    where = {"user_id": "user_key = ?", "session_id": "session_key = ?"}[column]
    key = id_key(value)
    db.execute(
        f"DELETE FROM recall_fts WHERE rowid IN (SELECT id FROM recall_messages WHERE {where})",
        [key],
    )
    db.execute(f"DELETE FROM recall_messages WHERE {where}", [key])
    # A new epoch tells every process's mirror (recall/rank.py) that rows went.
    db.execute("DELETE FROM meta WHERE key = 'recall_epoch'")
    db.execute("INSERT INTO meta (key, value) VALUES ('recall_epoch', ?)", [secrets.token_hex(8)])


class RecallIndexTables(OffloadTables):
    def index_messages(
        self, user_id: str | None, rows: Sequence[IndexedMessage], terms: Sequence[str]
    ) -> int:
        """Add messages to the index (``terms[i]`` is what ``rows[i]`` is searched by); one
        already indexed at that position with that digest is skipped. Returns how many were
        added."""
        now = iso(self.clock())
        added = []
        user = key_of(user_id)
        with self._locked("index write"), self.db.atomic():
            self._keep_ids(*(row.session_id for row in rows))
            for row, text in zip(rows, terms, strict=True):
                inserted = self.db.execute(
                    "INSERT INTO recall_messages (user_key, session_key, position, role, content,"
                    " dated, digest, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT DO NOTHING RETURNING id",
                    [user, id_key(row.session_id), *attrs.astuple(row)[1:6], now],
                ).fetchall()
                if inserted:
                    scope = scope_token("s", row.session_id)
                    if user_id is not None:
                        scope += " " + scope_token("u", user_id)
                    added.append((inserted[0][0], text, scope))
            # After the rows: a statement on another table between two FTS5 inserts makes
            # FTS5 flush what it holds, a segment per row and a merge of them at the commit.
            for values in added:
                self.db.execute(
                    "INSERT INTO recall_fts (rowid, terms, scope) VALUES (?, ?, ?)", list(values)
                )
        return len(added)

    def last_indexed(self, session_id: str) -> IndexedMessage | None:
        """The session's indexed message at the highest position, or None."""
        rows = self._fetch(
            f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = ?"
            " ORDER BY m.position DESC, m.id DESC LIMIT 1",
            [id_key(session_id)],
        )
        return IndexedMessage(*rows[0]) if rows else None

    def search_index(
        self,
        query: str,
        *,
        session_id: str,
        user_id: str | None,
        visible_from: int,
        shown: Sequence[int] = (),
        limit: int,
    ) -> list[IndexedMessage]:
        """The best matches (BM25, lower scores first) of the FTS5 ``query`` among messages
        the caller may see and the view does not show: with ``user_id``, that user's sessions
        (and this session's messages indexed without a user); without it, this session only.
        This session's messages from position ``visible_from`` on are in the view, except
        those in ``shown`` (shown as a placeholder or a preview)."""
        session_scope = f'scope : "{scope_token("s", session_id)}"'
        if user_id is None:
            scope, owner = session_scope, "m.session_key = :session"
        else:
            scope = f'({session_scope} OR scope : "{scope_token("u", user_id)}")'
            owner = "(m.user_key = :user OR (m.session_key = :session AND m.user_key IS NULL))"
        sql = (
            f"SELECT {COLUMNS}, bm25(recall_fts, 1.0, 0.0) AS score"
            f" FROM recall_fts JOIN recall_messages AS m ON m.id = recall_fts.rowid {NAMED}"
            f" WHERE recall_fts MATCH :match AND {owner}"
            " AND NOT (m.session_key = :session AND m.position >= :visible"
            " AND m.position NOT IN (SELECT value FROM json_each(:shown)))"
            " ORDER BY score, m.id DESC LIMIT :limit"
        )
        params = {
            "match": f"{scope} AND terms : ({query})",
            "session": id_key(session_id),
            "user": key_of(user_id),
            "visible": visible_from,
            "shown": json.dumps(sorted(shown)),
            "limit": limit,
        }
        rows = self._fetch(sql, params, what="search")
        return [IndexedMessage(*r) for r in rows]

    # Reads of the in-process mirror (recall/rank.py). ``+`` keeps SQLite on the rowid range
    # (new rows) rather than a whole session's entries of the (session, position) index.
    _BY_ID_ONLY = "+"

    def recall_mark(self) -> tuple[int, str]:
        """(the highest recall row id, the deletion epoch): what moves when rows come or go."""
        ((top, epoch),) = self._read_now(
            "SELECT (SELECT max(id) FROM recall_messages),"
            " (SELECT value FROM meta WHERE key = 'recall_epoch')",
            [],
        )
        return int(top or 0), str(epoch or "")

    def indexed_since(
        self, after: int, *, user_id: str | None, session_id: str, limit: int | None = None
    ) -> list[tuple[IndexedMessage, bool]]:
        """Rows with an id above ``after``, in id order (the first ``limit``), each with
        whether it has a user: the user's rows, or without one, the session's."""
        if user_id is not None:
            where, value = "m.user_key = ?", id_key(user_id)
        else:
            hint = self._BY_ID_ONLY if after else ""
            where, value = f"{hint}m.session_key = ?", id_key(session_id)
        rows = self._fetch(
            f"SELECT {COLUMNS}, m.user_key IS NOT NULL FROM {ROWS}"
            f" WHERE m.id > ? AND {where} ORDER BY m.id LIMIT ?",
            [after, value, (1 << 62) if limit is None else limit],
        )
        return [(IndexedMessage(*r[:-1]), bool(r[-1])) for r in rows]

    def unowned_since(self, session_id: str, after: int) -> bool:
        """Whether the session has a row indexed without a user with an id above ``after``."""
        hint = self._BY_ID_ONLY if after else ""
        rows = self._fetch(
            "SELECT 1 FROM recall_messages AS m WHERE m.id > ?"
            f" AND {hint}m.session_key = ? AND m.user_key IS NULL LIMIT 1",
            [after, id_key(session_id)],
        )
        return bool(rows)

    def indexed_texts(self, ids: Sequence[int]) -> dict[int, str]:
        """The texts of these rows (those still there)."""
        if not ids:
            return {}
        rows = self._fetch(
            f"SELECT id, content FROM recall_messages WHERE id IN ({', '.join('?' * len(ids))})",
            list(ids),
        )
        return {int(r[0]): r[1] for r in rows}

    def indexed_at(self, session_id: str, positions: Sequence[int]) -> list[IndexedMessage]:
        """The session's indexed messages at these positions (the newest row of each)."""
        if not positions:
            return []
        wanted = sorted(set(positions))
        rows = self._fetch(
            f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = ?"
            f" AND m.position IN ({', '.join('?' * len(wanted))}) ORDER BY m.position, m.id",
            [id_key(session_id), *wanted],
        )
        return list({r[1]: IndexedMessage(*r) for r in rows}.values())

    def offload_all(self, session_id: str, contents: Sequence[str], *, ttl_days: float) -> None:
        """Keep each of ``contents`` readable from ``session_id`` by its recall ref (an excerpt
        clipped in a recall block points at its full text this way), in one transaction."""
        if not contents:
            return
        with self._locked("write"), self.db.atomic():
            self._revive(session_id)
            self._offload(session_id, contents, ttl_days)


class IndexedTables(SessionTables, MemoryTables, RecallIndexTables):
    """Sessions and memories whose drop and forget erase their recall index rows too, in the
    same transaction (both backends compose this)."""

    def drop_session(self, session_id: str) -> None:
        """As :meth:`SessionTables.drop_session`, and the session's recall index rows go."""
        with self._locked("write"), self.db.atomic():
            SessionTables.drop_session(self, session_id)
            unindex(self.db, "session_id", session_id)

    def forget(self, user_id: str) -> Forgotten:
        """As :meth:`MemoryTables.forget`, and the user's recall index rows go."""
        with self._locked("forget"), self.db.atomic():
            forgotten = MemoryTables.forget(self, user_id)
            unindex(self.db, "user_id", user_id)
        return forgotten
