"""``Memo``: a function's answers kept, bounded and thread-safe (a cache that belongs to the
object holding it, never to a module), on an ``LRU`` weighed by its keys."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from ragent_memory.core.lru import LRU

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING: Any = object()  # a key not held (None may be an answer)


class Memo(Generic[K, V]):
    """``fn`` of a key with its answers kept: the least recently used go once the keys kept
    measure more than ``max_chars`` (``size``: the chars a key and its answer hold). ``fn``
    runs outside the lock: two threads may both find one answer."""

    def __init__(self, fn: Callable[[K], V], max_chars: int, size: Callable[[K], int]) -> None:
        self.fn = fn
        self.max_chars = max_chars
        self.size = size
        self._lock = threading.Lock()
        self._entries: LRU[K, V] = LRU(None, max_chars, lambda key, _: self.size(key))

    def __call__(self, key: K) -> V:
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is not _MISSING:
                return value
        return self.many((key,))[0]

    def many(self, keys: Sequence[K]) -> list[V]:
        """``fn`` of each key, in order, the lock taken twice (not twice a key)."""
        with self._lock:
            found = self._entries.get_all(keys, _MISSING)
        new: dict[K, V] = {}
        for key, value in zip(keys, found, strict=True):
            if value is _MISSING and key not in new:
                new[key] = self.fn(key)
        with self._lock:
            for key, value in new.items():
                if key not in self._entries:
                    self._entries.put(key, value)
        return [new[k] if v is _MISSING else v for k, v in zip(keys, found, strict=True)]
