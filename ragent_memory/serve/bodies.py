"""Chat-completions request bodies parsed, and the prepared ones encoded, in time
proportional to what is new (``serve``).

An app resends its whole history on every call, so a session's next body is usually the
previous one with a few messages inserted before the ``]`` that closes ``messages``::

    previous:  {"model": "m", "messages": [ m0, m1, m2 ], "tools": […]}
                └──────────── head ──────────────┘└── suffix ──┘
    next:      {"model": "m", "messages": [ m0, m1, m2 , m3, m4 ], "tools": […]}
                └──────────── head ──────────────┘└ tail ──┘└── suffix ──┘

When the next body starts with the previous head and ends with its suffix (two ``memcmp``
calls), only the tail is parsed: the earlier message objects are reused, which also lets the
engine's identity check see them as already known. Anything else (an edited or dropped
message, another model, reordered keys, other whitespace, a tail that is not a run of
``, value`` items) is parsed whole, as it would be without this cache.

Where ``head`` ends is found once per session from the bytes (the last ``]`` whose remainder
parses as the rest of the top-level object) and then *proved* before it is relied on: the body
with ``,"…sentinel"`` inserted there must parse to the same object with the sentinel appended
to ``messages`` — an insertion anywhere else (inside a string, another array, before the last
message) gives an invalid document or a different object. A proved split stays proved when a
tail is parsed, since the tail is then a run of complete values between the same head and
suffix.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs
import orjson

_WHITESPACE = b" \t\n\r"
_SENTINEL = "ragent-memory: split check"
_MAX_SUFFIX_CANDIDATES = 256


class BodyError(ValueError):
    """A body that is not a JSON object with a ``messages`` list; the text says which."""


@attrs.define
class _Known:
    """A session's last body and where its ``messages`` array ends."""

    raw: bytes
    body: dict[str, Any]
    end: int  # just past the last message (just past ``[`` when there is none)
    suffix: int  # the ``]`` that closes ``messages``
    proved: bool


def parse_whole(raw: bytes) -> dict[str, Any]:
    """The body as a dict with a ``messages`` list, or a ``BodyError``."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise BodyError(f"malformed body: not JSON ({err})") from err
    if not isinstance(body, dict):
        raise BodyError("malformed body: expected a JSON object")
    if not isinstance(body.get("messages"), list):
        raise BodyError("malformed body: 'messages' must be a list of chat messages")
    return body


class _HasRaw(Protocol):
    raw: bytes


_Entry = TypeVar("_Entry", bound=_HasRaw)


class _LastPerSession(Generic[_Entry]):
    """The last entry per session, least recently kept first out: at most ``max_sessions``
    entries and ``max_bytes`` of their ``raw`` (an entry over that alone is not kept)."""

    def __init__(self, max_sessions: int, max_bytes: int) -> None:
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._bytes = 0

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, key: str | None) -> _Entry | None:
        return self._entries.get(key) if key is not None else None

    def keep(self, key: str, entry: _Entry) -> None:
        self.drop(key)
        if len(entry.raw) > self._max_bytes:
            return
        self._entries[key] = entry
        self._bytes += len(entry.raw)
        while len(self._entries) > self._max_sessions or self._bytes > self._max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= len(old.raw)

    def drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old.raw)


class BodyCache:
    """Per session, the last body it sent (a bounded LRU by count and by bytes).

    ``parse`` returns a fresh top-level dict and a fresh ``messages`` list the caller may
    change; the message objects in it may be the ones returned for the previous body, so
    they must not be mutated (the engine never mutates messages)."""

    def __init__(self, *, max_sessions: int = 256, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._known = _LastPerSession[_Known](max_sessions, max_bytes)
        self.tail_parses = 0  # how many bodies were parsed by their tail only (for tests)

    def parse(self, key: str | None, raw: bytes) -> dict[str, Any]:
        """Parse ``raw``, reusing ``key``'s previous body when ``raw`` extends it."""
        return self.read(key, raw)[0]

    def read(self, key: str | None, raw: bytes) -> tuple[dict[str, Any], int]:
        """``parse``, and how many leading messages are the very objects of ``key``'s
        previous body (as ``adopt`` left them): 0 when it was parsed whole."""
        known = self._known.get(key)
        if key is not None and known is not None:
            extended = _extend(known, raw)
            if extended is not None:
                self.tail_parses += 1
                self._known.keep(key, extended)
                return _fresh(extended.body), len(known.body["messages"])
        body = parse_whole(raw)
        if key is not None:
            found = _locate(raw, body)
            if found is None:
                self._known.drop(key)
            else:
                self._known.keep(key, _Known(raw, body, found[0], found[1], proved=False))
        return _fresh(body), 0

    def adopt(self, key: str | None, messages: list[Any]) -> None:
        """Reuse ``messages``' objects from now on: the last body's messages, some swapped
        by the caller for equal objects of its own (so the swap is done once, not on every
        later body)."""
        known = self._known.get(key)
        if known is not None and len(messages) == len(known.body["messages"]):
            known.body = {**known.body, "messages": list(messages)}


