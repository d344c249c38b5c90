"""Per-session caches that keep ``prepare`` incremental.

The usual app appends to one history and passes the same dicts again every turn. ``RawCache``
remembers the last history by identity (plus the identity of each message's content and tool
calls, so an in-place edit of a field is noticed) and reuses what it computed for unchanged
messages: validation, digest and size. Only new or changed messages are hashed and measured.
"""

from __future__ import annotations

import bisect
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


def _false_positions(flags: list[bool]) -> list[int]:
    """Indexes of the False entries, found at C speed (there are usually none or few)."""
    out: list[int] = []
    index = -1
    while True:
        try:
            index = flags.index(False, index + 1)
        except ValueError:
            return out
        out.append(index)


class RawCache:
    """What the engine knows about the caller's last history, by position."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.contents: list[Any] = []  # each message's content object, to notice edits in place
        self.calls: list[Any] = []  # each message's tool_calls object
        self.digests: list[str] = []
        self.sizes: list[int] = []
        self.changed: list[int] = []  # positions new or changed by the last sync, ascending

    def sync(self, messages: Sequence[Any]) -> None:
        """Adopt ``messages`` as the new history.

        A position is unchanged when it holds the same dict, holding the same content and
        tool-call objects, as on the last call; those comparisons run at C speed (``map``).
        Only new or changed messages are validated, hashed and measured, wherever they are
        (an app that rebuilds its system prompt every turn keeps the rest incremental). On an
        invalid message the cache is left as it was and InvalidMessagesError propagates.
        """
        old = self.messages
        count, limit = len(messages), min(len(messages), len(old))
        moved = _false_positions(list(map(operator.is_, messages[:limit], old[:limit])))
        for index in [*moved, *range(limit, count)]:
            validate_message(messages[index], index)
        contents = list(map(_get, messages, repeat("content")))
        calls = list(map(_get, messages, repeat("tool_calls")))
        edited = _false_positions(
            list(
                map(
                    operator.and_,
                    map(operator.is_, contents[:limit], self.contents[:limit]),
                    map(operator.is_, calls[:limit], self.calls[:limit]),
                )
            )
        )
        for index in edited:
            validate_message(messages[index], index)
        changed = sorted({*moved, *edited, *range(limit, count)})
        digests = self.digests[:limit] + [""] * (count - limit)
        sizes = self.sizes[:limit] + [0] * (count - limit)
        for index in changed:
            digests[index] = digest(messages[index])
            sizes[index] = chars(messages[index])
        self.messages = list(messages)
        self.contents, self.calls = contents, calls
        self.digests, self.sizes, self.changed = digests, sizes, changed

    def unchanged(self, start: int, end: int) -> bool:
        """Every position in ``[start, end)`` exists and was unchanged by the last sync."""
        if end > len(self.messages):
            return False
        at = bisect.bisect_left(self.changed, start)
        return at == len(self.changed) or self.changed[at] >= end


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
        self.prefix_len = 0  # leading system messages (positions are counted after them)
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
        clone.prefix_len = self.prefix_len
        clone.carried = self.carried
        return clone

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def indexes(self, kind: str) -> set[int]:
        return {i for i, k in self.kinds.items() if k == kind}
