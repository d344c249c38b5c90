"""Gate 1, trim (docs/design.md §4; Ragent ``AgentContextTrimmer``): above the trim trigger, old results
of evictable tools become placeholders holding the original length, a clipped copy of the call's
input and a recall ref. Only tool-result content changes (never a count, role, id or call), so
no orphan can appear. All replacements are computed before any is applied. ``TrimState`` is
the gate: it takes a view in as the view grows and holds its candidates until the 20% rule
(``worth_it``) lets them apply."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from ragent_memory.core.chars import Message, chars, text_of
from ragent_memory.core.names import SubstitutionKind
from ragent_memory.core.toolloops import ToolLoop, last_user_index, loop_at
from ragent_memory.settings import (
    EVICTED_INPUT_EXCERPT_CHARS,
    KEEP_RECENT_TOOL_LOOPS,
    MIN_TRIM_RECLAIM_RATIO,
)

PLACEHOLDERS = MappingProxyType(
    {
        "en": "[Earlier tool result omitted: {n} chars originally; input: {args}; recall: {ref}]",
        "zh": "[历史工具结果已省略，原长 {n} 字符，原入参 {args}，召回编号 {ref}]",
    }
)


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


@attrs.define
class Shown:
    """A view as gate 1 reads it: ``messages`` and their ``sizes`` with ``pending`` (index ->
    message, size, kind) shown over them; ``originals`` maps indexes shown in another form to
    the caller's message, ``kinds`` says which form ("trim": already a placeholder)."""

    messages: Sequence[Message]
    sizes: Sequence[int]
    originals: Mapping[int, Message] = attrs.field(factory=dict)
    kinds: Mapping[int, SubstitutionKind] = attrs.field(factory=dict)
    pending: Mapping[int, tuple[Message, int, SubstitutionKind]] = attrs.field(factory=dict)

    def at(self, index: int) -> Message:
        shown = self.pending.get(index)
        return self.messages[index] if shown is None else shown[0]

    def reader(self) -> Callable[[int], Message]:
        """``at``, or plain indexing when nothing is pending (the common turn)."""
        return self.at if self.pending else self.messages.__getitem__


class Rebuild(Exception):
    """What was appended makes an earlier loop irregular: look at the whole view again."""


@attrs.define(eq=False)
class TrimState:
    """Gate 1's knowledge of one view, kept from turn to turn while the view only grows at its
    end (docs/design.md §4), so a turn over the trigger looks only at what is new: O(new), not O(view).

    A loop the protection window (the last ``KEEP_RECENT_TOOL_LOOPS`` completed loops before
    the last user message) has left stays outside it while the view only grows, so its
    candidates are found once, when the window leaves it, and kept until a trim applies them.
    ``tail`` holds the loops the window has not left yet. Valid only while nothing but
    appending changed the view: the session drops it on anything else (a compaction, an edit,
    a substitution not made by gate 1, turns left out); a call id appended twice raises
    :class:`Rebuild`."""

    evictable_tools: Collection[str]
    language: str
    ref_for: Callable[[str], str]
    end: int = 0  # view messages looked at
    last_user: int = -1
    open: bool = False  # the last loop's results run to ``end``: more may follow
    ids: set[Any] = attrs.field(factory=set)  # call ids seen
    duplicates: frozenset[Any] = frozenset()
    orphans: set[int] = attrs.field(factory=set)
    unanswered: int = 0  # loops the window left that are not complete
    tail: deque[ToolLoop] = attrs.field(factory=deque)
    candidates: list[tuple[Eviction, int]] = attrs.field(factory=list)  # (eviction, freed)
    odd: int = 0  # loops in ``tail`` that are not complete

    @property
    def irregular(self) -> dict[str, int]:
        """Counts of the oddities seen (empty when the view is regular)."""
        counts = {
            "orphan_results": len(self.orphans),
            "duplicate_call_ids": len(self.duplicates),
            "incomplete_loops": self.unanswered + self.odd,
        }
        return {name: count for name, count in counts.items() if count}

    @property
    def reclaim(self) -> int:
        """What the candidates free."""
        return sum(freed for _, freed in self.candidates)

    def extend(self, view: Shown) -> None:
        """Take in what was appended since the last call (the whole view the first time)."""
        count = len(view.messages)
        if count < self.end:
            raise Rebuild("the view is shorter than what was looked at")
        self._register(view, count)
        start = self.end
        if self.open:
            last = self.tail.pop()  # its results may have continued
            start, self.odd = last.call_index, self.odd - (not last.is_complete)
        self._parse(view, start, count)
        self.end = count
        self._slide_window(view)

    def replaced(self, indexes: Collection[int]) -> None:
        """Follow the view showing other forms at ``indexes`` (§4b rungs 1 and 3): candidates
        there are gone; loops still in the window read the view when they leave it."""
        gone = set(indexes)
        self.candidates = [c for c in self.candidates if c[0].index not in gone]

    def shift(self, start: int, count: int) -> bool:
        """Follow the view losing messages ``[start, start + count)`` (§4b rung 4): positions
        after move back by ``count``. False (drop the state) when anything it holds lies in that
        range or after a position it has not looked at (only a rebuild knows what those held)."""
        stop = start + count
        if count <= 0 or stop > self.end or self.unanswered or self.last_user < stop:
            return count == 0
        if any(start <= i < stop for i in self.orphans) or any(
            e.index < stop for e, _ in self.candidates
        ):
            return False
        if self.tail and self.tail[0].call_index < stop:
            return False

        def back(i: int) -> int:
            return i - count if i >= stop else i

        self.orphans = {back(i) for i in self.orphans}
        self.candidates = [(attrs.evolve(e, index=back(e.index)), f) for e, f in self.candidates]
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

    def due(self, total: int) -> bool:
        """The 20% rule over the candidates."""
        return bool(self.candidates) and worth_it(self.reclaim, total)

    def take(self) -> list[Eviction]:
        """The candidates, now to be applied (``due`` said so): none are left."""
        taken = [e for e, _ in self.candidates]
        self.candidates = []
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

    def _slide_window(self, view: Shown) -> None:
        """Slide the protection window to the last user message; take the loops it left."""
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
        """Old results of evictable tools in ``loop`` (one the window left), as evictions."""
        at, kinds, pending = view.reader(), view.kinds, view.pending
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
            found = evict(message, index, original, arguments, size, self.language, self.ref_for)
            if found is not None:
                self.candidates.append((found, size - chars(found.replacement)))


def worth_it(reclaim_chars: int, total_chars: int) -> bool:
    """The 20% rule: a trim that frees less than 20% of the total is skipped whole."""
    return reclaim_chars >= MIN_TRIM_RECLAIM_RATIO * total_chars
