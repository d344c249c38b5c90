"""Recall ranks with one code on every backend: the store only finds candidate rows and counts
the statistics BM25 needs; SQLite and PostgreSQL holding the same messages give the same hits
in the same order with the same scores, through the in-process mirror and without it."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from conftest import PASSWORD_ENV

from ragent_memory import StoreSettings
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.index import index_digest
from ragent_memory.recall.rank import RecallMirror, rank_candidates
from ragent_memory.store import open_store
from ragent_memory.store.contract import Backend
from ragent_memory.text.terms import index_terms, search_terms

pytestmark = pytest.mark.both_backends

FIXED = [
    "Dana is painting the kitchen walls blue this weekend.",
    "The refund policy allows returns within thirty days of delivery.",
    "她上周去北京参加了马拉松比赛，跑得很快。",
    "北京的天气很冷，我们讨论了退款政策。",
    "Ticket 4711: the delivery was delayed because of the storm.",
    "Running every morning keeps him happy; he ran the Boston marathon twice.",
]
WORDS = [
    "refund",
    "delivery",
    "painting",
    "kitchen",
    "marathon",
    "running",
    "storm",
    "ticket",
    "lake",
    "garden",
    "violin",
    "teacher",
    "bakery",
    "invoice",
    "parcel",
    "kettle",
    "museum",
    "harbour",
    "train",
    "bicycle",
    "recipe",
    "concert",
    "hospital",
    "passport",
    "wedding",
    "puppy",
    "lantern",
    "meadow",
]
FILLER = [
    "i",
    "think",
    "that",
    "was",
    "really",
    "great",
    "and",
    "we",
    "should",
    "talk",
    "about",
    "it",
    "again",
    "soon",
]
QUESTIONS = [
    "painting the kitchen walls",
    "refund delivery policy",
    "marathon running happy",
    "北京马拉松",
    "退款 delivery 4711",
    "violin teacher at the museum",
    "parcel kettle invoice refund",
    "wedding passport train harbour",
    "puppy",
    "really great talk soon",  # words in most rows: the mirror reads them by blocks
    "nothing here matches zyzzyva",
]
Hit = tuple[str, int, float]  # session, position, score


def corpus() -> dict[tuple[str | None, str], list[str]]:
    """Seeded messages per (user, session): ann's three sessions, bob's one, and rows of
    ann's session s2 indexed without a user (a search of ann's from s2 must see them). Common
    words reach past a few dozen rows, so the mirror ranks with its block bounds."""
    rng = random.Random(46)

    def message() -> str:
        words = rng.sample(WORDS, rng.randint(1, 4)) + rng.sample(FILLER, rng.randint(2, 8))
        rng.shuffle(words)
        return " ".join(words)

    return {
        ("ann", "s1"): FIXED[:3] + [message() for _ in range(120)],
        ("ann", "s2"): FIXED[3:] + [message() for _ in range(80)],
        (None, "s2"): [message() for _ in range(15)],
        ("ann", "s3"): [message() for _ in range(60)],
        ("bob", "s4"): [message() for _ in range(50)],
    }


def fill(store: Backend) -> None:
    """The same messages, in the same order, into ``store``."""
    for (user, session), texts in corpus().items():
        start = 1_000 if user is None else 0  # rows without a user after the session's own
        rows = [
            IndexedMessage(session, start + i, "user", text, "", index_digest("user", text))
            for i, text in enumerate(texts)
        ]
        store.index_messages(user, rows, [index_terms(text) for text in texts])


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


def hits(found: list[IndexedMessage]) -> list[Hit]:
    return [(m.session_id, m.position, m.score) for m in found]


def from_store(store: Backend, question: str, **where: object) -> list[Hit]:
    """The hits ranked from the store's candidates (the path a search takes without the
    mirror: a unit too large to keep, or a session with rows indexed without a user)."""
    where = {"visible_from": 1 << 62, "shown": (), **where}
    return hits(rank_candidates(store, search_terms(question), limit=40, **where))  # type: ignore[arg-type]


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
