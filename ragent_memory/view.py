"""Per-session caches that keep ``prepare`` incremental.

The usual app appends to one history and passes the same dicts again every turn. ``RawCache``
remembers the last history by identity (plus the identity of each message's content and tool
calls, so an in-place edit of a field is noticed) and reuses what it computed for unchanged
messages: validation, digest and size. Only new or changed messages are hashed and measured.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from .chars import Message, chars, validate_message


def digest(message: Mapping[str, Any]) -> str:
    """A content digest of one message (stable across processes)."""
    encoded = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def chain_digest(digests: Sequence[str]) -> str:
    """One digest over a run of message digests (the covered prefix check)."""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:32] if digests else ""


_get = dict.get


def _common_prefix(new: Sequence[Any], old: Sequence[Any], limit: int) -> int:
    """Length of the leading run where ``new[i] is old[i]`` (within ``limit``)."""
    flags = list(map(operator.is_, new[:limit], old[:limit]))
    try:
        return flags.index(False)
    except ValueError:
        return limit


class RawCache:
    """What the engine knows about the caller's last history, by position."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.contents: list[Any] = []  # each message's content object, to notice edits in place
        self.calls: list[Any] = []  # each message's tool_calls object
        self.digests: list[str] = []
        self.sizes: list[int] = []
        self.unchanged = 0  # leading messages unchanged by the last sync

    def sync(self, messages: Sequence[Any]) -> int:
        """Adopt ``messages`` as the new history; returns how many leading messages were
        unchanged (the same dict holding the same content and tool-call objects) since the
        last call. The comparisons run at C speed (``map``); only the rest is validated,
        hashed and measured. On an invalid message the cache is left as it was and
        InvalidMessagesError propagates.
        """
        limit = min(len(messages), len(self.messages))
        same = _common_prefix(messages, self.messages, limit)
        if same:
            head = messages[:same]
            same = min(
                same,
                _common_prefix(list(map(_get, head, repeat("content"))), self.contents, same),
                _common_prefix(list(map(_get, head, repeat("tool_calls"))), self.calls, same),
            )
        fresh = messages[same:]
        for offset, message in enumerate(fresh):
            validate_message(message, same + offset)
        self.messages = list(messages)
        self.contents = self.contents[:same] + [m.get("content") for m in fresh]
        self.calls = self.calls[:same] + [m.get("tool_calls") for m in fresh]
        self.digests = self.digests[:same] + [digest(m) for m in fresh]
        self.sizes = self.sizes[:same] + [chars(m) for m in fresh]
        self.unchanged = same
        return same


class View:
    """The messages a turn works on: prefix + [summary] + raw tail, with per-message sizes.

    Positions from ``head`` on map one to one onto the raw history (``index + offset``).
    ``show`` replaces a message by its substitution and remembers the caller's original.
    """

    def __init__(self, messages: list[Message], sizes: list[int], head: int, offset: int) -> None:
        self.messages = messages
        self.sizes = sizes
        self.head = head
        self.offset = offset
        self.originals: dict[int, Message] = {}
        self.kinds: dict[int, str] = {}
        self.fresh = head  # first index not carried over from the last turn's tail
        self.carried = False  # the view is last turn's, grown at its end

    def show(self, index: int, message: Message, kind: str, size: int) -> None:
        self.originals.setdefault(index, self.messages[index])
        self.kinds[index] = kind
        self.messages[index] = message
        self.sizes[index] = size

    def copy(self) -> View:
        clone = View(list(self.messages), list(self.sizes), self.head, self.offset)
        clone.originals = dict(self.originals)
        clone.kinds = dict(self.kinds)
        clone.fresh = self.fresh
        clone.carried = self.carried
        return clone

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def indexes(self, kind: str) -> set[int]:
        return {i for i, k in self.kinds.items() if k == kind}
