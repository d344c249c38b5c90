"""A session's request body parsed by what is new since its last one (``BodyCache``).

An app resends its whole history each call: the next body is usually the last one's head
(up to the end of its last message), a tail of new messages, and the last one's suffix (from
the ``]`` closing ``messages``). Then only the tail is parsed, at its depth in the body, and
the last body's message objects are handed out again (so the engine knows them by identity);
anything else is parsed whole. The list is ``messages`` for chat completions and Anthropic
Messages, ``input`` for Responses (``field``). Where the head ends is proved once: the last body with a
sentinel inserted there must parse to itself with the sentinel appended to ``messages``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import orjson

from ragent_memory.core.lru import LRU
from ragent_memory.serve import chat
from ragent_memory.serve.wire import Translations

_WHITESPACE = b" \t\n\r"
_SENTINEL = "ragent-memory: split check"
_CANDIDATES = 128  # "]"s tried from the end for the one that closes ``messages``


@attrs.define
class _Last:
    raw: bytes  # a session's last body
    body: dict[str, Any]
    end: int  # just past the last message (just past "[" when there is none)
    stop: int  # the "]" that closes ``messages``
    field: str = "messages"  # the list's key
    proved: bool = False


class BodyCache:
    """The last body per key (a session), least recently used out past ``max_sessions`` or
    ``max_bytes`` of raw bodies. ``parse`` returns a fresh top-level dict and ``messages``
    list; everything inside may be the last call's objects, which nothing may mutate."""

    def __init__(self, max_sessions: int = 256, max_bytes: int = 64 << 20) -> None:
        self.max_sessions, self.max_bytes = max_sessions, max_bytes
        self.tail_parses = 0  # bodies parsed by their tail only
        self._last: LRU[Hashable, _Last] = LRU(max_sessions, max_bytes, _raw_bytes)
        self._lock = threading.Lock()

    def parse(
        self,
        key: Hashable,
        raw: bytes,
        field: str = "messages",
        whole: Callable[[bytes], dict[str, Any]] = chat.parse,
    ) -> dict[str, Any]:
        """``whole(raw)`` (a body whose ``field`` is a list), by its tail when it extends
        ``key``'s last body."""
        with self._lock:
            last = self._last.pop(key)
            known = _extended(last, raw) if last and last.field == field else None
            if known is not None:
                self.tail_parses += 1
            elif (known := _located(raw, body := whole(raw), field)) is None:
                return body  # not kept: its messages' end cannot be found
            if len(raw) <= self.max_bytes:
                self._last.put(key, known)
            return {**known.body, field: list(known.body[field])}


def _raw_bytes(_key: Hashable, last: _Last) -> int:
    return len(last.raw)


def _extended(last: _Last, raw: bytes) -> _Last | None:
    """``last`` moved on to ``raw`` when ``raw`` is its head, a tail of messages, its suffix."""
    head, suffix = memoryview(last.raw)[: last.end], memoryview(last.raw)[last.stop :]
    stop = len(raw) - len(suffix)
    if stop < last.end or not raw.endswith(suffix) or not raw.startswith(head):
        return None
    if not last.proved and not _proves(last):
        return None
    tail = raw[last.end : stop].rstrip(_WHITESPACE)
    messages = last.body[last.field]
    added = _items(tail.lstrip(_WHITESPACE), after=bool(messages))
    if added is None:
        return None
    body = {**last.body, last.field: [*messages, *added]} if added else last.body
    return _Last(raw, body, last.end + len(tail), stop, last.field, proved=True)


def _items(tail: bytes, *, after: bool) -> list[Any] | None:
    """The values of a tail (``, a, b`` after an item, ``a, b`` in an empty list, or nothing),
    None when it is not such a run; parsed at the depth it has in a body."""
    if not tail:
        return []
    if after and not tail.startswith(b","):
        return None
    values = tail[1:] if after else tail
    parsed = chat.json_or_none(b'{"m":[' + values + b"]}")
    # Alone in a list too: a tail that closes the list and opens another key is no run.
    if not parsed or chat.json_or_none(b"[" + values + b"]") is None:
        return None
    return parsed["m"] or None


def _located(raw: bytes, body: dict[str, Any], field: str) -> _Last | None:
    """``body`` and where its ``field`` list ends in ``raw`` (the last "]" after which the rest
    parses as the list closed and the keys after it), unproved; None if not found."""
    messages = body[field]
    if not isinstance(messages, list) or (messages and not isinstance(messages[-1], dict)):
        return None  # the proof needs a last message the sentinel cannot equal
    keys = list(body)
    expected = {field: [], **{key: body[key] for key in keys[keys.index(field) + 1 :]}}
    opening = b"{" + orjson.dumps(field) + b":["
    stop = len(raw)
    for _ in range(_CANDIDATES):
        stop = raw.rfind(b"]", 0, max(stop, 0))
        if stop > 0 and chat.json_or_none(opening + raw[stop:]) == expected:
            end = stop
            while raw[end - 1] in _WHITESPACE:
                end -= 1
            return _Last(raw, body, end, stop, field)
    return None


def _proves(last: _Last) -> bool:
    """True when ``last.end`` is just past the last item of the body's ``messages``."""
    sentinel = (b"," if last.body[last.field] else b"") + orjson.dumps(_SENTINEL)
    marked = chat.json_or_none(last.raw[: last.end] + sentinel + last.raw[last.end :])
    got = marked.get(last.field) if isinstance(marked, dict) else None
    if not isinstance(got, list) or got[-1:] != [_SENTINEL]:
        return False
    return bool({**marked, last.field: got[:-1]} == last.body)


class KeptTranslations:
    """The last request's translations per key (a session; see ``wire.Translations``), least
    recently used out past ``max_sessions`` or ``max_bytes`` of the request bodies they were
    made from."""

    def __init__(self, max_sessions: int = 256, max_bytes: int = 64 << 20) -> None:
        self.max_sessions, self.max_bytes = max_sessions, max_bytes
        # key → (the size of the body they were made from, the translations)
        self._kept: LRU[Hashable, tuple[int, Translations]] = LRU(
            max_sessions, max_bytes, lambda _key, translations: translations[0]
        )
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> Translations:
        """What a request of ``key`` starts from: its last request's translations."""
        with self._lock:
            _, last = self._kept.pop(key, (0, None))
            return last.next() if last is not None else Translations()

    def keep(self, key: Hashable, translations: Translations, size: int) -> None:
        """Keep ``translations`` (which the request goes on filling in: its way back) for ``key``'s
        next request."""
        if size > self.max_bytes:
            return
        with self._lock:
            self._kept.put(key, (size, translations))
