"""Recall ranks with one code on every backend: the store only finds candidate rows and counts
the statistics BM25 needs; SQLite and PostgreSQL holding the same messages give the same hits
in the same order with the same scores, through the in-process mirror and without it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import PASSWORD_ENV
from recall_corpus import QUESTIONS, Hit, fill, from_store, hits

from ragent_memory import StoreSettings
from ragent_memory.recall.rank import RecallMirror
from ragent_memory.store import open_store
from ragent_memory.store.contract import Backend
from ragent_memory.text.terms import search_terms

pytestmark = pytest.mark.both_backends


@pytest.fixture
def stores(db_path: str, pg_url: str) -> Iterator[tuple[Backend, Backend]]:
    """A SQLite and a PostgreSQL store holding the same messages."""
    sqlite = open_store(StoreSettings(path=db_path))
    postgres = open_store(StoreSettings(url=pg_url, password_env=PASSWORD_ENV))
    try:
        fill(sqlite)
        fill(postgres)
        yield sqlite, postgres
    finally:
        sqlite.close()
        postgres.close()


def from_mirror(mirror: RecallMirror, question: str, **where: object) -> list[Hit] | None:
    found = mirror.search(search_terms(question), limit=40, **where)  # type: ignore[arg-type]
    return None if found is None else hits(found[0])


@pytest.mark.parametrize(
    ("session", "user", "visible_from", "shown"),
    [
        ("s3", "ann", 40, (3, 41)),  # ann's rows; s3's from 40 on are in the view
        ("s4", "bob", 1 << 62, ()),  # bob sees only his own
        ("s1", None, 100, (0,)),  # no user: this session's rows only
    ],
)
def test_both_backends_rank_each_question_alike_with_and_without_the_mirror(
    stores: tuple[Backend, Backend],
    session: str,
    user: str | None,
    visible_from: int,
    shown: tuple[int, ...],
) -> None:
    """Every question gets the same hits, order and scores from SQLite's candidates,
    PostgreSQL's, and each backend's in-process mirror."""
    where = {"session_id": session, "user_id": user, "visible_from": visible_from, "shown": shown}
    answered = 0
    for question in QUESTIONS:
        rankings = []
        for store in stores:
            rankings.append(from_store(store, question, **where))
            rankings.append(from_mirror(RecallMirror(store), question, **where))
        assert all(ranking == rankings[0] for ranking in rankings), question
        answered += bool(rankings[0])
    assert answered >= len(QUESTIONS) - 3  # most questions find something


def test_the_fallback_paths_rank_alike_on_both_backends(
    stores: tuple[Backend, Backend],
) -> None:
    """Where the mirror cannot answer (ann asks from s2, which has rows indexed without a
    user; a mirror too small to hold her rows) both backends give the same ranking, and a
    unit too large for the mirror ranks as the mirror would have ranked it."""
    where = {"session_id": "s2", "user_id": "ann", "visible_from": 1_010, "shown": (1_003,)}
    elsewhere = {"session_id": "s3", "user_id": "ann", "visible_from": 1 << 62, "shown": ()}
    for question in QUESTIONS:
        one, two = (from_store(store, question, **where) for store in stores)
        assert one == two, question
        for store in stores:
            assert from_mirror(RecallMirror(store), question, **where) is None  # the store's
            small = RecallMirror(store, max_bytes=4_096)
            assert from_mirror(small, question, **elsewhere) is None  # too large to keep
            assert from_store(store, question, **elsewhere) == from_mirror(
                RecallMirror(store), question, **elsewhere
            )
    unowned = from_store(stores[0], "kettle parcel refund invoice", **where)
    # rows without a user (positions 1,000 on) are searched too, but not those in the view
    assert any(position >= 1_000 for _, position, _ in unowned)
    assert not [p for _, p, _ in unowned if p >= 1_010]
