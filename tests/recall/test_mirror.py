"""The in-process recall mirror (recall/rank.py): the store's ranking, the store's rows as
they are now (whoever wrote or deleted them), and never another user's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from ragent_memory import StoreSettings
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.excerpts import _around
from ragent_memory.recall.index import index_digest
from ragent_memory.recall.rank import RecallMirror, rank_candidates
from ragent_memory.store import open_store
from ragent_memory.store.contract import Backend
from ragent_memory.text.terms import fts_query, index_terms, search_terms

pytestmark = pytest.mark.both_backends

TEXTS = [
    "Dana is painting the kitchen walls blue this weekend.",
    "The refund policy allows returns within thirty days of delivery.",
    "My sister paints landscapes; her paintings sold at the fair.",
    "Ticket 4711: the delivery was delayed because of the storm.",
    "We talked about running shoes and the marathon in May.",
    "她上周去北京参加了马拉松比赛，跑得很快。",
    "北京的天气很冷，我们讨论了退款政策。",
    "Refunds are processed within five business days; delivery fees are not refunded.",
    "The happiest day was when the painting won a prize at the county fair.",
    "Running every morning keeps him happy; he ran the Boston marathon twice.",
]


@pytest.fixture
def stores(store_settings: StoreSettings) -> Iterator[tuple[Backend, Backend]]:
    """Two stores on one database: two processes (or hosts) sharing it."""
    one, two = open_store(store_settings), open_store(store_settings)
    yield one, two
    one.close()
    two.close()


def put(store: Backend, user: str | None, session: str, texts: list[str], start: int = 0) -> None:
    rows = [
        IndexedMessage(session, start + i, "user", text, "", index_digest("user", text))
        for i, text in enumerate(texts)
    ]
    store.index_messages(user, rows, [index_terms(t) for t in texts])


def both(
    store: Backend,
    mirror: RecallMirror,
    query: str,
    *,
    session: str,
    user: str | None,
    visible_from: int = 1 << 62,
    shown: tuple[int, ...] = (),
) -> tuple[list[IndexedMessage], list[IndexedMessage]]:
    terms = search_terms(query)
    found = mirror.search(
        terms,
        session_id=session,
        user_id=user,
        visible_from=visible_from,
        shown=shown,
        limit=40,
    )
    assert found is not None
    stored = rank_candidates(
        store,
        terms,
        session_id=session,
        user_id=user,
        visible_from=visible_from,
        shown=shown,
        limit=40,
    )
    return found[0], stored


def fts5_ranking(store: Backend, query: str) -> list[tuple[int, float]]:
    """FTS5's own ``bm25()`` ranking of every row for ``query`` (row id, score), the
    yardstick the ranker's BM25 reproduces (one user per store: the same statistics)."""
    rows = store.db.execute(  # type: ignore[attr-defined]
        "SELECT rowid, bm25(recall_fts, 1.0, 0.0) AS score FROM recall_fts"
        " WHERE recall_fts MATCH ? ORDER BY score, rowid DESC",
        [f"terms : ({fts_query(search_terms(query))})"],
    ).fetchall()
    return [(int(row_id), float(score)) for row_id, score in rows]


@pytest.mark.parametrize(
    "query",
    [
        "painting the walls",
        "refund delivery policy",
        "marathon running happy",
        "北京马拉松",
        "退款 delivery 4711",
    ],
)
def test_mirror_ranks_as_fts5_bm25(
    stores: tuple[Backend, Backend], backend: str, query: str
) -> None:
    store, _ = stores
    put(store, "ann", "s1", TEXTS[:5])
    put(store, "ann", "s2", TEXTS[5:])
    mirror = RecallMirror(store)
    mine, stored = both(store, mirror, query, session="s2", user="ann", visible_from=3, shown=(1,))
    assert mine, query
    assert [(m.id, m.score) for m in mine] == [(m.id, m.score) for m in stored]
    if backend == "sqlite":  # the ranking FTS5 itself gives, of the rows the view hides
        hidden = {m.id for m in store.indexed_at("s2", [3, 4, 5, 6])}
        fts5 = [(row_id, score) for row_id, score in fts5_ranking(store, query)]
        fts5 = [(row_id, score) for row_id, score in fts5 if row_id not in hidden]
        assert [m.id for m in mine] == [row_id for row_id, _ in fts5]
        assert [m.score for m in mine] == pytest.approx([score for _, score in fts5], rel=1e-9)
    # this session's rows from position 3 on are in the view; 1 is shown as a placeholder
    assert not [m for m in mine if m.session_id == "s2" and m.position >= 3 and m.position != 1]


