"""What a session knows about the caller's history, by position (docs/design.md §5: identity first,
a digest only where identity differs)."""

from __future__ import annotations

import bisect
import hashlib
import json
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from ragent_memory.core.chars import Message, measured, validate_message
from ragent_memory.core.names import InvalidationReason
from ragent_memory.errors import InvalidMessagesError

_get = dict.get


def digest(message: Mapping[str, Any], index: int | None = None) -> str:
    """A content digest of one message (stable across processes). A message that cannot be
    encoded is an InvalidMessagesError naming ``index`` (validation refuses such messages
    first; this is the backstop)."""
    try:
        encoded = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError) as err:
        raise InvalidMessagesError(index, f"cannot be encoded: {err}") from None
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def chain_digest(digests: Sequence[str]) -> str:
    """One digest over a run of message digests (the covered prefix check)."""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()[:32] if digests else ""


def leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    while count < len(messages) and messages[count].get("role") == "system":
        count += 1
    return count


def unequal(given: list[Any], known: list[Any]) -> list[int]:
    """Positions where two lists of the same length differ (identity first: the usual
    answer, none, is one list comparison)."""
    if given == known:
        return []
    return [i for i, same in enumerate(map(operator.eq, given, known)) if not same]


class RawCache:
    """The caller's history as last seen: each message, its content and tool_calls objects
    (to notice an edit in place), its size and (computed when first needed) its digest.

    Each turn ``sync`` compares every position by dict identity (one list comparison; an
    equal dict the caller rebuilt passes), the content and tool_calls objects of the
    leading system messages, the first message and the positions from ``check_from`` on
    (what the view shows: an edit in place of a dict), and
    the ``suspects`` the session's hand-out check points at by size and digest too (an edit
    inside a content part of a message in view); new messages are validated and measured.
    ``recheck`` looks for edits in place before ``check_from`` (the session asks before a
    compaction may read the history), ``compare_digests`` compares every position by digest
    and size (``verify``)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.contents: list[Any] = []
        self.calls: list[Any] = []
        self.sizes: list[int] = []
        self.digests: list[str | None] = []  # None: not computed yet
        self.total = 0  # sum(sizes)
        self.system_count = 0  # leading system messages
        self.changed: list[int] = []  # positions found new or changed this turn, ascending

    def sync(
        self, messages: Sequence[Any], *, suspects: Sequence[int] = (), check_from: int = 0
    ) -> None:
        """Take ``messages`` as the new history. On an invalid message the cache is left as
        it was and InvalidMessagesError propagates."""
        limit = min(len(messages), len(self.messages))
        given = messages[:limit] if isinstance(messages, list) else list(messages[:limit])
        known = self.messages if limit == len(self.messages) else self.messages[:limit]
        changed = set(unequal(given, known))
        for index in changed:  # before reading their fields
            validate_message(messages[index], index)
        # The system prompt and the first message (the original task, quoted verbatim in
        # every summary, docs/design.md §6) are looked at in place every turn, as the view is.
        head = min(self.system_count + 1, limit)
        changed |= self._in_place(given, range(head), changed)
        changed |= self._in_place(given, range(max(head, min(check_from, limit)), limit), changed)
        changed.update(self._edited(messages, suspects, limit))
        self._take(messages, sorted(changed), limit)

    def recheck(self, start: int, stop: int) -> bool:
        """Whether a kept dict in ``[start, stop)`` was edited in place (its content or
        tool_calls replaced); such positions are taken again, as ``sync`` would."""
        stop = min(stop, len(self.messages))
        edited = sorted(self._in_place(self.messages, range(start, stop), set()))
        if edited:
            found_before = self.changed
            self._take(self.messages, edited, len(self.messages))
            self.changed = sorted({*found_before, *edited})
        return bool(edited)

    def _in_place(self, given: Sequence[Any], where: range, known: set[int]) -> set[int]:
        """Positions in ``where`` whose content or tool_calls object is not the one kept;
        each is validated (those in ``known`` already were)."""
        if not where:
            return set()
        lo, hi = where.start, where.stop
        part = given[lo:hi]
        edited: set[int] = set()
        for name, kept in (("content", self.contents), ("tool_calls", self.calls)):
            now = list(map(_get, part, repeat(name)))
            edited.update(lo + i for i in unequal(now, kept[lo:hi]))
        for index in edited - known:
            validate_message(given[index], index)
        return edited

    def _edited(self, messages: Sequence[Any], suspects: Sequence[int], limit: int) -> list[int]:
        """Suspects below ``limit`` edited inside a part: not the size or digest known."""
        edited = []
        for index in suspects:
            if index < limit:
                message = messages[index]
                known = self.digests[index]
                if measured(message, index) != self.sizes[index] or (
                    known is not None and digest(message) != known
                ):
                    edited.append(index)
        return edited

    def compare_digests(self, messages: Sequence[Any]) -> list[int]:
        """Compare every position with ``messages`` by size and digest too, which also sees
        an edit inside a content part; returns the changed positions (``changed`` keeps what
        ``sync`` found as well)."""
        limit = min(len(messages), len(self.messages))
        changed = self._edited(messages, range(limit), limit)
        found_before = self.changed
        self._take(messages, changed, limit, count=len(self.messages))
        self.changed = sorted({*found_before, *changed})
        return changed

    def _take(
        self, messages: Sequence[Any], changed: list[int], limit: int, count: int | None = None
    ) -> None:
        """Take the changed positions and the new ones ``[limit, count)``; everything is
        measured before anything is kept."""
        count = len(messages) if count is None else count
        added = messages[limit:count]
        added_sizes = [measured(message, index) for index, message in enumerate(added, limit)]
        resized = [measured(messages[i], i) for i in changed]
        own, sizes, digests = self.messages, self.sizes, self.digests
        if limit < len(own):
            self.total -= sum(sizes[limit:])
            del own[limit:], sizes[limit:], digests[limit:]
            del self.contents[limit:], self.calls[limit:]
        for index, size in zip(changed, resized, strict=True):
            message = messages[index]
            own[index] = message
            self.contents[index] = message.get("content")
            self.calls[index] = message.get("tool_calls")
            self.total += size - sizes[index]
            sizes[index] = size
            digests[index] = None
        own.extend(added)
        sizes.extend(added_sizes)
        digests.extend(repeat(None, len(added)))
        self.contents.extend(map(_get, added, repeat("content")))
        self.calls.extend(map(_get, added, repeat("tool_calls")))
        self.total += sum(added_sizes)
        self.system_count = leading_system_count(own)
        self.changed = [*changed, *range(limit, count)]

    def digest_at(self, index: int) -> str:
        known = self.digests[index]
        if known is None:
            known = self.digests[index] = digest(self.messages[index], index)
        return known

    def chain(self, start: int, stop: int) -> str:
        """``chain_digest`` of positions ``[start, stop)``."""
        return chain_digest([self.digest_at(i) for i in range(start, stop)])

    def mismatch(
        self, prefix_len: int, covered: int, covered_digest: str
    ) -> InvalidationReason | None:
        """Why the history no longer matches a summary of ``[prefix_len, covered)`` (None:
        it does)."""
        if len(self.messages) < covered:
            return "history_shorter"
        if leading_system_count(self.messages[:covered]) != prefix_len:
            return "prefix_changed"
        if self.chain(prefix_len, covered) != covered_digest:
            return "history_edited"
        return None

    def unchanged(self, start: int, end: int) -> bool:
        """Every position in ``[start, end)`` exists and no change was found there this turn."""
        if end > len(self.messages):
            return False
        at = bisect.bisect_left(self.changed, start)
        return at == len(self.changed) or self.changed[at] >= end
