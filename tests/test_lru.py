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


def test_put_again_replaces_the_value_and_its_weight() -> None:
    """A key put again holds the new value and weight, as the most recently used."""
    lru: LRU[str, str] = LRU(max_weight=100)
    lru.put("a", "x", 10)
    lru.put("b", "y", 20)
    lru.put("a", "z", 5)
    assert ["b", "a"] == list(lru)
    assert ["y", "z"] == list(lru.values())
    assert 25 == lru.weight


def test_the_weight_bound_lets_the_oldest_go_until_it_holds() -> None:
    """Past ``max_weight`` the least recently used go, as many as it takes."""
    lru: LRU[str, None] = LRU(max_count=10, max_weight=10)
    for key, weight in (("a", 4), ("b", 4), ("c", 1)):
        lru.put(key, None, weight)
    lru.put("d", None, 6)
    assert ["c", "d"] == list(lru)
    assert 7 == lru.weight


def test_an_entry_over_the_weight_alone_stays_until_another_comes() -> None:
    """The last entry is never let go, even over the weight bound; the next put ends it."""
    lru: LRU[str, None] = LRU(max_weight=10)
    lru.put("a", None, 3)
    lru.put("big", None, 50)
    assert ["big"] == list(lru)
    lru.put("b", None, 1)
    assert ["b"] == list(lru)
    assert 1 == lru.weight


def test_pop_returns_the_value_and_frees_its_weight() -> None:
    """``pop`` takes the entry out with its weight; a key not held gives the default."""
    lru: LRU[str, int] = LRU(max_weight=100)
    lru.put("a", 1, 30)
    assert 1 == lru.pop("a")
    assert 0 == lru.weight and 0 == len(lru)
    assert None is lru.pop("a")
    assert -1 == lru.pop("a", -1)


def test_a_held_none_is_told_from_a_missing_key() -> None:
    """None may be a value: ``get`` and ``peek`` return it, not the default."""
    lru: LRU[str, None] = LRU(max_count=2)
    lru.put("a", None)
    sentinel = object()
    assert None is lru.get("a", sentinel)
    assert None is lru.peek("a", sentinel)
    assert sentinel is lru.get("b", sentinel)


def test_reweigh_follows_an_entry_that_grew_in_place() -> None:
    """An entry that grew is weighed again without becoming recent; the bound then holds."""
    lru: LRU[str, list[int]] = LRU(max_weight=10)
    lru.put("a", [1], 4)
    lru.put("b", [2], 4)
    lru.reweigh("b", 5)
    assert ["a", "b"] == list(lru) and 9 == lru.weight
    lru.reweigh("a", 6)  # "a" is still the least recent: it goes
    assert ["b"] == list(lru) and 5 == lru.weight


def test_setitem_keeps_the_weight_held() -> None:
    """``lru[key] = value`` replaces the value and keeps the weight the key had."""
    lru: LRU[str, int] = LRU(max_weight=100)
    lru.put("a", 1, 7)
    lru["a"] = 2
    lru["b"] = 3
    assert 2 == lru.peek("a") and 7 == lru.weight


def test_clear_empties_it() -> None:
    """``clear`` lets everything go and its weight with it."""
    lru: LRU[int, int] = LRU(max_count=5, max_weight=50)
    for key in range(3):
        lru.put(key, key, 5)
    lru.clear()
    assert 0 == len(lru) and 0 == lru.weight and [] == list(lru)


@pytest.mark.parametrize("bounds", [{"max_count": 0}, {"max_weight": -1}, {"max_count": 1.5}])
def test_a_bound_that_is_not_a_positive_int_is_refused(bounds: dict[str, object]) -> None:
    """A bound of zero, below zero or not an int is refused, naming the bound."""
    name = next(iter(bounds))
    with pytest.raises(ValueError, match=name):
        LRU(**bounds)  # type: ignore[arg-type]


@given(
    st.lists(
        st.tuples(st.sampled_from("get put pop".split()), st.integers(0, 7), st.integers(0, 9)),
        max_size=60,
    ),
    st.integers(1, 4),
    st.integers(1, 20),
)
def test_it_behaves_as_a_plain_model_of_an_lru(
    ops: list[tuple[str, int, int]], max_count: int, max_weight: int
) -> None:
    """Any run of get / put / pop leaves what a list-based model leaves, bounds held."""
    lru: LRU[int, int] = LRU(max_count=max_count, max_weight=max_weight)
    model: list[tuple[int, int]] = []  # (key, weight), least recent first
    for op, key, weight in ops:
        held = [k for k, _ in model]
        if op == "get":
            assert (key if key in held else None) == lru.get(key)
            if key in held:
                model.append(model.pop(held.index(key)))
        elif op == "pop":
            assert (key if key in held else None) == lru.pop(key)
            model = [(k, w) for k, w in model if k != key]
        else:
            lru.put(key, key, weight)
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