def _fresh(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["messages"] = list(body["messages"])
    return out


def _extend(known: _Known, raw: bytes) -> _Known | None:
    """``known`` moved on to ``raw`` when ``raw`` is ``known``'s head + a tail + its suffix."""
    old = known.raw
    suffix = memoryview(old)[known.suffix :]
    if len(raw) < known.end + len(suffix):
        return None
    if not raw.startswith(memoryview(old)[: known.end]) or not raw.endswith(suffix):
        return None
    if not known.proved:
        if not _proves(known):
            return None
        known.proved = True
    stop = len(raw) - len(suffix)
    tail = raw[known.end : stop].rstrip(_WHITESPACE)
    messages = known.body["messages"]
    items = tail.lstrip(_WHITESPACE)
    if items:
        if messages:
            if not items.startswith(b","):
                return None
            items = items[1:]
        try:
            added = orjson.loads(b"[" + items + b"]")
        except orjson.JSONDecodeError:
            return None
        if not added:
            return None
        body = dict(known.body)
        body["messages"] = [*messages, *added]
    else:
        body = known.body
    return _Known(raw, body, known.end + len(tail), stop, proved=True)


def _locate(raw: bytes, body: dict[str, Any]) -> tuple[int, int] | None:
    """``(end, suffix)`` of ``body``'s ``messages`` in ``raw``, unproved; None when not found.

    The suffix is the last ``]`` such that ``{"messages":[`` + the rest of the document
    parses to ``messages: []`` plus the keys that follow ``messages`` in ``body``."""
    messages = body["messages"]
    if messages and not isinstance(messages[-1], dict):
        return None  # the proof needs a last message the sentinel cannot equal
    keys = list(body)
    after = {k: body[k] for k in keys[keys.index("messages") + 1 :]}
    expected = {"messages": [], **after}
    position = len(raw)
    for _ in range(_MAX_SUFFIX_CANDIDATES):
        position = raw.rfind(b"]", 0, position)
        if position < 0:
            return None
        try:
            rest = orjson.loads(b'{"messages":[' + raw[position:])
        except orjson.JSONDecodeError:
            continue
        if rest == expected:
            end = len(raw[:position].rstrip(_WHITESPACE))
            return end, position
    return None


def _proves(known: _Known) -> bool:
    """True when ``known.end`` is just past the last item of the parsed ``messages``."""
    messages = known.body["messages"]
    comma = b"," if messages else b""
    marked = known.raw[: known.end] + comma + orjson.dumps(_SENTINEL) + known.raw[known.end :]
    try:
        body = orjson.loads(marked)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return False
    got = body["messages"]
    if len(got) != len(messages) + 1 or got[-1] != _SENTINEL:
        return False
    body["messages"] = got[:-1]
    return bool(body == known.body)


# ---------------------------------------------------------------------- encoding


_MAX_DIFFERENT = 16  # earlier positions holding another object before a whole encode

_Part = bytes | memoryview


_STARTS_KEPT = 64  # trailing items of a body whose start is remembered
_SEPARATE = 8  # a run this short is encoded item by item, so each one's start is known


@attrs.define
class _Encoded:
    """A session's last encoded body: its ``messages`` (a copy), the JSON, where the
    ``messages`` array is in it (``start``, ``stop``), and where items ``first`` on start in
    the array (``starts``, from its "[": the last item's always, and those of the last few
    encoded in short runs)."""

    messages: list[Any]
    raw: bytes
    start: int
    stop: int
    first: int
    starts: list[int]


class BodyEncoder:
    """Per session, the last body encoded for the upstream (a bounded LRU by count and by
    bytes), so the next body's messages cost only what is new.

    ``encode(key, body)`` is ``orjson.dumps(body)``, byte for byte. The prepared view a
    session sends grows by appending: its earlier messages are the very objects encoded last
    time (the engine and the proxy never change a message object once made, as
    ``BodyCache`` relies on too), so their JSON is reused and only the appended messages are
    encoded. The last message encoded may be another object the next time: the engine sends
    the final user message with the turn's recall block on a copy, and the view it keeps
    holds it without (DESIGN §9b), so the JSON is reused up to where that message began and
    it is encoded again with what follows; likewise a message a few positions back (the
    block stays on the turn's user message through the turn's tool loop, and the next turn
    shows that message without it): where each of the last items encoded began is known,
    and the first one whose bytes changed is encoded again with all after it. Any other
    earlier position holding another object is reused only when that object encodes to the
    same bytes (the engine rebuilds a few small messages each turn, equal to the last ones);
    more than a few such positions, a shorter list, or a change where no start is known,
    and the list is encoded whole. The other keys are encoded each time (a few small
    values)."""

    def __init__(self, *, max_sessions: int = 256, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._known = _LastPerSession[_Encoded](max_sessions, max_bytes)
        self.reused = 0  # how many encodes reused the last one's JSON (for tests)

    def encode(self, key: str | None, body: Mapping[str, Any]) -> bytes:
        """``orjson.dumps(body)``; ``body["messages"]`` is a list, ``key`` the session."""
        messages = body["messages"]
        before: dict[str, Any] = {}
        after: dict[str, Any] = {}
        side = before
        for name, value in body.items():
            if name == "messages":
                side = after
            else:  # a key orjson refuses fails below, as in a whole encode
                side[name] = value
        head = orjson.dumps(before)[:-1] + (b',"messages":' if before else b'"messages":')
        end = b"," + orjson.dumps(after)[1:] if after else b"}"
        known = self._known.get(key)
        found = _extended(known, messages) if known is not None else None
        if found is None:
            parts, first, starts = _array(messages)
        else:
            parts, first, starts = found
            self.reused += 1
        raw = b"".join((head, *parts, end))
        if key is not None:
            drop = max(0, len(starts) - _STARTS_KEPT)
            encoded = _Encoded(
                list(messages), raw, len(head), len(raw) - len(end), first + drop, starts[drop:]
            )
            self._known.keep(key, encoded)
        return raw


def _items(run: list[Any]) -> tuple[tuple[_Part, ...], int, list[int]]:
    """The JSON of a non-empty ``run`` of items, comma-separated without the brackets, in
    parts; the index in ``run`` from which each item's start is known, and those starts."""
    if len(run) <= _SEPARATE:  # item by item: every start known
        parts: list[_Part] = []
        starts: list[int] = []
        at = 0
        for item in run:
            if parts:
                parts.append(b",")
                at += 1
            starts.append(at)
            encoded = orjson.dumps(item)
            parts.append(encoded)
            at += len(encoded)
        return tuple(parts), 0, starts
    before = orjson.dumps(run[:-1])  # "[a,b]": "a,b" then "," then the last one
    last = orjson.dumps(run[-1])
    return (memoryview(before)[1:-1], b",", last), len(run) - 1, [len(before) - 1]


def _array(messages: list[Any]) -> tuple[tuple[_Part, ...], int, list[int]]:
    """``orjson.dumps(messages)`` in parts, and where its items start (see ``_items``)."""
    if not messages:
        return (b"[]",), 0, []
    parts, first, starts = _items(messages)
    return (b"[", *parts, b"]"), first, [1 + at for at in starts]


def _differ(one: Any, other: Any) -> bool:
    return orjson.dumps(one) != orjson.dumps(other)


def _extended(
    known: _Encoded, messages: list[Any]
) -> tuple[tuple[_Part, ...], int, list[int]] | None:
    """The JSON of ``messages`` in parts, from ``known``'s, when ``messages`` starts with
    what ``known`` encoded but for items from one whose start is known (see ``BodyEncoder``),
    and where its items start; else None."""
    earlier = known.messages
    count = len(earlier)
    if not count or len(messages) < count:
        return None
    keep = count  # how many of the earlier items' JSON is reused
    different = itertools.compress(itertools.count(), map(operator.is_not, messages, earlier))
    for checked, index in enumerate(different):
        if index == count - 1 or _differ(messages[index], earlier[index]):
            if index < known.first:
                return None
            keep = index  # encoded again below, with the ones that follow it
            break
        if checked == _MAX_DIFFERENT:
            return None
    array = memoryview(known.raw)[known.start : known.stop]
    if keep == len(messages):
        return (array,), known.first, known.starts
    prefix: tuple[_Part, ...]
    if keep < count:  # up to where that item began: just past "[" or its comma
        start = known.starts[keep - known.first]
        prefix, kept = (array[:start],), known.starts[: keep - known.first]
    else:
        prefix, start, kept = (array[:-1], b","), len(array), known.starts
    parts, first, starts = _items(messages[keep:])
    moved = [start + at for at in starts]
    if first or not kept:  # the known starts no longer run on into the new ones
        return (*prefix, *parts, b"]"), keep + first, moved
    return (*prefix, *parts, b"]"), known.first, [*kept, *moved]
