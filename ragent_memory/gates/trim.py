"""Gate 1, trim (DESIGN §4; Ragent ``AgentContextTrimmer``).

Above the trim trigger, old results of evictable tools become short placeholders that keep the
original length, a clipped copy of the call's input and a recall ref. Only tool-result content
changes: the message count, roles, ids and every tool call stay as they are, so no orphan can
appear. All replacements are computed before any is applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from ragent_memory.core.chars import Message, chars, text_of
from ragent_memory.core.toolloops import ToolLoop, last_user_index, loop_at
from ragent_memory.settings import (
    EVICTED_INPUT_EXCERPT_CHARS,
    KEEP_RECENT_TOOL_LOOPS,
    MIN_TRIM_RECLAIM_RATIO,
)

PLACEHOLDERS = {
    "en": "[Earlier tool result omitted: {n} chars originally; input: {args}; recall: {ref}]",
    "zh": "[历史工具结果已省略，原长 {n} 字符，原入参 {args}，召回编号 {ref}]",
}


def placeholder(language: str, original_chars: int, arguments: str, ref: str) -> str:
    """The text that stands in for an evicted tool result."""
    excerpt = arguments
    if len(excerpt) > EVICTED_INPUT_EXCERPT_CHARS:
        excerpt = excerpt[: EVICTED_INPUT_EXCERPT_CHARS - 1] + "…"
    return PLACEHOLDERS[language].format(n=original_chars, args=excerpt, ref=ref)


@attrs.frozen
class Eviction:
    index: int  # position in the view
    replacement: Message
    ref: str
    text: str  # the original result text, offloaded under ``ref``


@attrs.frozen
class TrimResult:
    messages: list[Message]
    evictions: tuple[Eviction, ...] = ()
    reclaimed_chars: int = 0
    skipped_reason: str | None = None
    # What the candidates free (evicted or not): a skipped trim's is under 20% of the total.
    reclaimable_chars: int = 0
    # Provider-level oddities seen (orphan results, duplicate ids, unanswered loops): tolerated,
    # never evicted, reported so the engine can warn once.
    irregular: Mapping[str, int] = attrs.field(factory=dict)


def protected_loops(view: Sequence[Mapping[str, Any]], loops: Sequence[ToolLoop]) -> set[int]:
    """Call indexes of loops the trim must not touch (the rule :class:`TrimState` keeps)."""
    last_user = last_user_index(view)
    if last_user < 0:
        return {loop.call_index for loop in loops}
    protected = {loop.call_index for loop in loops if loop.call_index > last_user}
    protected |= {loop.call_index for loop in loops if not loop.is_complete}
    earlier = [loop for loop in loops if loop.call_index < last_user and loop.is_complete]
    protected |= {loop.call_index for loop in earlier[-KEEP_RECENT_TOOL_LOOPS:]}
    return protected


def evict(
    shown: Message,
    index: int,
    original: Message,
    arguments: str,
    shown_chars: int,
    language: str,
    ref_for: Callable[[str], str],
) -> Eviction | None:
    """The placeholder eviction of the tool result at view ``index`` (``shown`` as the view
    has it, ``original`` the caller's), or None when the placeholder would not be shorter."""
    text = text_of(original)
    ref = ref_for(text)
    replacement = {**shown, "content": placeholder(language, len(text), arguments, ref)}
    if shown_chars - chars(replacement) <= 0:
        return None
    return Eviction(index, replacement, ref, text)


# The shortest a placeholder can be (no digits, input or ref): what a result of ``size``
# chars frees is at most ``size`` minus this.
PLACEHOLDER_FLOOR = {
    language: len(text.format(n="", args="", ref="")) for language, text in PLACEHOLDERS.items()
}


@attrs.frozen
class Candidate:
    """A result gate 1 may evict, its placeholder not made yet (that needs the recall ref,
    a hash of the whole original): it frees at most ``size`` − ``PLACEHOLDER_FLOOR``."""

    index: int
    shown: Message
    original: Message
    arguments: str
    size: int

    def eviction(self, language: str, ref_for: Callable[[str], str]) -> Eviction | None:
        return evict(
            self.shown, self.index, self.original, self.arguments, self.size, language, ref_for
        )


@attrs.define
class Shown:
    """A view as gate 1 reads it: ``messages`` and their ``sizes`` with ``pending`` (index ->
    message, size, kind) shown over them; ``originals`` maps indexes shown in another form to
    the caller's message, ``kinds`` says which form ("trim": already a placeholder)."""

    messages: Sequence[Message]
    sizes: Sequence[int]
    originals: Mapping[int, Message] = attrs.field(factory=dict)
    kinds: Mapping[int, str] = attrs.field(factory=dict)
    pending: Mapping[int, tuple[Message, int, str]] = attrs.field(factory=dict)

    def at(self, index: int) -> Message:
        shown = self.pending.get(index)
        return self.messages[index] if shown is None else shown[0]

    def reader(self) -> Callable[[int], Message]:
        """``at``, or plain indexing when nothing is pending (the common turn)."""
        return self.at if self.pending else self.messages.__getitem__


class Rebuild(Exception):
    """What was appended makes an earlier loop irregular: look at the whole view again."""


# Messages ``protected_from`` reads back from the end, and ``may_pass`` reads anew, at most.
SCAN_LIMIT = 64


def protected_from(messages: Sequence[Message], start: int) -> int:
    """A view index from which no loop can be trimmed, read back from the end at most
    ``SCAN_LIMIT`` messages and never before ``start``: the call of the
    ``KEEP_RECENT_TOOL_LOOPS``-th last loop before the last user message (every loop from it
    on is protected: after the user, among the last completed ones, or incomplete; a tool
    result there belongs to a loop from it on, since results follow their call). ``start``
    when everything from it on is protected; ``len(messages)`` when not found that cheaply."""
    count = len(messages)
    stop = max(start, count - SCAN_LIMIT)
    user = count - 1
    while user >= stop and messages[user].get("role") != "user":
        user -= 1
    found = 0
    for index in range(user - 1, stop - 1, -1):
        message = messages[index]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            found += 1
            if found == KEEP_RECENT_TOOL_LOOPS:
                return index
    return start if stop == start else count


@attrs.define(eq=False)
class TrimState:
    """Gate 1's knowledge of one view, kept from turn to turn while the view only grows at its
    end (DESIGN §4), so a turn over the trigger looks only at what is new.

    The view is split into tool loops as :func:`~.loops.map_loops` does. A loop before the
    protection window (the last ``KEEP_RECENT_TOOL_LOOPS`` completed loops before the last user
    message) stays outside it while the view only grows, so it is *settled* once: its
    candidates are found then and kept, with the chars they free, until a trim applies
    them. ``tail`` holds the loops not settled yet, the window's first on; each ``extend``
    parses only the messages appended since (and the last loop again if its results may
    continue), slides the window and settles what it left.

    Valid only for the view it was built on while nothing but appending changed it: the
    session drops it on anything else (a compaction, an edit, a substitution not made by
    gate 1, turns left out). A call id appended twice raises :class:`Rebuild`.
    """

    evictable_tools: Collection[str]
    language: str
    ref_for: Callable[[str], str]
    end: int = 0  # view messages looked at
    last_user: int = -1
    open: bool = False  # the last loop's results run to ``end``: more may follow
    ids: set[Any] = attrs.field(factory=set)  # call ids seen
    duplicates: frozenset[Any] = frozenset()
    orphans: set[int] = attrs.field(factory=set)
    unanswered: int = 0  # settled loops that are not complete
    tail: deque[ToolLoop] = attrs.field(factory=deque)
    candidates: list[Eviction | Candidate] = attrs.field(factory=list)  # in view order
    reclaim: int = 0  # what the evictions among ``candidates`` free
    bound: int = 0  # at most what the others free (their placeholders are made when needed)
    odd: int = 0  # loops in ``tail`` that are not complete
    # What ``may_pass`` read ahead of ``extend``: (start, stop, results): the messages in
    # ``[start, stop)``, where no loop's results can continue, and among them the results
    # ``_settling`` counts. Later turns read only from ``stop`` on while the view only grows.
    ahead: tuple[int, int, tuple[int, ...]] = (0, 0, ())

    @property
    def irregular(self) -> dict[str, int]:
        """Counts of the oddities seen (empty when the view is regular)."""
        counts = {
            "orphan_results": len(self.orphans),
            "duplicate_call_ids": len(self.duplicates),
            "incomplete_loops": self.unanswered + self.odd,
        }
        return {name: count for name, count in counts.items() if count}

    def extend(self, view: Shown) -> None:
        """Take in what was appended since the last call (the whole view the first time)."""
        count = len(view.messages)
        if count < self.end:
            raise Rebuild("the view is shorter than what was looked at")
        if not self.end:
            self.ahead = (0, 0, ())  # read with no call ids known yet
        self._register(view, count)
        start = self.end
        if self.open:
            last = self.tail.pop()  # its results may have continued
            start, self.odd = last.call_index, self.odd - (not last.is_complete)
        self._parse(view, start, count)
        self.end = count
        self._settle(view)
        # What was read ahead from the tail's new first call on still holds (that call was
        # read as a loop's, since a result is never a call).
        begin, read, results = self.ahead
        start = self.tail[0].call_index if self.tail else self.end
        if begin <= start <= read:
            self.ahead = start, read, tuple(i for i in results if i >= start)
        else:
            self.ahead = start, start, ()

    def replaced(self, indexes: Collection[int]) -> bool:
        """Follow the view showing other forms at ``indexes`` (the ceiling's placeholders and
        previews, §4b rungs 1 and 3): candidates there are gone, and loops not settled yet
        read the view when they settle. Returns False, and the state must be dropped, when a
        candidate there already had its placeholder made (what it freed is not kept)."""
        gone = set(indexes)
        self.ahead = (0, 0, ())  # the sizes there change
        kept: list[Eviction | Candidate] = []
        floor = PLACEHOLDER_FLOOR[self.language]
        for candidate in self.candidates:
            if candidate.index not in gone:
                kept.append(candidate)
            elif isinstance(candidate, Eviction):
                return False
            else:
                self.bound -= candidate.size - floor
        self.candidates = kept
        return True

    def shift(self, start: int, count: int) -> bool:
        """Follow the view losing messages ``[start, start + count)`` (§4b rung 4 leaving the
        oldest turns out): every position kept moves back by ``count``. Returns False, and
        the state must be dropped, when anything it holds lies in that range or after a
        position it has not looked at (only a whole rebuild knows what those held)."""
        stop = start + count
        if count <= 0 or stop > self.end or self.unanswered or self.last_user < stop:
            return count == 0
        if any(start <= i < stop for i in self.orphans) or any(
            c.index < stop for c in self.candidates
        ):
            return False
        if self.tail and self.tail[0].call_index < stop:
            return False

        def back(i: int) -> int:
            return i - count if i >= stop else i

        self.ahead = (0, 0, ())
        self.orphans = {back(i) for i in self.orphans}
        self.candidates = [attrs.evolve(c, index=back(c.index)) for c in self.candidates]
        self.tail = deque(
            attrs.evolve(
                loop,
                call_index=back(loop.call_index),
                result_indexes=tuple(map(back, loop.result_indexes)),
            )
            for loop in self.tail
        )
        self.last_user -= count
        self.end -= count
        return True

    def may_pass(
        self, sizes: Sequence[int], total: int, messages: Sequence[Message] | None = None
    ) -> bool:
        """Whether the 20% rule could pass once what was appended is looked at: a candidate
        frees less than its size, and new ones can only come from the loops not settled yet
        and what was appended, so while those sizes and the candidates' bound stay under 20%
        the trim is skipped without parsing anything (``extend`` catches up later). Given
        the view's ``messages``, what stays protected at its end (``protected_from``) is not
        counted."""
        start = self.tail[0].call_index if self.tail else self.end
        if len(sizes) < self.end:
            return True  # ``extend`` raises Rebuild
        stop = len(sizes) if messages is None else protected_from(messages, start)
        known = self.reclaim + self.bound
        if not worth_it(known + sum(sizes[start:stop]), total):
            return False
        if messages is None or stop - self._unread(start, stop) > SCAN_LIMIT:
            return True
        return worth_it(known + self._settling(messages, sizes, start, stop), total)

    def _unread(self, start: int, stop: int) -> int:
        """Where ``_settling`` starts reading for ``[start, stop)``: after what it read ahead
        on earlier turns, when that still holds."""
        begin, read, _ = self.ahead
        return read if begin == start and read <= stop else start

    def _settling(
        self, messages: Sequence[Message], sizes: Sequence[int], start: int, stop: int
    ) -> int:
        """At most what the loops with a call in ``[start, stop)`` may free when they settle:
        the sizes of their results that answer an evictable tool, in complete loops (read as
        ``loop_at`` reads them; a result elsewhere is an orphan, never evicted). What it read
        up to where no loop's results can continue (a message other than a result follows
        them) is kept in ``ahead``: while the view only grows, later turns read only what is
        new, so the scan is bounded by what is unread (``SCAN_LIMIT``)."""
        evictable, count, at = self.evictable_tools, len(messages), messages.__getitem__
        index = read = self._unread(start, stop)
        found = list(self.ahead[2]) if read > start else []
        kept = len(found)
        while index < stop:
            message = messages[index]
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            if not calls:
                index += 1
                read, kept = index, len(found)
                continue
            loop, index = loop_at(at, index, stop, calls, self.duplicates, set())
            if loop.is_complete:
                names = loop.tool_names
                found += [
                    i
                    for i in loop.result_indexes
                    if names[messages[i]["tool_call_id"]] in evictable
                ]
            if index < count and messages[index].get("role") != "tool":
                read, kept = index, len(found)
        self.ahead = start, read, tuple(found[:kept])
        return sum(map(sizes.__getitem__, found))

    def due(self, total: int) -> bool:
        """The 20% rule over the candidates; placeholders are made only once the bound of
        what they free passes it (most turns over the trigger hash nothing)."""
        if not self.candidates or not worth_it(self.reclaim + self.bound, total):
            return False
        self.resolve()
        return bool(self.candidates) and worth_it(self.reclaim, total)

    def resolve(self) -> None:
        """Make every candidate's placeholder (dropping those that would not be shorter)."""
        if not self.bound:
            return
        resolved: list[Eviction | Candidate] = []
        for candidate in self.candidates:
            if isinstance(candidate, Candidate):
                eviction = candidate.eviction(self.language, self.ref_for)
                if eviction is None:
                    continue
                self.reclaim += candidate.size - chars(eviction.replacement)
                candidate = eviction
            resolved.append(candidate)
        self.candidates, self.bound = resolved, 0

    def take(self) -> list[Eviction]:
        """The candidates, now to be applied (``due`` said so): none are left."""
        self.resolve()
        taken = [c for c in self.candidates if isinstance(c, Eviction)]
        self.candidates, self.reclaim = [], 0
        return taken

    def _register(self, view: Shown, count: int) -> None:
        """Note the call ids appended; the first time, which occur twice (``map_loops``)."""
        at, first = view.reader(), not self.end
        ids = set() if first else self.ids
        duplicates = set()
        for index in range(self.end, count):
            for call in at(index).get("tool_calls") or ():
                call_id = call.get("id")
                if call_id in ids:
                    if not first:
                        raise Rebuild("a call id was appended twice")
                    duplicates.add(call_id)
                ids.add(call_id)
        if first:
            self.ids, self.duplicates = ids, frozenset(duplicates)

    def _parse(self, view: Shown, i: int, n: int) -> None:
        at, duplicates, tail, orphans = view.reader(), self.duplicates, self.tail, self.orphans
        self.open = False
        while i < n:
            message = at(i)
            role = message.get("role")
            calls = message.get("tool_calls") if role == "assistant" else None
            if not calls:
                if role == "tool":
                    orphans.add(i)
                elif role == "user":
                    self.last_user = i
                i += 1
                continue
            loop, j = loop_at(at, i, n, calls, duplicates, orphans)
            tail.append(loop)
            self.odd += not loop.is_complete
            self.open = j == n
            i = j

    def _settle(self, view: Shown) -> None:
        """Slide the protection window to the last user message; settle the loops it left."""
        last_user, tail = self.last_user, self.tail
        if last_user < 0:
            return  # no user message: every loop is protected
        window = last_user
        kept = 0
        for loop in reversed(tail):
            if loop.call_index < last_user and loop.is_complete:
                window, kept = loop.call_index, kept + 1
                if kept == KEEP_RECENT_TOOL_LOOPS:
                    break
        while tail and tail[0].call_index < window:
            loop = tail.popleft()
            if loop.is_complete:
                self._candidates(view, loop)
            else:
                self.unanswered, self.odd = self.unanswered + 1, self.odd - 1

    def _candidates(self, view: Shown, loop: ToolLoop) -> None:
        """Old results of evictable tools in ``loop`` (outside every protected loop), with
        their placeholders."""
        at, kinds, pending = view.reader(), view.kinds, view.pending
        floor = PLACEHOLDER_FLOOR[self.language]
        calls = {c["id"]: c for c in at(loop.call_index).get("tool_calls") or ()}
        for index in loop.result_indexes:
            shown = pending.get(index)
            if kinds.get(index) == "trim" or (shown is not None and shown[2] == "trim"):
                continue
            message = at(index)
            call_id = message["tool_call_id"]
            if loop.tool_names.get(call_id) not in self.evictable_tools:
                continue
            size = view.sizes[index] if shown is None else shown[1]
            original = view.originals.get(index)
            if original is None:
                original = message if shown is None else view.messages[index]
            arguments = (calls[call_id].get("function") or {}).get("arguments") or ""
            bound = size - floor
            if bound > 0:
                self.candidates.append(Candidate(index, message, original, arguments, size))
                self.bound += bound


def trim(
    view: Sequence[Message],
    *,
    trigger_chars: int,
    evictable_tools: Collection[str],
    language: str,
    ref_for: Callable[[str], str],
    originals: Mapping[int, Message] | None = None,
    evicted: Collection[int] = (),
    sizes: Sequence[int] | None = None,
) -> TrimResult:
    """Replace old evictable tool results by placeholders when the view exceeds the trigger.

    ``originals`` maps view indexes already shown in another form (a truncation preview) to
    the caller's message; ``evicted`` lists view indexes that already are placeholders;
    ``sizes``, when given, are ``chars`` of each view message (the engine knows them).
    """
    sizes = sizes if sizes is not None else [chars(m) for m in view]
    current = sum(sizes)
    if current <= trigger_chars:
        return TrimResult(list(view))
    state = TrimState(evictable_tools, language, ref_for)
    state.extend(Shown(view, sizes, originals or {}, dict.fromkeys(evicted, "trim")))
    state.resolve()
    hints = partial(TrimResult, reclaimable_chars=state.reclaim, irregular=state.irregular)
    if not state.candidates:
        return hints(list(view), skipped_reason="nothing_evictable")
    if not worth_it(state.reclaim, current):
        return hints(list(view), skipped_reason="not_worth_it")
    reclaimed = state.reclaim
    evictions = state.take()
    trimmed = list(view)
    for eviction in evictions:
        trimmed[eviction.index] = eviction.replacement
    return hints(trimmed, tuple(evictions), reclaimed)


def worth_it(reclaim_chars: int, total_chars: int) -> bool:
    """The 20% rule: a trim that frees less than 20% of the total is skipped whole."""
    return reclaim_chars >= MIN_TRIM_RECLAIM_RATIO * total_chars
