"""The recall index (docs/design.md §9b): every message that left a view, or that ``after_turn`` saw,
findable by its user and session. The store finds a search's candidate rows and counts the
statistics BM25 needs (``recall_candidates``); ranking them is the recall ranker's, the same
code on every backend (``recall/rank.py``).

``recall_messages`` holds one row per message (session, user, position in the history, role,
text, the date stamp in force, a content digest, its length in tokens); ``recall_fts`` (rowid =
that row's id) holds its search terms (``terms.index_terms``, Porter-stemmed by FTS5) and a
scope: hashed tokens of its session and user, so a search reads only the caller's own doclists
and the SQL filter on the joined row is exact. PostgreSQL: the row's keys as the ranker counts
them (``text.keys.text_terms``), a ``text[]`` found by array containment.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from ragent_memory.core.records import Forgotten, IndexedMessage
from ragent_memory.store.base import IN_JSON, IN_JSON_PG, Sql, id_key, iso, key_of
from ragent_memory.store.memories import MemoryTables
from ragent_memory.store.offloads import OffloadTables
from ragent_memory.store.sessions import SessionTables
from ragent_memory.text.keys import query_keys, token_count
from ragent_memory.text.terms import fts_query, index_terms

# In the order of ``IndexedMessage``'s fields (a search adds the score): ``IndexedMessage(*row)``,
# read from ``ROWS`` (the session's id is kept once, in ``ids``).
COLUMNS = "s.value, m.position, m.role, m.content, m.dated, m.digest, m.id"
NAMED = "JOIN ids AS s ON s.key = m.session_key"
ROWS = f"recall_messages AS m {NAMED}"
UNINDEXED = MappingProxyType(
    {
        column: (
            Sql(
                f"DELETE FROM recall_fts WHERE rowid IN (SELECT id FROM recall_messages WHERE {key} = ?)",
                f"DELETE FROM recall_fts WHERE rowid IN (SELECT id FROM recall_messages WHERE {key} = %s)",
            ),
            Sql(
                f"DELETE FROM recall_messages WHERE {key} = ?",
                f"DELETE FROM recall_messages WHERE {key} = %s",
            ),
        )
        for column, key in (("user_id", "user_key"), ("session_id", "session_key"))
    }
)
LAST_INDEXED = Sql(
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = ? ORDER BY m.position DESC, m.id DESC LIMIT 1",
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = %s ORDER BY m.position DESC, m.id DESC LIMIT 1",
)
# Reads of the in-process mirror (recall/rank.py): rows past an id, in id order. Past a first
# read, SQLite's ``+`` keeps it on the rowid range (new rows) rather than a whole session's
# entries of the (session, position) index; PostgreSQL's planner picks the range itself.
_SINCE = f"SELECT {COLUMNS}, m.user_key IS NOT NULL FROM {ROWS} WHERE m.id > "
USER_ROWS_SINCE = Sql(
    f"{_SINCE}? AND m.user_key = ? ORDER BY m.id LIMIT ?",
    f"{_SINCE}%s AND m.user_key = %s ORDER BY m.id LIMIT %s",
)
SESSION_ROWS = Sql(
    f"{_SINCE}? AND m.session_key = ? ORDER BY m.id LIMIT ?",
    f"{_SINCE}%s AND m.session_key = %s ORDER BY m.id LIMIT %s",
)
SESSION_ROWS_SINCE = Sql(
    f"{_SINCE}? AND +m.session_key = ? ORDER BY m.id LIMIT ?",
    f"{_SINCE}%s AND m.session_key = %s ORDER BY m.id LIMIT %s",
)
_UNOWNED = "SELECT 1 FROM recall_messages AS m WHERE m.id > "
UNOWNED = Sql(
    f"{_UNOWNED}? AND m.session_key = ? AND m.user_key IS NULL LIMIT 1",
    f"{_UNOWNED}%s AND m.session_key = %s AND m.user_key IS NULL LIMIT 1",
)
UNOWNED_SINCE = Sql(
    f"{_UNOWNED}? AND +m.session_key = ? AND m.user_key IS NULL LIMIT 1",
    f"{_UNOWNED}%s AND m.session_key = %s AND m.user_key IS NULL LIMIT 1",
)
TEXTS_OF_ROWS = Sql(
    f"SELECT id, content FROM recall_messages WHERE id {IN_JSON}",
    f"SELECT id, content FROM recall_messages WHERE id {IN_JSON_PG}",
)
ROWS_AT = Sql(
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = ? AND m.position {IN_JSON}"
    " ORDER BY m.position, m.id",
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.session_key = %s AND m.position {IN_JSON_PG}"
    " ORDER BY m.position, m.id",
)
CANDIDATES_PER_KEY: Final = 4_096  # a key's newest rows a search ranks (its count is exact)

# Whose rows a search reads: a user's (and this session's indexed without a user), or, without
# a user, this session's. Parameters: (user, session) or (session).
_OF_USER = "(m.user_key = ? OR (m.session_key = ? AND m.user_key IS NULL))"
_OF_USER_PG = "(m.user_key = %s OR (m.session_key = %s AND m.user_key IS NULL))"
_FOUND = f"SELECT {COLUMNS}, m.user_key IS NOT NULL, m.tokens"
# FTS5 names its table in MATCH (an alias is not a column): SQLite's statements use no alias.
_FTS = f"FROM recall_fts JOIN recall_messages AS m ON m.id = recall_fts.rowid {NAMED}"
_FTS_PG = f"FROM recall_fts AS f JOIN recall_messages AS m ON m.id = f.rowid {NAMED}"
_NEWEST = "ORDER BY m.id DESC LIMIT"
# A key's newest rows (parameters: the key's match, the owner, the limit); its rows counted;
# the rows searched and their lengths summed (the ranker's lengths: a row's tokens, one for its
# session's scope token and one for its user's, as FTS5 counts its scope column).
KEY_ROWS_OF_USER = Sql(
    f"{_FOUND} {_FTS} WHERE recall_fts MATCH ? AND {_OF_USER} {_NEWEST} ?",
    f"{_FOUND} {_FTS_PG} WHERE f.keys @> %s AND {_OF_USER_PG} {_NEWEST} %s",
)
KEY_ROWS_OF_SESSION = Sql(
    f"{_FOUND} {_FTS} WHERE recall_fts MATCH ? AND m.session_key = ? {_NEWEST} ?",
    f"{_FOUND} {_FTS_PG} WHERE f.keys @> %s AND m.session_key = %s {_NEWEST} %s",
)
KEY_COUNT_OF_USER = Sql(
    f"SELECT COUNT(*) {_FTS} WHERE recall_fts MATCH ? AND {_OF_USER}",
    f"SELECT COUNT(*) {_FTS_PG} WHERE f.keys @> %s AND {_OF_USER_PG}",
)
KEY_COUNT_OF_SESSION = Sql(
    f"SELECT COUNT(*) {_FTS} WHERE recall_fts MATCH ? AND m.session_key = ?",
    f"SELECT COUNT(*) {_FTS_PG} WHERE f.keys @> %s AND m.session_key = %s",
)
_LENGTHS = "COUNT(*), COALESCE(SUM(m.tokens + 1 + {}), 0)"
_OWNED = "(m.user_key IS NOT NULL)"
_OWNED_PG = "CASE WHEN m.user_key IS NULL THEN 0 ELSE 1 END"
SEARCHED_OF_USER = Sql(
    f"SELECT {_LENGTHS.format(_OWNED)} FROM recall_messages AS m WHERE {_OF_USER}",
    f"SELECT {_LENGTHS.format(_OWNED_PG)} FROM recall_messages AS m WHERE {_OF_USER_PG}",
)
SEARCHED_OF_SESSION = Sql(
    f"SELECT {_LENGTHS.format(_OWNED)} FROM recall_messages AS m WHERE m.session_key = ?",
    f"SELECT {_LENGTHS.format(_OWNED_PG)} FROM recall_messages AS m WHERE m.session_key = %s",
)
INSERT_ROW = Sql(
    "INSERT INTO recall_messages (user_key, session_key, position, role, content, dated,"
    " digest, created_at, tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING RETURNING id",
    "INSERT INTO recall_messages (user_key, session_key, position, role, content, dated,"
    " digest, created_at, tokens) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING RETURNING id",
)
INSERT_TERMS = Sql(
    "INSERT INTO recall_fts (rowid, terms, scope) VALUES (?, ?, ?)",
    "INSERT INTO recall_fts (rowid, terms, scope, keys) VALUES (%s, %s, %s, %s)",
)
# The searched rows without a length yet (parameters: the owner, the limit), and a length.
_UNMEASURED = "SELECT m.id, m.content FROM recall_messages AS m WHERE m.tokens IS NULL AND "
UNMEASURED_OF_USER = Sql(
    f"{_UNMEASURED}{_OF_USER} ORDER BY m.id LIMIT ?",
    f"{_UNMEASURED}{_OF_USER_PG} ORDER BY m.id LIMIT %s",
)
UNMEASURED_OF_SESSION = Sql(
    f"{_UNMEASURED}m.session_key = ? ORDER BY m.id LIMIT ?",
    f"{_UNMEASURED}m.session_key = %s ORDER BY m.id LIMIT %s",
)
MEASURED = Sql(
    "UPDATE recall_messages SET tokens = ? WHERE id = ?",
    "UPDATE recall_messages SET tokens = %s WHERE id = %s",
)
MEASURE_ROWS: Final = 4_096  # rows measured at a time


EPOCH_DELETED = Sql(
    "DELETE FROM meta WHERE key = 'recall_epoch'",
    "DELETE FROM meta WHERE key = 'recall_epoch'",
)

EPOCH_ADDED = Sql(
    "INSERT INTO meta (key, value) VALUES ('recall_epoch', ?)",
    "INSERT INTO meta (key, value) VALUES ('recall_epoch', %s)",
)

RECALL_MARK = Sql(
    "SELECT (SELECT max(id) FROM recall_messages), (SELECT value FROM meta WHERE key ="
    " 'recall_epoch')",
    "SELECT (SELECT max(id) FROM recall_messages), (SELECT value FROM meta WHERE key ="
    " 'recall_epoch')",
)


@attrs.frozen
class Candidates:
    """What a store hands the recall ranker for one search: the rows holding any of the
    question's keys (each key's newest ``CANDIDATES_PER_KEY``), and the statistics BM25 needs
    of all the rows searched, so every backend's rows are ranked by the same code."""

    found: tuple[tuple[IndexedMessage, bool, int], ...]  # row, has a user, tokens; id order
    rows: int  # rows searched
    tokens: int  # their lengths summed (see ``SEARCHED_OF_USER``)
    frequencies: Mapping[str, int]  # rows searched holding each key


