"""``LRU``: a mapping bounded by a count of entries and, optionally, by their weight (the bytes
or chars they hold), the least recently used let go first. Every bounded cache in the package
is one of these, owned by the object that uses it, never by a module.

Not thread-safe: each owner already holds a lock around more than the mapping (a lookup, the
work it saves and the store that follows), so a lock of its own would be a second one taken
for nothing. ``Memo`` (``core.memo``) is the thread-safe cache of a function built on it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, ItemsView, Iterable, Iterator, ValuesView
from typing import Any, Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")
_MISSING: Any = object()  # a key not held (None may be a value)


class LRU(Generic[K, V]):
    """At most ``max_count`` entries and, when ``max_weight`` is set, at most that much weight
    (``weigh`` of each entry; every entry weighs 0 without it). Past a bound the least
    recently used entries go, but never the last one: an entry over the weight bound alone
    stays until another comes (an owner that must not keep it refuses it before ``put``).
    ``get`` and ``put`` make an entry the most recently used; ``peek``, ``in`` and iteration
    (least recent first) do not. An entry is weighed when it comes and when it goes, so one
    that grows in place is told with ``resized`` (then ``trim``); the mapping holds the values alone (no
    weight kept beside each: the owners' byte counts stay what they were)."""

    def __init__(
        self,
        max_count: int | None = None,
        max_weight: int | None = None,
        weigh: Callable[[K, V], int] | None = None,
    ) -> None:
        for name, bound, least in (("max_count", max_count, 1), ("max_weight", max_weight, 0)):
            if bound is not None and (not isinstance(bound, int) or bound < least):
                raise ValueError(f"LRU {name} must be an int of at least {least}, not {bound!r}")
        if max_weight is not None and weigh is None:
            raise ValueError("LRU max_weight needs weigh, the weight of an entry")
        self.max_count = max_count
        self.max_weight = max_weight
        self.weigh = weigh
        self.weight = 0  # the entries' weights summed
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def items(self) -> ItemsView[K, V]:
        """(key, value) pairs, least recently used first."""
        return self._entries.items()

    def values(self) -> ValuesView[V]:
        """The values, least recently used first."""
        return self._entries.values()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """``key``'s value, now the most recently used; ``default`` when not held."""
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            return default
        self._entries.move_to_end(key)
        return value

    def get_all(self, keys: Iterable[K], default: D) -> list[V | D]:
        """``get`` of each key, in order (one call for many: the hot path of ``Memo.many``)."""
        entries = self._entries
        found = [entries.get(key, default) for key in keys]
        touch = entries.move_to_end
        for key, value in zip(keys, found, strict=True):
            if value is not default:
                touch(key)
        return found

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek(self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """``key``'s value, its recency untouched; ``default`` when not held."""
        return self._entries.get(key, default)

    def put(self, key: K, value: V) -> None:
        """Hold ``value`` under ``key`` (in place of any value there), the most recently used;
        then let the least recently used go past the bounds."""
        self.pop(key)
        self._entries[key] = value
        self.weight += self._weight(key, value)
        self.trim()

    __setitem__ = put

    def resized(self, key: K, change: int) -> None:
        """``key``'s value grew (or shrank) in place by ``change``, its recency untouched.
        The bounds are not applied yet: the owner may first take out what it will not keep,
        then ``trim``."""
        if key in self._entries:
            self.weight += change

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop(self, key: K, default: D) -> V | D: ...
    def pop(self, key: K, default: object = None) -> object:
        """``key``'s value, no longer held; ``default`` when it was not."""
        value = self._entries.pop(key, _MISSING)
        if value is _MISSING:
            return default
        self.weight -= self._weight(key, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
        self.weight = 0

    def _weight(self, key: K, value: V) -> int:
        return 0 if self.weigh is None else self.weigh(key, value)

    def trim(self) -> None:
        """Let the least recently used go until the bounds hold (or one entry is left)."""
        count, weight, entries = self.max_count, self.max_weight, self._entries
        while len(entries) > 1 and (
            (count is not None and len(entries) > count)
            or (weight is not None and self.weight > weight)
        ):
            self.weight -= self._weight(*entries.popitem(last=False))