def test_a_hits_neighbours_are_the_stores_as_rows_arrive_beside_it(
    stores: tuple[Backend, Backend],
) -> None:
    """Each search shows the neighbours the store holds now: one indexed later beside a hit (written by
    this process or another), and a newer row at a neighbour's position or the hit's own
    (an edited message indexed again) instead of the old one, beside the old row at the
    hit's position as well (it is still a hit)."""
    store, other = stores
    mirror = RecallMirror(store)

    def check(query: str) -> list[IndexedMessage]:
        found = mirror.search(
            search_terms(query),
            session_id="s9",
            user_id="ann",
            visible_from=1 << 62,
            shown=(),
            limit=40,
        )
        assert found is not None
        hits, around = found
        assert around == _around(store, hits)
        return hits

    put(store, "ann", "s1", ["Dana asked about the refund for parcel 12."], start=4)
    assert [4] == [m.position for m in check("refund parcel")]
    put(store, "ann", "s1", ["The parcel went out on Monday."], start=5)
    check("refund parcel")
    put(other, "ann", "s1", ["Her parcel was a kettle."], start=3)
    hits = check("refund parcel")
    assert {3, 4, 5} == {m.position for m in hits}
    put(store, "ann", "s1", ["The parcel went out on Tuesday, not Monday."], start=5)
    check("refund parcel")
    put(other, "ann", "s1", ["Refund of parcel 13, not 12."], start=4)  # ranks above the old
    hits = check("refund parcel")
    assert any("13" in m.content for m in hits if m.position == 4)
    put(store, "ann", "s1", ["The parcel went out on Wednesday."], start=5)  # beside both 4s
    check("refund parcel")


def test_mirror_sees_rows_another_process_writes_and_forgets(
    stores: tuple[Backend, Backend],
) -> None:
    store, other = stores
    put(store, "ann", "s1", TEXTS[:3])
    mirror = RecallMirror(store)
    first, _ = both(store, mirror, "refund policy", session="s9", user="ann")
    assert [m.position for m in first] == [1]
    put(other, "ann", "s3", ["Another refund was asked for the blue kettle."])
    seen, stored = both(store, mirror, "refund kettle", session="s9", user="ann")
    assert {(m.session_id, m.position) for m in seen} == {
        (m.session_id, m.position) for m in stored
    }
    assert ("s3", 0) in {(m.session_id, m.position) for m in seen}
    other.drop_session("s3")
    gone, _ = both(store, mirror, "refund kettle", session="s9", user="ann")
    assert [(m.session_id, m.position) for m in gone] == [("s1", 1)]
    other.forget("ann")
    after, stored = both(store, mirror, "refund painting", session="s9", user="ann")
    assert after == [] == stored


def test_mirror_forget_then_search_in_the_same_process(stores: tuple[Backend, Backend]) -> None:
    store, _ = stores
    put(store, "ann", "s1", TEXTS[:5])
    mirror = RecallMirror(store)
    assert both(store, mirror, "marathon", session="s1", user="ann")[0]
    store.forget("ann")
    assert both(store, mirror, "marathon", session="s1", user="ann")[0] == []
    put(store, "ann", "s1", ["The marathon again, after forgetting."], start=7)
    again, _ = both(store, mirror, "marathon", session="s1", user="ann")
    assert [m.content for m in again] == ["The marathon again, after forgetting."]