def scope_token(kind: str, value: str) -> str:
    """The FTS token standing for a user (``kind`` "u") or a session ("s")."""
    return kind + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def unindex(db: Any, column: str, value: str) -> None:
    """Delete the index rows whose ``column`` (``user_id`` or ``session_id``) is ``value``;
    the caller holds the lock and the transaction."""
    terms, rows = UNINDEXED[column]
    key = id_key(value)
    db.execute(terms, [key])
    db.execute(rows, [key])
    # A new epoch tells every process's mirror (recall/rank.py) that rows went.
    db.execute(EPOCH_DELETED)
    db.execute(EPOCH_ADDED, [secrets.token_hex(8)])


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
                length, keys = self._measure(row.content)
                inserted = self.db.execute(
                    INSERT_ROW,
                    [user, id_key(row.session_id), *attrs.astuple(row)[1:6], now, length],
                ).fetchall()
                if inserted:
                    scope = scope_token("s", row.session_id)
                    if user_id is not None:
                        scope += " " + scope_token("u", user_id)
                    added.append([inserted[0][0], text, scope, *keys])
            # After the rows: a statement on another table between two FTS5 inserts makes
            # FTS5 flush what it holds, a segment per row and a merge of them at the commit.
            for values in added:
                self.db.execute(INSERT_TERMS, values)
        return len(added)

    def _measure(self, content: str) -> tuple[int | None, list[list[str]]]:
        """What an indexed row keeps besides its text: its length in tokens, and what else
        its ``recall_fts`` row holds. SQLite: neither now (FTS5 finds a row's keys itself; its
        length is measured when a search first needs it: ``_measure_searched``)."""
        return None, []

    def _measure_searched(self, of_user: bool, owner: Sequence[bytes]) -> None:
        """Give the rows a search reads the lengths they lack (``text.keys.token_count``),
        ``MEASURE_ROWS`` at a time, each batch in a transaction: off the indexing path, which
        every turn pays, onto the searches the mirror cannot answer (and rows indexed before
        lengths were kept). Two stores measuring at once write the same values."""
        unmeasured = UNMEASURED_OF_USER if of_user else UNMEASURED_OF_SESSION
        while True:
            rows = self.db.execute(unmeasured, [*owner, MEASURE_ROWS]).fetchall()
            if rows:
                lengths = [[token_count(index_terms(content)), row_id] for row_id, content in rows]
                with self.db.atomic():
                    self.db.executemany(MEASURED, lengths)
            if len(rows) < MEASURE_ROWS:
                return

    def last_indexed(self, session_id: str) -> IndexedMessage | None:
        """The session's indexed message at the highest position, or None."""
        rows = self._fetch(
            LAST_INDEXED,
            [id_key(session_id)],
        )
        return IndexedMessage(*rows[0]) if rows else None

    def recall_candidates(
        self, terms: Sequence[str], *, session_id: str, user_id: str | None
    ) -> Candidates:
        """The rows a search of ``terms`` (``terms.search_terms``) ranks, with their
        statistics (``Candidates``): with ``user_id``, that user's rows and this session's
        indexed without a user; without it, this session's. Which of them the view shows is
        the ranker's to leave out: they count in the statistics all the same."""
        if user_id is None:
            owner = [id_key(session_id)]
            find, count, searched = KEY_ROWS_OF_SESSION, KEY_COUNT_OF_SESSION, SEARCHED_OF_SESSION
        else:
            owner = [id_key(user_id), id_key(session_id)]
            find, count, searched = KEY_ROWS_OF_USER, KEY_COUNT_OF_USER, SEARCHED_OF_USER
        found: dict[int, tuple[IndexedMessage, bool, int]] = {}
        frequencies: dict[str, int] = {}
        with self._locked("search"):
            self._measure_searched(user_id is not None, owner)
            for key, match in self._key_matches(terms, session_id, user_id).items():
                rows = self.db.execute(find, [match, *owner, CANDIDATES_PER_KEY]).fetchall()
                frequencies[key] = len(rows)
                if len(rows) == CANDIDATES_PER_KEY:
                    frequencies[key] = int(self.db.execute(count, [match, *owner]).fetchone()[0])
                for row in rows:
                    found[row[6]] = (IndexedMessage(*row[:7]), bool(row[7]), int(row[8]))
            ((searched_rows, lengths),) = self.db.execute(searched, owner).fetchall()
        return Candidates(
            tuple(found[row_id] for row_id in sorted(found)),
            int(searched_rows),
            int(lengths),
            frequencies,
        )

    def _key_matches(
        self, terms: Sequence[str], session_id: str, user_id: str | None
    ) -> dict[str, object]:
        """Each key of ``terms`` (``text.keys.query_keys``) and what finds its rows: an FTS5
        query of the term's phrase within the caller's scope tokens."""
        scope = f'scope : "{scope_token("s", session_id)}"'
        if user_id is not None:
            scope = f'({scope} OR scope : "{scope_token("u", user_id)}")'
        matches: dict[str, object] = {}
        for term in terms:
            for key in query_keys([term]):
                matches.setdefault(key, f"{scope} AND terms : ({fts_query([term])})")
        return matches

    def recall_mark(self) -> tuple[int, str]:
        """(the highest recall row id, the deletion epoch): what moves when rows come or go."""
        ((top, epoch),) = self._read_now(
            RECALL_MARK,
            [],
        )
        return int(top or 0), str(epoch or "")

    def indexed_since(
        self, after: int, *, user_id: str | None, session_id: str, limit: int | None = None
    ) -> list[tuple[IndexedMessage, bool]]:
        """Rows with an id above ``after``, in id order (the first ``limit``), each with
        whether it has a user: the user's rows, or without one, the session's."""
        if user_id is not None:
            sql, value = USER_ROWS_SINCE, id_key(user_id)
        else:
            sql = SESSION_ROWS_SINCE if after else SESSION_ROWS
            value = id_key(session_id)
        rows = self._fetch(sql, [after, value, (1 << 62) if limit is None else limit])
        return [(IndexedMessage(*r[:-1]), bool(r[-1])) for r in rows]

    def unowned_since(self, session_id: str, after: int) -> bool:
        """Whether the session has a row indexed without a user with an id above ``after``."""
        sql = UNOWNED_SINCE if after else UNOWNED
        rows = self._fetch(sql, [after, id_key(session_id)])
        return bool(rows)

    def indexed_texts(self, ids: Sequence[int]) -> dict[int, str]:
        """The texts of these rows (those still there)."""
        if not ids:
            return {}
        rows = self._fetch(TEXTS_OF_ROWS, [json.dumps(list(ids))])
        return {int(r[0]): r[1] for r in rows}

    def indexed_at(self, session_id: str, positions: Sequence[int]) -> list[IndexedMessage]:
        """The session's indexed messages at these positions (the newest row of each)."""
        if not positions:
            return []
        wanted = sorted(set(positions))
        rows = self._fetch(ROWS_AT, [id_key(session_id), json.dumps(wanted)])
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
