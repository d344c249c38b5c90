"""``LRU``: a mapping bounded by a count of entries and, optionally, by their weight (the bytes
or chars they hold), the least recently used let go first. Every bounded cache in the package
is one of these, owned by the object that uses it, never by a module.

Not thread-safe: each owner already holds a lock around more than the mapping (a lookup, the
work it saves and the store that follows), so a lock of its own would be a second one taken
for nothing. ``Memo`` (``core.memo``) is the thread-safe cache of a function built on it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class LRU(Generic[K, V]):
    """At most ``max_count`` entries and, when ``max_weight`` is set, at most that much weight
    (each entry's given to ``put``; 0 when not). Past a bound the least recently used entries
    go, but never the last one: an entry over the weight bound alone stays until another comes
    (an owner that must not keep it refuses it before ``put``). ``get`` and ``put`` make an
    entry the most recently used; ``peek``, ``in`` and iteration (least recent first) do not.
    """

    def __init__(self, max_count: int | None = None, max_weight: int | None = None) -> None:
        for name, bound in (("max_count", max_count), ("max_weight", max_weight)):
            if bound is not None and (not isinstance(bound, int) or bound < 1):
                raise ValueError(f"LRU {name} must be a positive int, not {bound!r}")
        self.max_count = max_count
        self.max_weight = max_weight
        self.weight = 0  # the entries' weights summed
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def items(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs, least recently used first."""
        return ((key, value) for key, (value, _) in self._entries.items())

    def values(self) -> Iterator[V]:
        """The values, least recently used first."""
        return (value for value, _ in self._entries.values())

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """``key``'s value, now the most recently used; ``default`` when not held."""
        found = self._entries.get(key)
        if found is None:
            return default
        self._entries.move_to_end(key)
        return found[0]

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek(self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """``key``'s value, its recency untouched; ``default`` when not held."""
        found = self._entries.get(key)
        return default if found is None else found[0]

    def put(self, key: K, value: V, weight: int = 0) -> None:
        """Hold ``value`` under ``key`` (in place of any value there), the most recently used;
        then let the least recently used go past the bounds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        self._entries[key] = (value, weight)
        self.weight += weight
        self._trim()

    def __setitem__(self, key: K, value: V) -> None:
        """``put`` with the weight ``key`` holds now (0 when new)."""
        held = self._entries.get(key)
        self.put(key, value, held[1] if held is not None else 0)

    def reweigh(self, key: K, weight: int) -> None:
        """``key``'s value grew or shrank in place: its weight is now ``weight``, its recency
        untouched; then the bounds hold again (``key`` itself may go)."""
        value, old = self._entries[key]
        self._entries[key] = (value, weight)
        self.weight += weight - old
        self._trim()

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop(self, key: K, default: D) -> V | D: ...
    def pop(self, key: K, default: object = None) -> object:
        """``key``'s value, no longer held; ``default`` when it was not."""
        found = self._entries.pop(key, None)
        if found is None:
            return default
        self.weight -= found[1]
        return found[0]

    def clear(self) -> None:
        self._entries.clear()
        self.weight = 0

    def _trim(self) -> None:
        count, weight = self.max_count, self.max_weight
        entries = self._entries
        while len(entries) > 1 and (
            (count is not None and len(entries) > count)
            or (weight is not None and self.weight > weight)
        ):
            self.weight -= entries.popitem(last=False)[1][1]