def test_mirror_never_shows_another_users_rows(stores: tuple[Backend, Backend]) -> None:
    store, other = stores
    put(store, "ann", "a1", ["Ann's secret code is kestrel."])
    put(other, "bob", "b1", ["Bob's secret code is falcon."])
    put(other, None, "n1", ["Nobody's secret code is heron."])
    mirror = RecallMirror(store)
    ann, _ = both(store, mirror, "secret code", session="a2", user="ann")
    assert [m.session_id for m in ann] == ["a1"]
    bob, _ = both(store, mirror, "secret code", session="a2", user="bob")
    assert [m.session_id for m in bob] == ["b1"]
    nobody, _ = both(store, mirror, "secret code", session="n1", user=None)
    assert [m.session_id for m in nobody] == ["n1"]  # no user: this session only
    fresh, _ = both(store, mirror, "secret code", session="x", user=None)
    assert fresh == []
    around = mirror.search(
        search_terms("secret"), session_id="a2", user_id="ann", visible_from=0, shown=(), limit=5
    )
    assert around is not None
    assert {key[0] for key in around[1]} <= {"a1"}


def test_a_users_search_over_rows_indexed_without_a_user_is_left_to_the_store(
    stores: tuple[Backend, Backend],
) -> None:
    store, _ = stores
    put(store, "ann", "a1", ["The kestrel nested on the roof."])
    mirror = RecallMirror(store)
    assert mirror.search(
        search_terms("kestrel"), session_id="a2", user_id="ann", visible_from=9, shown=(), limit=5
    )
    put(store, None, "a2", ["A kestrel again, said before the user was known."])
    # the store's search sees this session's rows without a user too: the mirror defers
    assert (
        mirror.search(
            search_terms("kestrel"),
            session_id="a2",
            user_id="ann",
            visible_from=9,
            shown=(),
            limit=5,
        )
        is None
    )


