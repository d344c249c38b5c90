"""Recall's bounded top-k (recall/topk.py, through the mirror's unit): the same rows and
scores as BM25 over every posting, on random corpora large enough that terms keep block
bounds and reading stops early."""

from __future__ import annotations

import math
import random
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragent_memory import StoreSettings
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall import topk
from ragent_memory.recall.rank import RecallMirror, _Unit, query_keys, rank_candidates, text_terms
from ragent_memory.store import open_store
from ragent_memory.store.contract import Backend
from ragent_memory.text.terms import index_terms, search_terms

# distinct stems, no digits at the end
WORDS = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}x" for i in range(200)]


def exhaustive(
    docs: list[list[str]], lengths: list[int], query: list[str], hidden: set[int], limit: int
) -> list[tuple[int, float]]:
    """BM25 as FTS5 defines it (k1 1.2, b 0.75, its idf floor), every row scored; best
    first, then newest; rows in ``hidden`` left out."""
    n, total = len(docs), sum(lengths)
    counts = [Counter(doc) for doc in docs]
    scores: dict[int, float] = {}
    for term, times in Counter(query).items():
        df = sum(term in c for c in counts)
        if not df:
            continue
        idf = math.log((n - df + 0.5) / (df + 0.5))
        weight = times * (idf if idf > 0 else 1e-6) * 2.2
        for row, c in enumerate(counts):
            if term in c:
                norm = 1.2 * (1 - 0.75 + 0.75 * lengths[row] * n / total)
                scores[row] = scores.get(row, 0.0) + weight * c[term] / (c[term] + norm)
    ranked = sorted(((s, r) for r, s in scores.items() if r not in hidden), reverse=True)
    return [(r, s) for s, r in ranked[:limit]]


def build(docs: list[list[str]]) -> tuple[_Unit, list[int]]:
    unit, lengths = _Unit(), []
    for row, doc in enumerate(docs):
        counts, n = text_terms(" ".join(doc))
        message = IndexedMessage("s", row, "user", "", "", f"d{row}", id=row + 1)
        unit.add(message, False, counts, n)
        lengths.append(n + 1)
    return unit, lengths


corpora = st.tuples(
    st.integers(min_value=1, max_value=10_000),  # seed
    st.integers(min_value=600, max_value=3_000),  # rows
    st.integers(min_value=2, max_value=len(WORDS)),  # vocabulary
    st.integers(min_value=1, max_value=400),  # distinct rows (ties: equal rows score equally)
)


def corpus(seed: int, rows: int, vocab: int, distinct: int) -> list[list[str]]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(vocab)]
    kinds = [
        rng.choices(WORDS[:vocab], weights=weights, k=rng.randint(1, 12)) for _ in range(distinct)
    ]
    return [list(rng.choice(kinds)) for _ in range(rows)]


@pytest.mark.parametrize("whole", [0, 300])  # long terms read whole: none, the rarest
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Found by hypothesis against broken versions: a tie at the cut resolved for the older row,
# and a block bound that was not an upper bound.
@example((38, 600, 36, 348), ["wadx"], 1, 552)
@example((34, 672, 47, 347), ["wakx", "wakx", "waox"], 15, 260)
@given(
    corpora,
    st.lists(st.sampled_from(WORDS[:40]), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=0, max_value=3_000),
)
def test_top_k_is_exhaustive_bm25(
    monkeypatch: pytest.MonkeyPatch,
    whole: int,
    spec: tuple[int, int, int, int],
    query: list[str],
    limit: int,
    visible_from: int,
) -> None:
    monkeypatch.setattr(topk, "WHOLE_POSTINGS", whole)
    monkeypatch.setattr(topk, "FIRST_BLOCKS", 1)  # the bounds checked after every block
    docs = corpus(*spec)
    unit, lengths = build(docs)
    hidden = {row for row in range(len(docs)) if row >= visible_from}
    ranked = unit.rank(
        query_keys(query), session_id="s", visible_from=visible_from, shown=(), limit=limit
    )
    expected = exhaustive(docs, lengths, query, hidden, limit)
    assert [row for row, _ in ranked] == [row for row, _ in expected]
    assert [-score for _, score in ranked] == pytest.approx([s for _, s in expected], rel=1e-12)


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows each scoring pass of the top-k reads, appended as they are scored."""
    read: list[int] = []
    original = topk._score

    def counting(terms, rows, norm):  # type: ignore[no-untyped-def]
        read.append(len(rows))
        return original(terms, rows, norm)

    monkeypatch.setattr(topk, "_score", counting)
    return read


def test_a_long_history_reads_few_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a rare term in the question and a common one, the common term's blocks that
    cannot beat the k-th best are not read: reading stops early (rows read counted)."""
    docs = [["wax", "wbx"] if row % 500 == 7 else ["wax", "wcx", "wdx"] for row in range(20_000)]
    unit, _ = build(docs)
    assert "wax" in unit.blocks
    read = counted_reads(monkeypatch)
    ranked = unit.rank(
        query_keys(["wax", "wbx"]), session_id="x", visible_from=0, shown=(), limit=5
    )
    assert [row for row, _ in ranked] == [19_507, 19_007, 18_507, 18_007, 17_507]
    assert sum(read) <= 40 + 4 * topk.BLOCK_ROWS  # not 20,000


