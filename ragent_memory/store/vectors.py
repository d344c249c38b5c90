"""Dense recall's vectors (docs/design.md §9b, optional): each recall index row's embedding kept beside
it in ``recall_messages`` (SQLite ``BLOB``, PostgreSQL ``bytea``: float32, little-endian), the
model that made it, and ``embedded``, the order vectors were written in (``meta.embedding_seq``
counts it under the write lock), so a reader asks only for what is new since it last read.
The rows' own deletes (``forget``, ``drop_session``) take their vectors with them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from ragent_memory.core.records import IndexedMessage
from ragent_memory.store.base import IN_JSON, IN_JSON_PG, Sql, StoreBase, id_key
from ragent_memory.store.recall_index import COLUMNS, ROWS

VECTOR_MODEL = Sql(
    "SELECT value FROM meta WHERE key = 'embedding_model'",
    "SELECT value FROM meta WHERE key = 'embedding_model'",
)

VECTOR_MODEL_SET = Sql(
    "INSERT INTO meta (key, value) VALUES ('embedding_model', ?) ON CONFLICT (key) DO"
    " UPDATE SET value = excluded.value",
    "INSERT INTO meta (key, value) VALUES ('embedding_model', %s) ON CONFLICT (key) DO"
    " UPDATE SET value = excluded.value",
)

VECTOR_SEQ_SET = Sql(
    "INSERT INTO meta (key, value) VALUES ('embedding_seq', ?) ON CONFLICT (key) DO"
    " UPDATE SET value = excluded.value",
    "INSERT INTO meta (key, value) VALUES ('embedding_seq', %s) ON CONFLICT (key) DO"
    " UPDATE SET value = excluded.value",
)

VECTORS_OF_OTHER_MODELS_DROPPED = Sql(
    "UPDATE recall_messages SET embedding = NULL, embedding_model = NULL, embedded = NULL"
    " WHERE embedded IS NOT NULL AND embedding_model <> ?",
    "UPDATE recall_messages SET embedding = NULL, embedding_model = NULL, embedded = NULL"
    " WHERE embedded IS NOT NULL AND embedding_model <> %s",
)

VECTOR_SEQ = Sql(
    "SELECT value FROM meta WHERE key = 'embedding_seq'",
    "SELECT value FROM meta WHERE key = 'embedding_seq'",
)

VECTOR_STORED = Sql(
    "UPDATE recall_messages SET embedding = ?, embedding_model = ?, embedded = ? WHERE id"
    " = ? RETURNING id",
    "UPDATE recall_messages SET embedding = %s, embedding_model = %s, embedded = %s WHERE"
    " id = %s RETURNING id",
)


# The rows without a vector, oldest first; vectors written since a number, in that order: a
# user's rows, or without one, a session's (parameters: the user's or the session's key first).
_UNEMBEDDED = "SELECT id, content FROM recall_messages AS m WHERE m.{}_key = {} AND embedded IS NULL ORDER BY id LIMIT {}"
UNEMBEDDED = MappingProxyType(
    {
        owner: Sql(_UNEMBEDDED.format(owner, "?", "?"), _UNEMBEDDED.format(owner, "%s", "%s"))
        for owner in ("user", "session")
    }
)
_VECTORS = (
    "SELECT m.embedded, m.id, s.value, m.position, m.user_key IS NOT NULL, m.embedding"
    f" FROM {ROWS} WHERE m.embedded > {{0}} AND m.{{1}}_key = {{0}} AND m.embedding_model = {{0}}"
    " ORDER BY m.embedded LIMIT {0}"
)
VECTORS_SINCE = MappingProxyType(
    {
        owner: Sql(_VECTORS.format("?", owner), _VECTORS.format("%s", owner))
        for owner in ("user", "session")
    }
)
ROWS_OF_IDS = Sql(
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.id {IN_JSON}",
    f"SELECT {COLUMNS} FROM {ROWS} WHERE m.id {IN_JSON_PG}",
)


def _scope(user_id: str | None, session_id: str) -> tuple[str, bytes]:
    """Whose rows (the key of ``UNEMBEDDED`` and ``VECTORS_SINCE``) and their key."""
    if user_id is not None:
        return "user", id_key(user_id)
    return "session", id_key(session_id)


class VectorRow(NamedTuple):
    """One stored vector and where its row sits."""

    seq: int  # the order it was written in
    id: int  # the recall row's id
    session_id: str
    position: int
    owned: bool  # the row has a user
    vector: bytes


class VectorTables(StoreBase):
    db: Any

    def unembedded(
        self, *, user_id: str | None, session_id: str, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` rows (id, text) without a vector, oldest first: the user's, or
        without one, the session's (a partial index holds just those rows)."""
        owner, value = _scope(user_id, session_id)
        rows = self._fetch(UNEMBEDDED[owner], [value, limit])
        return [(int(r[0]), str(r[1])) for r in rows]

    def use_vector_model(self, model: str) -> int:
        """Make ``model`` the store's embedding model: when another one made the vectors kept,
        they go (each row is embedded again). Returns how many went."""
        with self._locked("vector write"), self.db.atomic():
            found = self.db.execute(VECTOR_MODEL)
            known = found.fetchall()
            if known and known[0][0] == model:
                return 0
            gone = self.db.execute(
                VECTORS_OF_OTHER_MODELS_DROPPED,
                [model],
            ).rowcount
            self.db.execute(
                VECTOR_MODEL_SET,
                [model],
            )
        return int(gone)

    def store_vectors(self, model: str, vectors: Sequence[tuple[int, bytes]]) -> int:
        """Keep each ``(row id, vector)`` made by ``model``, numbered in the order written, in
        one transaction; rows deleted meanwhile are skipped. Returns how many were kept."""
        if not vectors:
            return 0
        kept = 0
        with self._locked("vector write"), self.db.atomic():
            found = self.db.execute(VECTOR_SEQ).fetchall()
            seq = int(found[0][0]) if found else 0
            for row_id, vector in vectors:
                changed = self.db.execute(
                    VECTOR_STORED,
                    [vector, model, seq + 1, row_id],
                ).fetchall()
                if changed:
                    seq, kept = seq + 1, kept + 1
            self.db.execute(
                VECTOR_SEQ_SET,
                [str(seq)],
            )
        return kept

    def vectors_since(
        self, after: int, *, user_id: str | None, session_id: str, model: str, limit: int = 1 << 62
    ) -> list[VectorRow]:
        """Vectors from ``model`` written after number ``after``, in that order (the first
        ``limit``): the user's rows, or without one, the session's."""
        owner, value = _scope(user_id, session_id)
        rows = self._fetch(VECTORS_SINCE[owner], [after, value, model, limit])
        return [
            VectorRow(int(r[0]), int(r[1]), r[2], int(r[3]), bool(r[4]), bytes(r[5])) for r in rows
        ]

    def indexed_rows(self, ids: Sequence[int]) -> list[IndexedMessage]:
        """These recall rows (those still there), in no particular order."""
        if not ids:
            return []
        rows = self._fetch(ROWS_OF_IDS, [json.dumps(list(ids))])
        return [IndexedMessage(*r) for r in rows]
