"""A recall row's length in tokens, which the ranker's statistics need: SQLite measures it
when a search the mirror cannot answer first reads the row, PostgreSQL (which finds rows by
their keys) as it indexes it; rows without one (indexed before lengths were kept) rank as
measured ones once measured."""

from __future__ import annotations

import pytest
from conftest import PASSWORD_ENV
from recall_corpus import QUESTIONS, fill, from_store

from ragent_memory import StoreSettings
from ragent_memory.store import open_store
from ragent_memory.store.contract import Backend

pytestmark = pytest.mark.both_backends


def unmeasured(store: Backend) -> int:
    """The SQLite store's rows without a length."""
    found = store.db.execute("SELECT COUNT(*) FROM recall_messages WHERE tokens IS NULL")  # type: ignore[attr-defined]
    return int(found.fetchone()[0])


def test_rows_indexed_before_lengths_were_kept_rank_alike_once_reopened(
    db_path: str, pg_url: str
) -> None:
    """Rows without a length (indexed before lengths were kept; on SQLite, any row until a
    search the mirror cannot answer reads it) rank as measured ones: SQLite measures the rows
    a search reads when it reads them, PostgreSQL (whose keys find a row) when it opens."""
    for settings in (
        StoreSettings(path=db_path),
        StoreSettings(url=pg_url, password_env=PASSWORD_ENV),
    ):
        with open_store(settings) as store:
            fill(store)
            if not settings.url:  # indexing measures nothing; a search, only what it reads
                assert unmeasured(store) == 266 + 15 + 50  # ann's, s2's without a user, bob's
                from_store(store, "refund", session_id="s3", user_id="ann")
                assert unmeasured(store) == 15 + 50  # what ann's search from s3 does not read
            before = [from_store(store, q, session_id="s1", user_id="ann") for q in QUESTIONS[:5]]
            with store._locked("test"), store.db.atomic():  # type: ignore[attr-defined]
                store.db.execute("UPDATE recall_messages SET tokens = NULL")  # type: ignore[attr-defined]
                if settings.url:
                    store.db.execute("UPDATE recall_fts SET keys = NULL")  # type: ignore[attr-defined]
            if settings.url:
                # PostgreSQL finds a row by its keys: none until they are measured again
                assert not store.recall_candidates(["refund"], session_id="s1", user_id="ann").found
        with open_store(settings) as store:
            after = [from_store(store, q, session_id="s1", user_id="ann") for q in QUESTIONS[:5]]
        assert after == before and any(before)