def test_after_a_write_of_the_users_rows_a_search_asks_nothing_of_unowned_rows(
    stores: tuple[Backend, Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh after a write of the user's rows asks whether the session has rows
    without a user (off the caller's thread): the turn's search then asks the store
    nothing of it, and still defers to the store once such a row comes (from any writer)."""
    store, other = stores
    put(store, "ann", "a2", ["The kestrel nested on the roof."])
    mirror = RecallMirror(store)
    terms = search_terms("kestrel")
    search = dict(session_id="a2", user_id="ann", visible_from=99, shown=(), limit=5)
    assert mirror.search(terms, **search)
    asked: list[str] = []
    real = type(store).unowned_since
    monkeypatch.setattr(
        type(store), "unowned_since", lambda self, *a: asked.append("x") or real(self, *a)
    )
    text = "A kestrel hovered over the field."
    rows = [IndexedMessage("a2", 1, "user", text, "", index_digest("user", text))]
    with mirror.writing("ann", "a2"):  # as the indexer writes
        store.index_messages("ann", rows, [index_terms(text)])
    assert ["x"] == asked  # by the refresh
    found = mirror.search(terms, **search)
    assert found is not None and 2 == len(found[0]) and ["x"] == asked
    put(other, None, "a2", ["A kestrel again, said before the user was known."], start=2)
    assert mirror.search(terms, **search) is None and ["x", "x"] == asked


WORDS = (
    "running runs ran happily happiness caresses ponies cats agreed plastered motoring sing"
    " conflated troubling sized hopping falling hissing fizzed failing filing happy sky"
    " relational conditional rational valenci hesitanci digitizer conformabli radicalli"
    " differentli vileli analogousli vietnamization predication operator feudalism"
    " decisiveness hopefulness callousness formaliti sensitiviti sensibiliti triplicate"
    " formative formalize electriciti electrical hopeful goodness revival allowance"
    " inference airliner gyroscopic adjustable defensible irritant replacement adjustment"
    " dependent adoption homologou communism activate angulariti homologous effective"
    " bowdlerize probate rate cease controll roll generalizations oscillators µs naïve"
    " Café STRASSE 4711th 12s"
)


def test_the_mirrors_tokens_are_fts5s() -> None:
    """The mirror counts the tokens the store's FTS5 index holds (porter unicode61
    remove_diacritics 2): a drift would rank differently from the store."""
    import sqlite3

    from ragent_memory.text.porter import stem, tokens

    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE VIRTUAL TABLE t USING fts5 (x, tokenize = 'porter unicode61 remove_diacritics 2')"
    )
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab (t, 'instance')")
    db.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", [WORDS])
    theirs = [term for _, term in sorted(db.execute("SELECT offset, term FROM v"))]
    db.close()
    assert [stem(t) for t in tokens(WORDS)] == theirs


def test_the_best_few_of_many_tied_matches_rank_as_fts5(
    stores: tuple[Backend, Backend], backend: str
) -> None:
    """With more matches than the limit (and ties at the cut) the mirror keeps what FTS5
    keeps, in its order: by score, then newest first."""
    store, _ = stores
    texts = [
        "The refund arrived.",
        "A refund, a refund, a refund for the kettle.",
        "The refund arrived.",
        *[f"The refund arrived for order {i}." for i in range(9)],
        "The refund arrived.",
    ]
    put(store, "ann", "s1", texts)
    mirror = RecallMirror(store)
    terms = search_terms("refund arrived")
    for limit in (1, 3, 4, 6):
        found = mirror.search(
            terms, session_id="s1", user_id="ann", visible_from=11, shown=(2, 9), limit=limit
        )
        stored = rank_candidates(
            store,
            terms,
            session_id="s1",
            user_id="ann",
            visible_from=11,
            shown=(2, 9),
            limit=limit,
        )
        assert found is not None and len(found[0]) == limit
        assert [m.position for m in found[0]] == [m.position for m in stored]
        if backend == "sqlite":
            hidden = {m.id for m in store.indexed_at("s1", [11, 12])}
            fts5 = [row_id for row_id, _ in fts5_ranking(store, "refund arrived")]
            assert [m.id for m in found[0]] == [i for i in fts5 if i not in hidden][:limit]


_FIRST_RANK = """
import sys
from ragent_memory.recall import rank
from ragent_memory.core.records import IndexedMessage
unit = rank._Unit()
for i in range(6):
    counts, n = rank.text_terms(f"refund {i}")
    unit.add(IndexedMessage("s", i, "user", "x", "", f"d{i}", id=i + 1), False, counts, n)
before = set(sys.modules)
ranked = unit.rank(
    rank.query_keys(["refund"]), session_id="s", visible_from=3, shown=[5, 1, 4, 1], limit=10
)
print(sorted(unit.positions[row] for row, _ in ranked))
print(sorted(name for name in set(sys.modules) - before if name.startswith("numpy")))
"""


def test_a_processs_first_ranking_loads_no_more_of_numpy() -> None:
    """The first ranking with rows shown as placeholders (given unsorted, repeated) hides the
    rest of the view and imports nothing more of numpy (``np.unique`` pulled in numpy.ma:
    tens of ms on a process's first recall turn)."""
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_RANK], capture_output=True, text=True, check=True, timeout=60
    )
    assert ["[0, 1, 2, 4, 5]", "[]"] == out.stdout.split("\n")[:2]


def test_hits_a_search_does_not_keep_are_left_out_with_their_neighbours(
    stores: tuple[Backend, Backend],
) -> None:
    """``keep`` drops a hit (the prompt holds it already) and the neighbours only it had."""
    store, _ = stores
    put(store, None, "s", ["Walls first.", "Dana paints the walls.", "Then the floor."])
    put(store, None, "s", ["Aside.", "The fence gets paint too.", "Done."], start=10)
    mirror = RecallMirror(store)
    ask = {"session_id": "s", "user_id": None, "visible_from": 99, "shown": (), "limit": 5}
    found = mirror.search(search_terms("paint"), keep=lambda text: "Dana" not in text, **ask)
    assert found is not None
    hits, around = found
    assert [hit.position for hit in hits] == [11]
    assert sorted(around) == [("s", 10), ("s", 12)]
