"""The messages a turn works on: prefix + [summary] + raw tail, with per-message sizes and
the sticky substitutions shown (docs/design.md §4, §4b, §8)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NewType

import attrs

from ragent_memory.core.chars import Message
from ragent_memory.core.names import SubstitutionKind
from ragent_memory.engine.raw import unequal
from ragent_memory.gates.trim import TrimState

# The three ways to count a message's position. A view index counts in ``View.messages``; a
# history index in the caller's history (from the view's ``head`` on, view index + the view's
# offset); a substitution index counts after the leading system messages (what a sticky
# substitution is keyed by, so a rebuilt system prompt of another length moves none). Only
# ``View`` converts between them.
ViewIndex = NewType("ViewIndex", int)
HistoryIndex = NewType("HistoryIndex", int)
SubstitutionIndex = NewType("SubstitutionIndex", int)


def substitution_index(index: int, prefix_len: int) -> SubstitutionIndex:
    """The substitution index of history ``index`` after ``prefix_len`` system messages (for
    a summary's messages, whose prefix is the one it was written with)."""
    return SubstitutionIndex(index - prefix_len)


def _copy(value: Any) -> Any:
    """A copy of a JSON-like value down to its last dict and list (strings and other leaves
    are shared): an app that decorates what it sends changes neither its history nor what
    later turns send."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


@attrs.frozen
class LeftOut:
    """What the ceiling's step 4 has left out of a view (docs/design.md §4b): the oldest whole turns
    right after the prefix/summary, as raw messages and turns, with the chars they showed and
    their chars as written."""

    messages: int = 0
    turns: int = 0
    shown_chars: int = 0
    raw_chars: int = 0


@attrs.define
class View:
    """The messages a turn works on: prefix + [summary] + raw tail, with per-message sizes.
    The session keeps one per turn and the next turn extends it in place (``grow``) while the
    history before its end is unchanged.

    Positions from ``head`` on map one to one onto the raw history (``index + offset``);
    ``left_out`` says what the ceiling left out between the prefix/summary and ``head``'s raw
    message (``start`` is the raw index after the prefix/summary, left out or not).
    ``show`` replaces a message by its substitution and remembers the caller's original.
    ``total`` (shown) and ``raw_chars`` (the originals of the tail) are kept as running sums.

    ``handed`` holds the copies last handed out, parallel to ``messages[:len(handed)]``;
    ``stale`` the indexes among them the view has replaced since (see ``hand_out``).
    """

    messages: list[Message]
    sizes: list[int]
    head: int  # view index of the first raw tail message
    offset: int  # history index = view index + offset, from ``head`` on (use the methods below)
    prefix_len: int  # leading system messages (substitution positions are counted after them)
    generation: int  # the summary shown (0 = none)
    fresh: int = 0  # first index not carried over from the last turn
    originals: dict[int, Message] = attrs.field(factory=dict)
    kinds: dict[int, SubstitutionKind] = attrs.field(factory=dict)
    trim_hint: TrimState | None = None  # gate 1's, kept while the view only grows
    swept: int = 0  # a loop boundary before which the ceiling's rung 1 left nothing to evict
    total: int = 0
    raw_chars: int = 0
    # shown substitutions by kind
    counts: Counter[SubstitutionKind] = attrs.field(factory=Counter)
    handed: list[Message] = attrs.field(factory=list)  # copies last handed out
    stale: set[int] = attrs.field(factory=set)  # indexes of ``handed`` replaced since
    left_out: LeftOut = LeftOut()  # turns the ceiling left out, kept out while the view grows

    @classmethod
    def starting(
        cls,
        messages: list[Message],
        sizes: list[int],
        *,
        start: int,
        prefix_len: int,
        generation: int,
    ) -> View:
        """A view of ``messages`` (the prefix and the summary message) whose tail will start
        at history index ``start``."""
        head = len(messages)
        return cls(messages, sizes, head, start - head, prefix_len, generation, total=sum(sizes))

    # ---------------------------------------------------------------- positions

    def history_index(self, index: int) -> HistoryIndex:
        """The history index of the message at view ``index`` (from ``head`` on)."""
        return HistoryIndex(index + self.offset)

    def view_index(self, index: int) -> ViewIndex:
        """The view index of history ``index`` (one the view shows, from ``head`` on)."""
        return ViewIndex(index - self.offset)

    def substitution_index(self, index: int) -> SubstitutionIndex:
        """The substitution index of history ``index``."""
        return substitution_index(index, self.prefix_len)

    def history_indexes(self, indexes: Iterable[int]) -> list[HistoryIndex]:
        """``history_index`` of each view index, in order."""
        offset = self.offset
        return [HistoryIndex(i + offset) for i in indexes]

    @property
    def tail_start(self) -> HistoryIndex:
        """History index of the first message the tail shows (``head``'s)."""
        return HistoryIndex(self.head + self.offset)

    @property
    def end(self) -> HistoryIndex:
        """Raw length the view was built from."""
        return HistoryIndex(len(self.messages) + self.offset)

    def covered(self) -> range:
        """History indexes the view shows neither as written nor substituted: those the
        summary covers and those the ceiling left out."""
        return range(self.prefix_len, self.tail_start)

    def material(self, head: int, cut: int) -> range:
        """History indexes a compaction of view ``[head, cut)`` summarizes: the messages the
        ceiling left out before ``head`` counted back in."""
        return range(self.start + head - self.head, cut + self.offset)

    def suspects(self) -> list[HistoryIndex]:
        """History indexes of the caller's messages this view showed as written whose copy
        handed out no longer equals them (``recopy_edited``), and of those it showed but
        never handed out."""
        edited = [i for i in self.recopy_edited() if i >= self.head and i not in self.kinds]
        handed_end = max(len(self.handed), self.head) + self.offset
        return [*self.history_indexes(edited), *map(HistoryIndex, range(handed_end, self.end))]

    def raw_sizes_shown(self, raw_sizes: Sequence[int], indexes: Iterable[int]) -> list[int]:
        """The sizes as written (``raw_sizes`` by history index) of view ``indexes``."""
        offset = self.offset
        return [raw_sizes[i + offset] for i in indexes]

    def after_compaction(
        self, cut: int, summary: Message
    ) -> tuple[list[Message], list[int], dict[int, Message], set[int]]:
        """The messages, sizes, originals and trimmed indexes of the view a compaction cut at
        view index ``cut`` leaves: the prefix, ``summary`` (size 0) and ``[cut:]``."""
        prefix_len = self.prefix_len
        messages = [*self.messages[:prefix_len], summary, *self.messages[cut:]]
        sizes = [*self.sizes[:prefix_len], 0, *self.sizes[cut:]]
        shift = prefix_len + 1 - cut
        originals = {i + shift: m for i, m in self.originals.items() if i >= cut}
        trimmed = {i + shift for i in self.indexes("trim") if i >= cut}
        return messages, sizes, originals, trimmed

    # ---------------------------------------------------------------- sums

    @property
    def with_left_out(self) -> int:
        """Chars shown with the turns the ceiling left out counted back in: what the
        compaction trigger is compared with."""
        return self.total + self.left_out.shown_chars

    @property
    def start(self) -> HistoryIndex:
        """History index of the first message after the prefix/summary, left out or not."""
        return HistoryIndex(self.head + self.offset - self.left_out.messages)

    def grow(self, messages: Sequence[Message], sizes: Sequence[int]) -> None:
        """Append raw messages (unsubstituted)."""
        self.messages.extend(messages)
        self.sizes.extend(sizes)
        added = sum(sizes)
        self.total += added
        self.raw_chars += added

    def replace_head(self, index: int, message: Message, size: int) -> None:
        """A leading system message the caller rebuilt."""
        self.total += size - self.sizes[index]
        self.messages[index] = message
        self.sizes[index] = size
        self._replaced(index)

    def show(self, index: int, message: Message, kind: SubstitutionKind, size: int) -> None:
        self.originals.setdefault(index, self.messages[index])
        previous = self.kinds.get(index)
        if previous is not None:
            self.counts[previous] -= 1
        self.counts[kind] += 1
        self.kinds[index] = kind
        self.total += size - self.sizes[index]
        self.messages[index] = message
        self.sizes[index] = size
        self._replaced(index)

    def unshow(self, index: int, size: int) -> None:
        """Show the caller's message at ``index`` as written again (``size``: its chars)."""
        original = self.originals.pop(index, None)
        kind = self.kinds.pop(index, None)
        if original is None or kind is None:
            return
        self.counts[kind] -= 1
        self.total += size - self.sizes[index]
        self.messages[index] = original
        self.sizes[index] = size
        self._replaced(index)

    def _replaced(self, index: int) -> None:
        if index < len(self.handed):
            self.stale.add(index)

    def recopy_edited(self) -> list[int]:
        """Compare the copies handed out with the view and copy again those that differ;
        returns their indexes (the caller edited the copy, or its own message in place:
        ``RawCache.sync`` tells which)."""
        handed, messages = self.handed, self.messages
        differed = unequal(handed, messages[: len(handed)])
        for index in differed:
            handed[index] = _copy(messages[index])
        return differed

    def hand_out(self) -> list[Message]:
        """The copies to hand out: last turn's where the view is unchanged, new copies for
        messages replaced or added since (``recopy_edited`` found the caller's own edits)."""
        handed, messages = self.handed, self.messages
        for index in self.stale:
            handed[index] = _copy(messages[index])
        self.stale.clear()
        handed.extend([_copy(m) for m in messages[len(handed) :]])
        return list(handed)

    def without(self, start: int, count: int, *, raw_chars: int) -> View:
        """A new view without messages ``[start, start + count)`` (the session's own view is
        left as it is); ``raw_chars``: what the removed raw messages measured as written."""
        view = self.copy()
        view.handed, view.stale = list(self.handed), set(self.stale)  # they stay parallel
        view._remove(start, count, raw_chars)
        return view

    def leave_out(self, count: int, *, turns: int, raw_chars: int) -> None:
        """Leave the ``count`` messages after the prefix/summary (``turns`` whole turns) out of
        this view, in place: the next turn grows the view without them (docs/design.md §4b, step 4:
        sticky until a summary covers them). ``raw_chars``: what they measure as written."""
        shown = sum(self.sizes[self.head : self.head + count])
        self._remove(self.head, count, raw_chars)
        left = self.left_out
        self.left_out = LeftOut(
            left.messages + count,
            left.turns + turns,
            left.shown_chars + shown,
            left.raw_chars + raw_chars,
        )

    def _remove(self, start: int, count: int, raw_chars: int) -> None:
        """Remove messages ``[start, start + count)`` in place; every index kept (the
        substitutions, the copies handed out, the trim hint) moves with its message."""
        stop = start + count

        def moved(index: int) -> int:
            return index if index < start else max(start, index - count)

        self.total -= sum(self.sizes[start:stop])
        self.raw_chars -= raw_chars
        del self.messages[start:stop], self.sizes[start:stop], self.handed[start:stop]
        for index in range(start, stop):
            kind = self.kinds.get(index)
            if kind is not None:
                self.counts[kind] -= 1
        # The view's substitutions move: work bounded by what the view shows, not the history.
        self.originals = {
            i - count if i >= stop else i: m
            for i, m in self.originals.items()
            if not start <= i < stop
        }
        self.kinds = {
            i - count if i >= stop else i: k for i, k in self.kinds.items() if not start <= i < stop
        }
        self.stale = {i - count if i >= stop else i for i in self.stale if not start <= i < stop}
        self.head -= max(0, min(self.head, stop) - start)
        self.offset += count
        self.fresh = moved(self.fresh)
        self.swept = moved(self.swept)
        if self.trim_hint is not None and not self.trim_hint.shift(start, count):
            self.trim_hint = None  # gate 1 looks at the whole view again

    def copy(self) -> View:
        return attrs.evolve(
            self,
            messages=list(self.messages),
            sizes=list(self.sizes),
            originals=dict(self.originals),
            kinds=dict(self.kinds),
            counts=Counter(self.counts),
            handed=[],
            stale=set(),
            trim_hint=None,  # the state is the session's view's: a copy must not share it
        )

    @property
    def head_chars(self) -> int:
        """The prefix and the summary message."""
        return sum(self.sizes[: self.head])

    def indexes(self, kind: SubstitutionKind) -> set[int]:
        return {i for i, k in self.kinds.items() if k == kind}
