"""``Memo``: a function's answers kept, bounded and thread-safe (a cache that belongs to the
object holding it, never to a module)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """``fn`` of a text with its answers kept (``fn`` never answers None): the least recently
    used go once the texts kept hold more than ``max_chars``. ``fn`` runs outside the lock:
    two threads may both find one answer."""

    def __init__(self, fn: Callable[[str], V], max_chars: int) -> None:
        self.fn = fn
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, V] = OrderedDict()
        self._chars = 0

    def __call__(self, key: str) -> V:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        value = self.fn(key)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = value
                self._chars += len(key)
            while self._chars > self.max_chars and len(self._entries) > 1:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)
        return value