def test_a_common_term_adds_no_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """MaxScore: once the k-th best is known, a term in every row (its idf floored) is only
    looked up, never read for candidates, even where the block bounds stop nothing (every
    block holds a row with the rare term thrice but long and one with it once but short,
    so each block's bound is above any row's score)."""
    monkeypatch.setattr(topk, "WHOLE_POSTINGS", 0)
    docs = [
        ["wax", "wbx", "wbx", "wbx", *["wcx"] * 12]
        if row % 40 == 3
        else ["wax", "wbx"]
        if row % 40 == 23
        else ["wax", "wdx"]
        for row in range(20_000)
    ]
    unit, lengths = build(docs)
    read = counted_reads(monkeypatch)
    query = ["wax", "wbx"]
    ranked = unit.rank(query_keys(query), session_id="x", visible_from=0, shown=(), limit=5)
    expected = exhaustive(docs, lengths, query, set(), 5)
    assert [row for row, _ in ranked] == [row for row, _ in expected]
    assert sum(read) <= topk.FIRST_BLOCKS * topk.BLOCK_ROWS + 1_000  # not 20,000


def test_a_common_terms_counts_per_row_rank_as_its_postings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A term in an eighth of the rows or more keeps its count per row (one byte, what its
    postings say): a count past a byte's reach is read from the postings, and rows after the
    last holding it count nothing: the ranking stays the exhaustive BM25."""
    monkeypatch.setattr(topk, "WHOLE_POSTINGS", 0)
    rng = random.Random(35)
    docs = []
    for row in range(3_000):
        times = 300 if row % 97 == 5 or row == 2_799 else rng.choice((1, 2))
        doc = ["wax"] * times if row < 2_800 else []
        docs.append([*doc, *rng.choices(["wbx", "wcx", "wdx", "wex"], k=rng.randint(1, 6))])
    unit, lengths = build(docs)
    assert set(unit.dense) == {"wax", "wbx", "wcx", "wdx", "wex"}
    assert len(unit.dense["wax"]) == 2_800  # up to the last row holding it
    for query, limit in ((["wax", "wbx"], 40), (["wax"], 20), (["wcx", "wax", "wax"], 7)):
        ranked = unit.rank(query_keys(query), session_id="x", visible_from=0, shown=(), limit=limit)
        expected = exhaustive(docs, lengths, query, set(), limit)
        assert [row for row, _ in ranked] == [row for row, _ in expected]
        assert [-score for _, score in ranked] == pytest.approx([s for _, s in expected], rel=1e-12)


def _user_rows(store: Backend, user: str, count: int, start: int = 0) -> None:
    texts = [f"{user} talked about painting number {start + i} at the lake" for i in range(count)]
    rows = [
        IndexedMessage(f"{user}-s", start + i, "user", t, "", f"{user}{start + i}")
        for i, t in enumerate(texts)
    ]
    store.index_messages(user, rows, [index_terms(t) for t in texts])


def _search(mirror: RecallMirror, user: str) -> list[IndexedMessage]:
    found = mirror.search(
        search_terms("painting lake"),
        session_id="q",
        user_id=user,
        visible_from=1 << 62,
        shown=(),
        limit=5,
    )
    assert found is not None
    return found[0]


def test_a_units_memory_is_what_it_allocates() -> None:
    """The bytes a unit counts as it grows are what tracemalloc sees it allocate, within a
    quarter (what ``recall_memory_mb`` bounds is real memory)."""
    rng = random.Random(5)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        unit = _Unit()
        for row in range(1_000):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))
            counts, n = text_terms(f"{words} order {rng.randint(1, 10**6)}")
            digest = f"{rng.getrandbits(96):024x}"
            message = IndexedMessage(f"s{row // 100}", row, "user", "", "", digest, id=row + 1)
            unit.add(message, True, counts, n)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.75 * used <= unit.nbytes() <= 1.25 * used, (unit.nbytes(), used)


def test_the_mirror_keeps_the_recently_searched_users_within_its_cap(tmp_path: Path) -> None:
    """Past the cap the least recently searched user goes, and is read back from the store
    on its next search; a user larger than the cap alone is left to the store."""
    store = open_store(StoreSettings(path=str(tmp_path / "m.db")))
    try:
        for user in ("ann", "bob", "cy"):
            _user_rows(store, user, 400)
        probe = RecallMirror(store)
        _search(probe, "ann")
        held = probe.memory()
        assert held["rows"] == 400 and held["users"] == 1
        # room for two users' units (three quarters of the cap), not three
        mirror = RecallMirror(store, max_bytes=int(held["units_bytes"] * 2.5 * 4 / 3))
        for user in ("ann", "bob"):
            assert _search(mirror, user)
        assert mirror.memory()["users"] == 2
        _search(mirror, "ann")  # ann searched more recently than bob
        _search(mirror, "cy")
        memory = mirror.memory()
        assert memory["users"] == 2 and memory["bytes"] <= memory["cap"]
        assert memory["rows"] == 800  # bob went: ann and cy are held
        assert [m.position for m in _search(mirror, "bob")] == [399, 398, 397, 396, 395]
        _user_rows(store, "ann", 800, start=400)  # ann grows past the units' share alone
        ask = {"session_id": "q", "user_id": "ann", "visible_from": 1 << 62, "shown": ()}
        assert mirror.search(search_terms("painting lake"), limit=5, **ask) is None  # the store
        stored = rank_candidates(store, search_terms("painting lake"), limit=1, **ask)
        assert [m.position for m in stored] == [1_199]
        assert mirror.memory()["rows"] == 800  # cy and bob (ann went when bob came back)
    finally:
        store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corpora,
    st.lists(st.sampled_from(WORDS[:40]), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=40),
)
def test_the_bounded_experiments_threshold_algorithm_stops_exactly(
    spec: tuple[int, int, int, int], query: list[str], limit: int
) -> None:
    """``benchmarks.topk_budget``'s bounded arm: where its bound stops the reading, its top k
    is the exhaustive BM25's (the experiment's "exact stops" are exact), and a budget of one
    round still returns ``limit`` rows when as many match."""
    from benchmarks import topk_budget

    docs = corpus(*spec)
    unit, lengths = build(docs)
    held = {
        key: topk_budget.groups(np.frombuffer(p, dtype=np.int64), np.asarray(unit.lengths))
        for key, p in unit.postings.items()
        if not isinstance(p, int) and len(p) > topk.LONG
    }
    asked = topk_budget.Query(unit, query_keys(query), held)
    expected = [row for row, _ in exhaustive(docs, lengths, query, set(), limit)]
    rows, settled = topk_budget.bounded_top_k(asked, limit, budget=1 << 40)
    assert settled and rows == expected
    rows, _ = topk_budget.bounded_top_k(asked, limit, budget=1)
    assert len(rows) == len(expected)


def test_a_long_history_is_read_into_the_mirror_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's first search reads their rows from the store ``LOAD_ROWS`` at a time, not as
    one list of the whole history; the unit holds them all and ranks as one read would."""
    from ragent_memory.recall import rank

    store = open_store(StoreSettings(path=str(tmp_path / "m.db")))
    try:
        _user_rows(store, "ann", 300)
        whole = [m.position for m in _search(RecallMirror(store), "ann")]
        reads: list[int] = []
        since = store.indexed_since

        def counted(after: int, **where):  # type: ignore[no-untyped-def]
            rows = since(after, **where)
            reads.append(len(rows))
            return rows

        monkeypatch.setattr(store, "indexed_since", counted)
        monkeypatch.setattr(rank, "LOAD_ROWS", 64)
        mirror = RecallMirror(store)
        assert [m.position for m in _search(mirror, "ann")] == whole
        assert reads == [64, 64, 64, 64, 44] and mirror.memory()["rows"] == 300
    finally:
        store.close()
