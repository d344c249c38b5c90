"""``Memo``: a function's answers kept, bounded and thread-safe (a cache that belongs to the
object holding it, never to a module)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """``fn`` of a key with its answers kept: the least recently used go once the keys kept
    measure more than ``max_chars`` (``size``: the chars a key and its answer hold). ``fn``
    runs outside the lock: two threads may both find one answer."""

    def __init__(self, fn: Callable[[K], V], max_chars: int, size: Callable[[K], int]) -> None:
        self.fn = fn
        self.max_chars = max_chars
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._chars = 0

    def __call__(self, key: K) -> V:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = self.fn(key)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = value
                self._chars += self.size(key)
            while self._chars > self.max_chars and len(self._entries) > 1:
                old, _ = self._entries.popitem(last=False)
                self._chars -= self.size(old)
        return value
