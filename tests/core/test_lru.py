"""The one bounded cache (``core.lru.LRU``) and the function cache on it (``core.memo.Memo``)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragent_memory.core.lru import LRU
from ragent_memory.core.memo import Memo


def test_the_least_recently_used_goes_first_past_the_count() -> None:
    """Past ``max_count`` the entry used least recently goes; ``get`` counts as a use."""
    lru: LRU[str, int] = LRU(max_count=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert 1 == lru.get("a")  # "b" is now the least recently used
    lru.put("c", 3)
    assert ["a", "c"] == list(lru)
    assert "b" not in lru


def test_peek_and_membership_leave_the_order_alone() -> None:
    """``peek`` and ``in`` read without making an entry recent: it still goes first."""
    lru: LRU[str, int] = LRU(max_count=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert 1 == lru.peek("a")
    assert "a" in lru
    lru.put("c", 3)
    assert [("b", 2), ("c", 3)] == list(lru.items())


def _by_value(_key: object, value: int) -> int:
    return value


def test_put_again_replaces_the_value_and_its_weight() -> None:
    """A key put again holds the new value and weight, as the most recently used."""
    lru: LRU[str, int] = LRU(max_weight=100, weigh=_by_value)
    lru.put("a", 10)
    lru.put("b", 20)
    lru.put("a", 5)
    assert ["b", "a"] == list(lru)
    assert [20, 5] == list(lru.values())
    assert 25 == lru.weight


def test_the_weight_bound_lets_the_oldest_go_until_it_holds() -> None:
    """Past ``max_weight`` the least recently used go, as many as it takes."""
    lru: LRU[str, int] = LRU(max_count=10, max_weight=10, weigh=_by_value)
    for key, weight in (("a", 4), ("b", 4), ("c", 1)):
        lru.put(key, weight)
    lru.put("d", 6)
    assert ["c", "d"] == list(lru)
    assert 7 == lru.weight


def test_an_entry_over_the_weight_alone_stays_until_another_comes() -> None:
    """The last entry is never let go, even over the weight bound; the next put ends it."""
    lru: LRU[str, int] = LRU(max_weight=10, weigh=_by_value)
    lru.put("a", 3)
    lru.put("big", 50)
    assert ["big"] == list(lru)
    lru.put("b", 1)
    assert ["b"] == list(lru)
    assert 1 == lru.weight


def test_a_weight_bound_of_zero_keeps_only_the_newest() -> None:
    """With ``max_weight=0`` every entry that weighs anything lets the older ones go."""
    lru: LRU[str, int] = LRU(max_weight=0, weigh=_by_value)
    lru.put("a", 1)
    lru.put("b", 1)
    assert ["b"] == list(lru)


def test_pop_returns_the_value_and_frees_its_weight() -> None:
    """``pop`` takes the entry out with its weight; a key not held gives the default."""
    lru: LRU[str, int] = LRU(max_weight=100, weigh=_by_value)
    lru.put("a", 30)
    assert 30 == lru.pop("a")
    assert 0 == lru.weight and 0 == len(lru)
    assert None is lru.pop("a")
    assert -1 == lru.pop("a", -1)


def test_get_all_reads_many_and_makes_the_held_ones_recent() -> None:
    """``get_all`` answers each key in order (the default for those not held) and makes the
    held ones the most recently used, as ``get`` of each would."""
    lru: LRU[str, int] = LRU(max_count=3)
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        lru.put(key, value)
    missing = object()
    assert [3, missing, 1] == lru.get_all(["c", "x", "a"], missing)
    assert ["b", "c", "a"] == list(lru)


def test_a_held_none_is_told_from_a_missing_key() -> None:
    """None may be a value: ``get``, ``peek`` and ``pop`` return it, not the default."""
    lru: LRU[str, None] = LRU(max_count=2)
    lru.put("a", None)
    sentinel = object()
    assert None is lru.get("a", sentinel)
    assert None is lru.peek("a", sentinel)
    assert sentinel is lru.get("b", sentinel)
    assert None is lru.pop("a", sentinel) and "a" not in lru


def test_resized_follows_an_entry_that_grew_in_place() -> None:
    """An entry that grew is weighed again without becoming recent; ``trim`` then applies
    the bound, and an entry taken out first is weighed as it is now."""
    lru: LRU[str, list[int]] = LRU(max_weight=10, weigh=lambda _key, value: len(value))
    a, b, c = [0] * 4, [0] * 4, [0]
    lru.put("a", a)
    lru.put("b", b)
    b.append(0)
    lru.resized("b", 1)
    assert ["a", "b"] == list(lru) and 9 == lru.weight
    a.extend([0, 0])
    lru.resized("a", 2)
    assert 11 == lru.weight  # over, until trimmed
    lru.trim()  # "a" is still the least recent: it goes, weighed as it is now
    assert ["b"] == list(lru) and 5 == lru.weight
    lru.put("c", c)
    c.extend([0] * 20)
    lru.resized("c", 20)
    assert [0] * 21 == lru.pop("c") and 5 == lru.weight
    lru.resized("a", 100)  # a key not held: nothing to follow
    assert 5 == lru.weight


def test_setitem_is_put() -> None:
    """``lru[key] = value`` puts, weighed and the most recently used."""
    lru: LRU[str, int] = LRU(max_weight=100, weigh=_by_value)
    lru["a"] = 7
    lru["b"] = 3
    lru["a"] = 2
    assert ["b", "a"] == list(lru) and 5 == lru.weight
    assert [("b", 3), ("a", 2)] == list(lru.items())


def test_clear_empties_it() -> None:
    """``clear`` lets everything go and its weight with it."""
    lru: LRU[int, int] = LRU(max_count=5, max_weight=50, weigh=_by_value)
    for key in range(3):
        lru.put(key, 5)
    lru.clear()
    assert 0 == len(lru) and 0 == lru.weight and [] == list(lru)


@pytest.mark.parametrize(
    ("bounds", "named"),
    [
        ({"max_count": 0}, "max_count"),
        ({"max_weight": -1, "weigh": _by_value}, "max_weight"),
        ({"max_count": 1.5}, "max_count"),
        ({"max_weight": 10}, "weigh"),
    ],
)
def test_a_bound_out_of_range_is_refused(bounds: dict[str, object], named: str) -> None:
    """A count bound under 1, a weight bound under 0, a bound not an int, or a weight bound
    with no way to weigh an entry, is refused, naming what is wrong."""
    with pytest.raises(ValueError, match=named):
        LRU(**bounds)  # type: ignore[arg-type]


@given(
    st.lists(
        st.tuples(st.sampled_from(["get", "put", "pop"]), st.integers(0, 7), st.integers(0, 9)),
        max_size=60,
    ),
    st.integers(1, 4),
    st.integers(1, 20),
)
def test_it_behaves_as_a_plain_model_of_an_lru(
    ops: list[tuple[str, int, int]], max_count: int, max_weight: int
) -> None:
    """Any run of get / put / pop leaves what a list-based model leaves, bounds held."""
    lru: LRU[int, int] = LRU(max_count, max_weight, _by_value)
    model: list[tuple[int, int]] = []  # (key, weight), least recent first
    for op, key, weight in ops:
        held = dict(model)
        if op == "get":
            assert held.get(key) == lru.get(key)
            if key in held:
                model = [(k, w) for k, w in model if k != key] + [(key, held[key])]
        elif op == "pop":
            assert held.get(key) == lru.pop(key)
            model = [(k, w) for k, w in model if k != key]
        else:
            lru.put(key, weight)
            model = [(k, w) for k, w in model if k != key] + [(key, weight)]
            while len(model) > 1 and (
                len(model) > max_count or sum(w for _, w in model) > max_weight
            ):
                model.pop(0)
        assert [k for k, _ in model] == list(lru)
        assert sum(w for _, w in model) == lru.weight


def test_memo_keeps_answers_within_its_chars() -> None:
    """A memo answers a key again without calling its function, until its chars push it out."""
    asked: list[str] = []
    memo: Memo[str, str] = Memo(lambda key: asked.append(key) or key.upper(), 6, len)
    assert ["AB", "CD", "AB"] == memo.many(["ab", "cd", "ab"])
    assert "AB" == memo("ab")
    assert ["ab", "cd"] == asked
    memo("efg")  # 2 + 2 + 3 > 6: "cd", least recently used, goes
    memo("cd")
    assert ["ab", "cd", "efg", "cd"] == asked


def test_memo_is_safe_across_threads() -> None:
    """Threads asking at once get their own answers, and the chars bound holds after."""
    memo: Memo[int, int] = Memo(lambda key: key * 2, 500, lambda key: 1 + key % 7)
    start = threading.Barrier(8, timeout=30)
    wrong: list[tuple[int, int]] = []

    def work(offset: int) -> None:
        start.wait()
        for i in range(2_000):
            key = (i * 7 + offset) % 400
            got = memo(key) if i % 2 else memo.many([key, key + 1])[0]
            if got != key * 2:
                wrong.append((key, got))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert [] == wrong
    held = list(memo._entries)
    assert sum(1 + key % 7 for key in held) <= 500
