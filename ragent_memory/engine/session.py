"""One session's state and the per-turn pipeline (DESIGN §1, §4, §4b, §5, §8, §9b).

``Session.run`` takes the caller's whole history and returns the view to send plus a
``TurnReport``. Its steps run in this order, each a method below and the one place its concern
lives:

=========  ==================================================================================
sync       the caller's history into ``RawCache`` (only new or changed messages are
           validated, hashed and measured)
adopt      a compaction that finished after its caller stopped waiting is applied
verify     the summary is dropped when the history no longer matches what it covers
build      view = leading system msgs + [summary msg] + raw[covered:] with the sticky
           substitutions shown; last turn's tail is reused while the history before its end
           is unchanged
quiet      when last turn's view was only grown and no gate below can fire (``_quiet``),
           reduce to ceiling are skipped: the usual turn of an appending app
reduce     oversized single tool results / call inputs → head+tail previews (§8)
trim       gate 1 (§4); returns the substitutions plus its ``TrimState`` for later turns
record     new substitutions persisted (originals offloaded), then shown; the state is kept
compact    gate 2 (§5) on the engine's pool, waited at most ``compaction_timeout_s``
ceiling    §4b, while the view is over B: may add sticky substitutions, compact mid-turn,
           leave the oldest whole turns out (``over_budget``, ``dropped_turns``)
recall     §9b, for the current turn's user message: a leading text part on it
           (``recalled``, ``recalled_chars``), searched when the last message is the user's and
           shown again (cut to fit) on the turn's tool-loop calls; ``hidden`` says what is out
           of view
report     the ``TurnReport``
=========  ==================================================================================

Whenever raw messages leave the view (covered by an applied compaction, trimmed or truncated
originals, left out by the ceiling) ``Services.on_leave`` receives them, so they can be indexed
off the caller's thread. The engine wraps the pipeline: input normalisation before ``sync``,
then the long-term memory block after the system messages and output post-processing (the
copy handed out, strict alternation) after ``report``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import operator
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from itertools import repeat
from typing import Any, NamedTuple

import attrs

from ragent_memory.core.chars import Message, chars, measured, text_of, validate_message
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.core.watched import Flag, watched_copy
from ragent_memory.engine import compaction as compact
from ragent_memory.errors import InvalidMessagesError, RagentMemoryError, StoreError
from ragent_memory.gates import ceiling
from ragent_memory.gates.reduce import reduce
from ragent_memory.gates.trim import Eviction, Rebuild, Shown, TrimState
from ragent_memory.recall.search import Recalled, Recaller
from ragent_memory.settings import Settings
from ragent_memory.store import Backend, SessionState, Substitution, substitution_key
from ragent_memory.summary.summarize import Summarizer

log = get_logger(__name__)

PART_SEPARATOR = "\n"  # what a consumer that joins a message's text parts puts between them

# (session_id, user_id, [(raw index, caller's original message)]) of messages leaving the view
LeaveCallback = Callable[[str, "str | None", list[tuple[int, Message]]], None]
# Submits a compaction to the engine's pool; None when the engine takes no more work.
Submit = Callable[..., "Future[SessionState | None] | None"]


@attrs.frozen
class TurnReport:
    """What one ``prepare`` did, in characters (DESIGN §11)."""

    chars_raw: int  # the whole caller history
    chars_in: int  # the view before the gates (summary + raw tail, nothing substituted)
    chars_out: int  # what is sent, memory block excluded
    trimmed: int  # tool results shown as placeholders
    truncated: int  # messages shown as head/tail previews
    reclaimed_chars: int  # chars saved by placeholders and previews in this view
    compacted: bool  # a summary generation was applied in this call
    skipped_reason: str | None  # why compaction did not run, when it was considered
    generation: int  # the session's current summary generation, 0 = none
    memory_chars: int  # the long-term memory block, injected after the gates (0 = none)
    duration_ms: float
    over_budget: bool = False  # chars_out > B even after the ceiling (§4b)
    dropped_turns: int = 0  # oldest whole turns left out of the view by the ceiling (§4b)
    recalled: int = 0  # excerpts of earlier conversation shown (§9b)
    recalled_chars: int = 0


@attrs.frozen
class PreparedContext:
    messages: list[Message]
    report: TurnReport


# ------------------------------------------------------------------ digests and the raw cache


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


_get = dict.get
ROLLING_CHECK = 64  # covered positions whose dict is re-checked by identity per turn, in rotation
# ... and whose content and tool_calls objects are: reading them touches each dict, which in a
# long history is far from cache (the dict identity check reads only the list).
ROLLING_PARTS_CHECK = 16


def _window(last: tuple[int, int], size: int, first: int, end: int) -> tuple[int, int]:
    """The ``size`` positions in ``[first, end)`` after the window ``last``, from ``first``
    again when ``last`` reached ``end`` or lies outside."""
    start = last[1] if first <= last[1] < end else first
    return start, min(start + size, end)


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
    """What the session knows about the caller's history, by position: a cursor over an
    append-only list.

    The usual app appends to one list and passes the same dicts again. Each turn, ``sync``
    checks by identity (the dict, its content and its tool_calls objects, at C speed) the
    leading system messages, the dicts from ``hot`` on (the raw messages the view shows), their
    content where the session's hand-out check cannot vouch for it (``suspects``; all of them
    without one) and rotating windows of the earlier positions (``ROLLING_CHECK`` dicts,
    ``ROLLING_PARTS_CHECK`` contents and tool_calls); new messages are validated and
    measured. When a dict in the checked part was replaced, or the history got shorter,
    everything is compared. ``recheck`` compares everything by identity (before a
    compaction), ``recheck(deep=True)`` recomputes every digest and size (on request). Digests
    are computed lazily, when a position's digest is first needed.
    """

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.contents: list[Any] = []  # each message's content object, to notice edits in place
        self.calls: list[Any] = []  # each message's tool_calls object
        self.sizes: list[int] = []
        self.digests: list[str | None] = []  # None: not computed yet
        self.total = 0  # sum(sizes)
        self.system_count = 0  # leading system messages
        self.changed: list[int] = []  # positions found new or changed this turn, ascending
        self._rolling = (0, 0)  # the window of dicts checked last turn
        self._rolling_parts = (0, 0)  # the window of content / tool_calls checked last turn

    def sync(
        self, messages: Sequence[Any], *, hot: int, suspects: Sequence[int] | None = None
    ) -> None:
        """Adopt ``messages`` as the new history (see the class docstring). ``suspects``,
        when given, are the only positions from ``hot`` on whose content may have changed
        in place (the session's hand-out check vouches for the rest); then the rotating
        window runs over every earlier position, the ones shown as a substitution included.
        On an invalid message the cache is left as it was and InvalidMessagesError
        propagates."""
        count, known = len(messages), len(self.messages)
        limit = min(count, known)
        changed = None
        if count >= known:
            prefix = min(self.system_count + 1, limit)
            hot = max(prefix, min(hot, limit))
            if suspects is None:
                moved, edited = self._differences(messages, hot, limit)
                end = hot
            else:
                moved, end = self._shifted(messages, hot, limit), limit
                edited = [] if moved else self._edited(messages, suspects, 0, limit)
            if not moved:  # no dict replaced where the view shows them: nothing shifted
                changed = self._changed_head(messages, prefix)
                start, stop = self._rolling = _window(self._rolling, ROLLING_CHECK, prefix, end)
                changed += self._moved(messages, start, stop)
                start, stop = self._rolling_parts = _window(
                    self._rolling_parts, ROLLING_PARTS_CHECK, prefix, end
                )
                changed += self._edited_in_place(messages, start, stop)
                changed += edited
        if changed is None:  # rebuilt, inserted or removed messages: compare everything
            changed = self._changed(messages, 0, limit)
        self._adopt(messages, sorted(set(changed)) if changed else changed, limit, count)

    def _changed_head(self, messages: Sequence[Any], prefix: int) -> list[int]:
        """``_changed`` over the first ``prefix`` positions (the system prompt and the first
        message): a handful, checked one by one, as ``_changed`` would when one differs."""
        own, contents, calls = self.messages, self.contents, self.calls
        for index in range(prefix):
            message = messages[index]
            if (
                message is not own[index]
                or message.get("content") is not contents[index]
                or message.get("tool_calls") is not calls[index]
            ):
                return self._changed(messages, 0, prefix)
        return []

    def _shifted(self, messages: Sequence[Any], start: int, stop: int) -> list[int]:
        """Positions in ``[start, stop)`` holding a dict not equal to the one seen before,
        looked for only when a sentinel (the first, middle and last known position) holds
        another dict than before: the usual turn costs three identity checks. Equal dicts the
        caller rebuilt are taken as ours (later identity checks then hold again)."""
        own = self.messages
        middle = (start + stop) // 2
        if start >= stop or (
            messages[start] is own[start]
            and messages[middle] is own[middle]
            and messages[stop - 1] is own[stop - 1]
        ):
            return []
        moved = self._moved(messages, start, stop)
        if not moved:
            contents, calls = self.contents, self.calls
            for index in range(start, stop):
                message = messages[index]
                if message is not own[index]:  # equal (``_moved`` compared it): no edit to hide
                    own[index] = message
                    contents[index] = message.get("content")
                    calls[index] = message.get("tool_calls")
        return moved

    def _edited(
        self, messages: Sequence[Any], suspects: Sequence[int], start: int, stop: int
    ) -> list[int]:
        """Suspects in ``[start, stop)`` edited in place: content or tool_calls not the
        objects seen before, or (an edit inside a part) not the size or digest known."""
        edited = []
        for index in suspects:
            if not start <= index < stop:
                continue
            message = messages[index]
            size = measured(message, index)
            if (
                message.get("content") is not self.contents[index]
                or message.get("tool_calls") is not self.calls[index]
                or size != self.sizes[index]
                or (self.digests[index] is not None and digest(message) != self.digests[index])
            ):
                edited.append(index)
        return edited

    def recheck(
        self, messages: Sequence[Any], *, deep: bool = False, suspects: Sequence[int] = ()
    ) -> list[int]:
        """Compare every position with ``messages`` by identity (dict, content, tool_calls),
        and ``suspects`` as ``sync`` does; with ``deep``, every position by digest and size
        too, which also sees an edit inside a content part. Returns the changed positions."""
        limit = min(len(messages), len(self.messages))
        changed = self._changed(messages, 0, limit)
        changed += self._edited(messages, suspects, 0, limit)
        if deep:
            seen = set(changed)
            for index in range(limit):
                if index in seen:
                    continue
                message = messages[index]
                known = self.digests[index]
                if measured(message, index) != self.sizes[index] or (
                    known is not None and digest(message) != known
                ):
                    changed.append(index)
        changed = sorted(set(changed))
        found_before = self.changed
        self._adopt(messages, changed, limit, len(self.messages))
        self.changed = sorted({*found_before, *changed})
        return changed

    def _changed(self, messages: Sequence[Any], start: int, stop: int) -> list[int]:
        moved, edited = self._differences(messages, start, stop)
        return [*moved, *edited]

    def _moved(self, messages: Sequence[Any], start: int, stop: int) -> list[int]:
        """Positions in ``[start, stop)`` holding a dict that is not equal to the one seen
        before (identity first: the common answer, nothing, is one list comparison)."""
        if start >= stop:
            return []
        given = messages[start:stop]
        own = self.messages[start:stop]
        if given == own:
            return []
        moved = _false_positions(list(map(operator.eq, given, own)))
        for index in moved:
            validate_message(given[index], start + index)
        return [start + i for i in moved]

    def _differences(
        self, messages: Sequence[Any], start: int, stop: int
    ) -> tuple[list[int], list[int]]:
        """Positions in ``[start, stop)`` that changed: (replaced by a dict that is not equal,
        edited in place: content or tool_calls not the ones seen before). Each comparison is
        one C-level pass; the common answer, nothing, costs three list comparisons."""
        if start >= stop:
            return [], []
        return self._moved(messages, start, stop), self._edited_in_place(messages, start, stop)

    def _edited_in_place(self, messages: Sequence[Any], start: int, stop: int) -> list[int]:
        """Positions in ``[start, stop)`` whose content or tool_calls object is not the one
        seen before (a dict replaced by an equal one passes: ``_moved`` looks at those)."""
        if start >= stop:
            return []
        given = messages[start:stop]
        contents = list(map(_get, given, repeat("content")))
        calls = list(map(_get, given, repeat("tool_calls")))
        edited: list[int] = []
        if contents != self.contents[start:stop] or calls != self.calls[start:stop]:
            edited = _false_positions(
                list(
                    map(
                        operator.and_,
                        map(operator.eq, contents, self.contents[start:stop]),
                        map(operator.eq, calls, self.calls[start:stop]),
                    )
                )
            )
            for index in edited:
                validate_message(given[index], start + index)
        return [start + i for i in edited]

    def _adopt(self, messages: Sequence[Any], changed: list[int], limit: int, count: int) -> None:
        """Take the changed positions and the new ones ``[limit, count)``; everything is
        validated and measured (one look per message, ``measured``) before anything is
        kept."""
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
        if added:
            own.extend(added)
            sizes.extend(added_sizes)
            digests.extend(repeat(None, len(added)))
            self.contents.extend(map(_get, added, repeat("content")))
            self.calls.extend(map(_get, added, repeat("tool_calls")))
            self.total += sum(added_sizes)
        # The leading system run can only change where something changed at or before its end.
        if limit <= self.system_count or (changed and changed[0] <= self.system_count):
            self.system_count = leading_system_count(own)
        self.changed = [*changed, *range(limit, count)] if changed else list(range(limit, count))

    def digest_at(self, index: int) -> str:
        known = self.digests[index]
        if known is None:
            known = self.digests[index] = digest(self.messages[index], index)
        return known

    def chain(self, start: int, stop: int) -> str:
        """``chain_digest`` of positions ``[start, stop)``."""
        return chain_digest([self.digest_at(i) for i in range(start, stop)])

    def unchanged(self, start: int, end: int) -> bool:
        """Every position in ``[start, end)`` exists and no change was found there this turn."""
        if end > len(self.messages):
            return False
        at = bisect.bisect_left(self.changed, start)
        return at == len(self.changed) or self.changed[at] >= end


def leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    while count < len(messages) and messages[count].get("role") == "system":
        count += 1
    return count


# ------------------------------------------------------------------ the view


@attrs.frozen
class LeftOut:
    """What the ceiling's step 4 has left out of a view (DESIGN §4b): the oldest whole turns
    right after the prefix/summary, as raw messages and turns, with the chars they showed and
    their chars as written."""

    messages: int = 0
    turns: int = 0
    shown_chars: int = 0
    raw_chars: int = 0


class _TurnBlock(NamedTuple):
    """The recall block found for a turn's user message (``at``, a raw index; -1: none yet),
    and what it depends on beyond the view's room: the question, the user whose sessions were
    searched and the store's deletion epoch then (a ``forget`` or ``drop_session`` since, by
    any process, replaces it)."""

    at: int = -1
    text: str = ""
    user_id: str | None = None
    epoch: str | None = None
    found: Recalled = Recalled()


@attrs.define
class View:
    """The messages a turn works on: prefix + [summary] + raw tail, with per-message sizes.
    The session keeps one per turn and the next turn extends it in place (``grow``) while the
    history before its end is unchanged.

    Positions from ``head`` on map one to one onto the raw history (``index + offset``);
    ``left`` says what the ceiling left out between the prefix/summary and ``head``'s raw
    message (``start`` is the raw index after the prefix/summary, left out or not).
    ``show`` replaces a message by its substitution and remembers the caller's original.
    ``total`` (shown) and ``raw_chars`` (the originals of the tail) are kept as running sums.

    ``handed`` holds the copies last handed out, parallel to ``messages[:len(handed)]``;
    ``stale`` the indexes among them the view has replaced since (see ``hand_out``).
    """

    messages: list[Message]
    sizes: list[int]
    head: int  # view index of the first raw tail message
    offset: int  # raw index = view index + offset, from ``head`` on
    prefix_len: int  # leading system messages (substitution positions are counted after them)
    generation: int  # the summary shown (0 = none)
    fresh: int = 0  # first index not carried over from the last turn
    originals: dict[int, Message] = attrs.field(factory=dict)
    kinds: dict[int, str] = attrs.field(factory=dict)
    trim_hint: TrimState | None = None  # gate 1's, kept while the view only grows
    swept: int = 0  # a loop boundary before which the ceiling's rung 1 left nothing to evict
    total: int = 0
    raw_chars: int = 0
    counts: Counter[str] = attrs.field(factory=Counter)  # shown substitutions by kind
    handed: list[Message] = attrs.field(factory=list)  # copies last handed out
    stale: set[int] = attrs.field(factory=set)  # indexes of ``handed`` replaced since
    left: LeftOut = LeftOut()  # turns the ceiling left out, kept out while the view grows
    flag: Flag = attrs.field(factory=Flag)  # raised by any change to a copy in ``handed``
    rolling: int = 0  # where ``untouched``'s rotating window starts next

    @classmethod
    def of(
        cls,
        head_messages: list[Message],
        head_sizes: list[int],
        offset: int,
        prefix_len: int,
        generation: int,
    ) -> View:
        return cls(
            head_messages,
            head_sizes,
            len(head_messages),
            offset,
            prefix_len,
            generation,
            total=sum(head_sizes),
        )

    @property
    def end(self) -> int:
        """Raw length the view was built from."""
        return len(self.messages) + self.offset

    @property
    def with_left_out(self) -> int:
        """Chars shown with the turns the ceiling left out counted back in: what the
        compaction trigger is compared with."""
        return self.total + self.left.shown_chars

    @property
    def start(self) -> int:
        """Raw index of the first message after the prefix/summary, left out or not."""
        return self.head + self.offset - self.left.messages

    @property
    def carried(self) -> bool:
        """The view is last turn's, grown at its end."""
        return self.fresh > self.head

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

    def show(self, index: int, message: Message, kind: str, size: int) -> None:
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

    def _replaced(self, index: int) -> None:
        if index < len(self.handed):
            self.stale.add(index)

    def untouched(self, *, full: bool = False) -> list[int]:
        """Check the copies handed out against the view and copy again those that differ;
        returns their indexes (the caller edited the copy, or its own message in place:
        ``RawCache.sync`` tells which). All of them when ``full`` or when the caller changed
        any copy since (the flag: the usual answer is no); else the last two and a rotating
        window of ``ROLLING_CHECK``, so an edit in place of the caller's own message shown as
        written is caught within view length ÷ ``ROLLING_CHECK`` turns. Each comparison is one
        C-level ``==`` over a slice."""
        handed, messages, flag = self.handed, self.messages, self.flag
        count = len(handed)
        if full or flag.raised:
            flag.raised = False
            spans = [(0, count)]
        else:
            start = self.rolling if self.rolling < count else 0
            stop = min(start + ROLLING_CHECK, count)
            self.rolling = stop
            spans = [(start, stop), (max(stop, count - 2), count)]
        differed = []
        for start, stop in spans:
            given = handed[start:stop]
            if given == messages[start:stop]:
                continue
            differed += [
                start + i
                for i in _false_positions(list(map(operator.eq, given, messages[start:stop])))
            ]
        for index in differed:
            handed[index] = watched_copy(messages[index], flag)
        return differed

    def hand_out(self) -> list[Message]:
        """The copies to hand out: last turn's where the view is unchanged, new copies for
        messages replaced or added since (``untouched`` found the caller's own edits)."""
        handed, messages, flag = self.handed, self.messages, self.flag
        for index in self.stale:
            handed[index] = watched_copy(messages[index], flag)
        self.stale.clear()
        handed.extend([watched_copy(m, flag) for m in messages[len(handed) :]])
        return list(handed)

    def without(self, start: int, count: int, *, raw_chars: int) -> View:
        """A new view without messages ``[start, start + count)`` (the session's own view is
        left as it is); ``raw_chars``: what the removed raw messages measured as written."""
        view = self.copy()
        # The copies handed out stay parallel, and watched by the same flag.
        view.handed, view.stale, view.flag = list(self.handed), set(self.stale), self.flag
        view._remove(start, count, raw_chars)
        return view

    def leave_out(self, count: int, *, turns: int, raw_chars: int) -> None:
        """Leave the ``count`` messages after the prefix/summary (``turns`` whole turns) out of
        this view, in place: the next turn grows the view without them (DESIGN §4b, step 4:
        sticky until a summary covers them). ``raw_chars``: what they measure as written."""
        shown = sum(self.sizes[self.head : self.head + count])
        self._remove(self.head, count, raw_chars)
        left = self.left
        self.left = LeftOut(
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
        self.rolling = moved(self.rolling)
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
            flag=Flag(),
            trim_hint=None,  # the state is the session's view's: a copy must not share it
        )

    @property
    def head_chars(self) -> int:
        """The prefix and the summary message."""
        return sum(self.sizes[: self.head])

    def indexes(self, kind: str) -> set[int]:
        return {i for i, k in self.kinds.items() if k == kind}


_New = tuple[int, Substitution, Sequence[str]]  # (view index, substitution, texts to offload)


@attrs.frozen
class Services:
    """What a session borrows from its engine."""

    settings: Settings
    store: Backend
    summarizer: Summarizer
    submit: Submit
    emit: EventCallback
    on_leave: LeaveCallback | None = None
    recaller: Recaller | None = None


def _position(key: str) -> int:
    return int(key.partition(":")[0])


def _release(store: Backend, session_id: str) -> None:
    try:
        store.release_compaction(session_id)
    except StoreError as err:  # the lease expires on its own
        log.error("compaction.release_failed", session_id=session_id, error=repr(err))


def _leased(
    store: Backend, session_id: str, run: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """``run`` under the session's compaction lease, released before its result is seen (the
    next host to get the session finds the lease free)."""
    try:
        return run(*args, **kwargs)
    finally:
        _release(store, session_id)


# ------------------------------------------------------------------ the session


class Session:
    """In-memory state of one session. The engine holds ``lock`` around every use: ``run``,
    the memory block cache and ``drop_session``'s look at ``future``."""

    def __init__(
        self, state: SessionState, subs: dict[str, Substitution], services: Services
    ) -> None:
        self.lock = threading.Lock()
        self.state = state
        self.subs = subs
        self.sub_positions = {_position(key) for key in subs}  # positions after the prefix
        self.services = services
        self.settings = services.settings
        self._sizes: dict[str, tuple[Substitution, int]] = {}
        self.view: View | None = None  # last turn's, extended in place by the next
        self.warned_irregular = False
        self.raw = RawCache()
        self.users = 0  # calls holding this session (guarded by the engine's sessions lock)
        self.plain = 0  # leading messages the caller last passed as plain chat dicts
        self.last_write: tuple[str, int] | None = None  # the store's, when this was loaded
        self.verified_digest = ""  # covered_digest already checked against ``raw``
        self.future: Future[SessionState | None] | None = None
        self.returned_generation = state.generation
        self.left_out = 0  # raw indexes below this, left out by the ceiling, were reported
        # (user_id, memory version, block text) of the last memory block built for this
        # session: rebuilt only when that user's memories change, so the prefix stays stable.
        self.recall_block = ""  # this turn's recall block (§9b), "" for none
        self.recall_at = -1  # the raw index of the user message it rides on
        # the block found for the turn's user message and what it was found for: the same
        # turn's later calls (a tool loop) show it again while it fits
        self._turn_block = _TurnBlock()
        # (raw index of the last user message or -1, raw length looked at, that message)
        self._turn_user: tuple[int, int, Message | None] = (-1, 0, None)
        # ``hidden``'s substituted raw indexes, and the view's kinds dict, its size and
        # offset they were found for (a dict the view replaces, or grows, finds them again)
        self._shown: tuple[dict[int, str], int, int, frozenset[int]] | None = None
        self.memory: tuple[str, int, str] | None = None

    @property
    def session_id(self) -> str:
        return self.state.session_id

    def is_idle(self) -> bool:
        """Nobody holds the session and no compaction of it is in flight: dropping it from
        memory loses nothing the store does not keep."""
        if self.users or not self.lock.acquire(blocking=False):
            return False
        try:
            return self.future is None
        finally:
            self.lock.release()

    def size_of(self, sub: Substitution) -> int:
        cached = self._sizes.get(sub.key)
        if cached is None or cached[0] is not sub:  # a preview later trimmed has a new sub
            cached = self._sizes[sub.key] = (sub, chars(sub.message))
        return cached[1]

    def ref_for(self, text: str) -> str:
        return self.services.store.ref_for(self.session_id, text)

    def _key(self, view: View, index: int) -> str:
        """The substitution key of the caller's message shown at view ``index``."""
        raw_index = index + view.offset
        return substitution_key(raw_index - view.prefix_len, self.raw.digest_at(raw_index))

    def _sub_at(self, raw_index: int, prefix_len: int) -> Substitution | None:
        position = raw_index - prefix_len
        if position not in self.sub_positions:
            return None  # the common case: no digest needed
        return self.subs.get(substitution_key(position, self.raw.digest_at(raw_index)))

    # -------------------------------------------------------------- the pipeline

    def run(
        self, messages: Sequence[Message], user_id: str | None, *, verify: bool = False
    ) -> tuple[View, dict[str, Any]]:
        """One turn: every step of the module docstring, in order. The caller holds ``lock``.
        The view returned is the session's own (the next turn extends it): copy what you hand
        out; with it, the ``TurnReport`` fields but memory_chars and duration_ms. ``verify`` compares the whole history by digest, not only what is in view."""
        last, self.view = self.view, None  # a failure mid-turn leaves no half-updated view
        self._sync(messages, last, verify=verify)
        self._adopt(user_id)
        self._verify(user_id)
        view, chars_in = self._build(last)
        compacted, skipped = False, None
        if view is last and self._quiet(view):
            self.view = view  # no gate can change it: what each would return, without them
            dropped_turns = view.left.turns
        else:
            view, compacted, skipped, dropped_turns = self._gates(view, user_id)
        recalled, recalled_chars = self._recall(view, user_id)
        return view, self._report(
            view,
            chars_in=chars_in,
            compacted=compacted,
            skipped=skipped,
            dropped_turns=dropped_turns,
            recalled=recalled,
            recalled_chars=recalled_chars,
        )

    def _gates(self, view: View, user_id: str | None) -> tuple[View, bool, str | None, int]:
        """reduce → trim → record → compact → ceiling on the view ``_build`` gave. Returns the
        view to send, whether a compaction applied, why one did not (or None), and the whole
        turns the ceiling leaves out."""
        new, hint = self._trim(view, self._reduce(view))
        view.trim_hint = self._record(view, new, hint or view.trim_hint, user_id)
        compacted, skipped = False, None
        if self.settings.summary_enabled:
            skipped = self._compact(view, user_id)
            if self.state.generation != self.returned_generation:
                compacted = True
                view, _ = self._build(None)  # the hint's indexes belonged to the old view
        self.returned_generation = self.state.generation
        self.view = view  # what the next turn extends: the ceiling's substitutions included
        view, dropped_turns, mid_turn = self._ceiling(view, user_id)
        if mid_turn is not None:
            compacted, skipped = compacted or mid_turn == "applied", skipped or mid_turn
        return view, compacted, skipped, dropped_turns

    def _quiet(self, view: View) -> bool:
        """Whether ``_gates`` would leave ``view`` (last turn's, grown by what was appended)
        as it is and report nothing: no new message oversized (reduce), under the trim
        trigger or gate 1's kept state saying no trim can pay off (``may_pass``), no
        compaction running, adopted or due, within B (the ceiling). The usual turn of an
        appending app; each condition is what the gate itself checks first."""
        settings, total = self.settings, view.total
        if (
            self.future is not None
            or self.state.generation != self.returned_generation  # defensive: not carried then
            or total > settings.context_window_chars
            or (settings.summary_enabled and view.with_left_out > settings.compact_trigger_chars)
        ):
            return False
        sizes, fresh = view.sizes, view.fresh
        if fresh < len(sizes) and max(sizes[fresh:]) > settings.oversized_tool_result_chars:
            return False  # new messages start unsubstituted: reduce would look at this one
        if total > settings.trim_trigger_chars:
            state = view.trim_hint
            return state is not None and not state.may_pass(sizes, total, view.messages)
        return True

    def _sync(self, messages: Sequence[Message], last: View | None, *, verify: bool) -> None:
        """Adopt the caller's history: by identity where the view shows it, everything on
        request, and everything by identity when this turn may compact, so an edit of a
        message the summary covers is caught before a new generation builds on it."""
        state, raw = self.state, self.raw
        hot = state.covered if state.generation else raw.system_count
        suspects = None if last is None else self._suspects(last, full=verify)
        raw.sync(messages, hot=hot, suspects=suspects)
        if verify:
            raw.recheck(messages, deep=True)
        elif self._may_compact(last):
            assert last is not None  # no compaction without last turn's view
            raw.recheck(messages, suspects=self._suspects(last, full=True))

    @staticmethod
    def _suspects(last: View, *, full: bool) -> list[int]:
        """Raw positions of the caller's messages last turn's view showed as written whose
        copy handed out no longer equals them (``View.untouched``: all, with ``full``, else
        where it looks this turn), and of those it showed but never handed out."""
        handed_end = len(last.handed) + last.offset
        return [
            index + last.offset
            for index in last.untouched(full=full)
            if index >= last.head and index not in last.kinds
        ] + list(range(max(handed_end, last.head + last.offset), last.end))

    def _may_compact(self, last: View | None) -> bool:
        raw = self.raw
        if not (self.settings.summary_enabled and self.future is None):
            return False  # no compaction can start this turn
        if last is None or not raw.messages or raw.messages[-1].get("role") != "user":
            return False
        grown = sum(raw.sizes[last.end :]) if last.end <= len(raw.sizes) else 0
        return last.with_left_out + grown > self.settings.compact_trigger_chars

    def _adopt(self, user_id: str | None) -> None:
        """Apply a compaction that finished after its caller stopped waiting."""
        future = self.future
        if future is None or not future.done():
            return
        self.future = None
        crash = future.exception()
        if crash is not None:  # compact.run audits its own failures: this is a bug
            log.error("compaction.crashed", session_id=self.session_id, error=repr(crash))
            return
        state = future.result()
        if state is not None:
            self._apply(state, user_id)

    def _apply(self, state: SessionState, user_id: str | None) -> None:
        """Take an applied generation; what it newly covers has left the view (a message
        shown as a substitution already left it when it was substituted)."""
        previous = self.state
        self.state = state
        start = previous.covered if previous.generation else state.prefix_len
        stop = min(state.covered, len(self.raw.messages))
        prefix_len = state.prefix_len
        self._left(
            user_id,
            [
                i
                for i in range(max(start, self.left_out), stop)
                if self._sub_at(i, prefix_len) is None
            ],
        )

    def _left(self, user_id: str | None, indexes: Sequence[int]) -> None:
        on_leave = self.services.on_leave
        if on_leave is None or not indexes:
            return
        messages = self.raw.messages
        on_leave(self.session_id, user_id, [(i, messages[i]) for i in indexes if i < len(messages)])

    def _verify(self, user_id: str | None) -> None:
        """Drop the summary when the caller's history no longer matches what it covers."""
        state = self.state
        if not state.generation:
            return
        raw = self.raw
        if (
            self.verified_digest == state.covered_digest
            and raw.unchanged(state.prefix_len, state.covered)
            and raw.system_count == state.prefix_len
        ):
            return  # identity fast path: the covered messages are the very dicts verified before
        reason = None
        if len(raw.messages) < state.covered:
            reason = "history_shorter"
        elif leading_system_count(raw.messages[: state.covered]) != state.prefix_len:
            reason = "prefix_changed"
        elif raw.chain(state.prefix_len, state.covered) != state.covered_digest:
            reason = "history_edited"
        if reason is None:
            self.verified_digest = state.covered_digest
            return
        log.warning(
            "compaction.invalidated",
            session_id=state.session_id,
            generation=state.generation,
            reason=reason,
        )
        fresh = SessionState(
            state.session_id, user_id=user_id, last_generation=state.last_generation
        )
        store = self.services.store
        try:
            store.save_session(fresh)
        except StoreError as err:  # the caller's history wins either way; retried on restart
            log.error("session.write_failed", session_id=state.session_id, error=repr(err))
        compact.write_audit(
            store,
            {
                "session_id": state.session_id,
                "user_id": user_id,
                "generation": state.generation,
                "status": "invalidated",
                "reason": reason,
                "summary": state.summary,
                "summary_chars": len(state.summary),
            },
        )
        self.state = fresh
        self.verified_digest = ""
        self.returned_generation = 0

    def _build(self, last: View | None) -> tuple[View, int]:
        """The view before the gates with sticky substitutions shown, and its total before
        any substitution (``chars_in``). Last turn's view is extended in place when the
        history before its end is unchanged (only rebuilt leading system messages replaced)."""
        raw, state = self.raw, self.state
        prefix_len = raw.system_count
        start = state.covered if state.generation else prefix_len
        head = prefix_len + (1 if state.generation else 0)
        if (
            last is not None
            and (last.prefix_len, last.head, last.generation)
            == (prefix_len, head, state.generation)
            and last.start == start
            and raw.unchanged(start, last.end)
        ):
            view, begin = last, last.end
            for index in raw.changed:
                if index >= prefix_len:
                    break
                view.replace_head(index, raw.messages[index], raw.sizes[index])
        else:
            messages = raw.messages[:prefix_len]
            sizes = raw.sizes[:prefix_len]
            if state.generation:
                summary = compact.summary_message(state.summary, self.settings.language)
                messages.append(summary)
                sizes.append(chars(summary))
            view = View.of(messages, sizes, start - head, prefix_len, state.generation)
            begin = start
        view.fresh = len(view.messages)
        view.grow(raw.messages[begin:], raw.sizes[begin:])
        chars_in = view.head_chars + view.raw_chars + view.left.raw_chars
        positions, count = self.sub_positions, len(raw.messages)
        if positions.isdisjoint(range(begin - prefix_len, count - prefix_len)):
            return view, chars_in  # the usual turn: no substitution, no digest needed
        for raw_index in range(begin, count):
            if raw_index - prefix_len not in positions:
                continue
            sub = self._sub_at(raw_index, prefix_len)
            if sub is not None:
                view.show(raw_index - view.offset, sub.message, sub.kind, self.size_of(sub))
        return view, chars_in

    def _reduce(self, view: View) -> list[_New]:
        """Substitutions for oversized messages not shown in another form yet."""
        limit = self.settings.oversized_tool_result_chars
        sizes, kinds = view.sizes, view.kinds
        candidates = [
            i for i in range(view.fresh, len(sizes)) if sizes[i] > limit and i not in kinds
        ]
        if not candidates:
            return []
        reduced = reduce(
            view.messages,
            limit_chars=limit,
            language=self.settings.language,
            ref_for=self.ref_for,
            candidates=candidates,
        )
        return [
            (
                t.index,
                Substitution(self._key(view, t.index), "truncate", t.refs[0], t.replacement),
                t.offloaded,
            )
            for t in reduced.truncations
        ]

    def _trim(self, view: View, new: list[_New]) -> tuple[list[_New], TrimState | None]:
        """Gate 1 over the view as it would be with ``new`` shown. Returns the substitutions
        to record (a trimmed result replaces its pending preview) and the gate's state for
        later turns (None: look at the whole view next time). The view's state is taken
        first, so a failure midway leaves none behind."""
        state, view.trim_hint = view.trim_hint, None
        pending = {index: sub for index, sub, _ in new}
        total = view.total + sum(self.size_of(s) - view.sizes[i] for i, s in pending.items())
        if total <= self.settings.trim_trigger_chars:
            return new, state  # looked at when the view is next over the trigger
        if state is not None and not state.may_pass(view.sizes, total, view.messages):
            return new, state  # no trim can pay off yet: nothing to look at
        state = self._state(view, pending, state)
        if state.due(total):
            reclaimed = state.reclaim
            new = self._trimmed(view, new, state.take(), total, reclaimed)
        return new, state

    def _state(
        self, view: View, pending: Mapping[int, Substitution], state: TrimState | None
    ) -> TrimState:
        """``state`` (when given) extended by what the view gained since, with ``pending``
        shown; else, or when what was appended changes an earlier loop, one built on the
        whole view."""
        shown = Shown(
            view.messages,
            view.sizes,
            view.originals,
            view.kinds,
            {i: (sub.message, self.size_of(sub), sub.kind) for i, sub in pending.items()},
        )
        settings = self.settings
        if state is not None:
            try:
                state.extend(shown)
            except Rebuild:
                state = None
        if state is None:
            state = TrimState(settings.evictable_tools, settings.language, self.ref_for)
            state.extend(shown)
        self._irregular(state)
        return state

    def _irregular(self, state: TrimState) -> None:
        if self.warned_irregular or not (state.odd or state.unanswered or state.orphans):
            return
        irregular = state.irregular
        if irregular:
            self.warned_irregular = True  # once per session: the caller's input, not ours
            log.warning("messages.irregular", session_id=self.session_id, **irregular)

    def _trimmed(
        self,
        view: View,
        new: list[_New],
        evictions: Sequence[Eviction],
        total: int,
        reclaimed_chars: int,
    ) -> list[_New]:
        """``new`` with ``evictions`` added (an evicted result's pending preview dropped)."""
        if not evictions:
            return new
        evicted = {e.index for e in evictions}
        log.info(
            "trim.applied",
            session_id=self.session_id,
            trimmed=len(evicted),
            reclaimed_chars=reclaimed_chars,
            chars_in=total,
            chars_out=total - reclaimed_chars,
        )
        return [n for n in new if n[0] not in evicted] + [
            (
                e.index,
                Substitution(self._key(view, e.index), "trim", e.ref, e.replacement),
                (e.text,),
            )
            for e in evictions
        ]

    def _record(
        self, view: View, new: list[_New], hint: TrimState | None, user_id: str | None
    ) -> TrimState | None:
        """Persist new substitutions (and offload their originals), then show them; returns
        the trim hint to keep. If the store fails, the view stays as it was (a placeholder
        must never point nowhere) and no hint is kept (the next turn looks again)."""
        if not new:
            return hint
        session_id = self.session_id
        try:
            self.services.store.save_substitutions(
                session_id,
                [(sub, texts) for _, sub, texts in new],
                ttl_days=self.settings.offload_ttl_days,
            )
        except RagentMemoryError as err:
            log.error("substitutions.write_failed", session_id=session_id, error=repr(err))
            return None
        for index, sub, _ in new:
            self.subs[sub.key] = sub
            self.sub_positions.add(index + view.offset - view.prefix_len)
            view.show(index, sub.message, sub.kind, self.size_of(sub))
            if sub.kind == "truncate":
                log.info(
                    "reduce.truncated",
                    session_id=session_id,
                    original_chars=chars(view.originals[index]),
                    shown_chars=view.sizes[index],
                )
        self._left(user_id, sorted(index + view.offset for index, _, _ in new))
        return hint

    def _compact(self, view: View, user_id: str | None) -> str | None:
        """Gate 2; returns why a due compaction did not apply, or None (applied, or not due
        because the view is under the trigger)."""
        if self.future is not None:
            return "in_progress"
        settings = self.settings
        if view.with_left_out <= settings.compact_trigger_chars:
            return None  # nothing is due: not a skip (``plan`` would sum the view to say so)
        decision = compact.plan(
            view.messages,
            view.sizes,
            head=view.head,
            settings=settings,
            left_chars=view.left.shown_chars,
        )
        if decision == "below_trigger":
            return None  # nothing is due: not a skip
        if isinstance(decision, str):
            if decision != "last_not_user":
                log.info(
                    "compaction.skipped",
                    session_id=self.session_id,
                    reason=decision,
                    chars=view.total,
                )
            return decision
        return self._submit(view, decision, user_id)

    def _submit(
        self,
        view: View,
        decision: compact.Plan,
        user_id: str | None,
        settle: Callable[[int], int] | None = None,
    ) -> str | None:
        """Run one planned compaction on the engine's pool, waiting at most
        ``compaction_timeout_s``; returns why it did not apply, or None."""
        settings = self.settings
        raw = self.raw
        prefix_len = view.prefix_len
        start, stop = decision.head + view.offset - view.left.messages, decision.cut + view.offset
        job = compact.Job(
            previous=self.state,
            user_id=user_id,
            material=tuple((i, raw.messages[i]) for i in range(start, stop)),
            prefix_len=prefix_len,
            new_covered=stop,
            covered_digest=raw.chain(prefix_len, stop),
            plan=decision,
            prefix_chars=sum(view.sizes[:prefix_len]),
            settle=settle,
        )
        store = self.services.store
        try:
            # One compaction per session across hosts too (DESIGN §10): a lease in the store.
            if not store.claim_compaction(self.session_id):
                log.info("compaction.skipped", session_id=self.session_id, reason="leased")
                return "in_progress"
        except StoreError as err:
            log.error("compaction.lease_failed", session_id=self.session_id, error=repr(err))
            return "failed"
        future = self.services.submit(
            _leased,
            store,
            self.session_id,
            compact.run,
            job,
            summarizer=self.services.summarizer,
            store=store,
            settings=settings,
            emit=self.services.emit,
        )
        if future is None:
            _release(store, self.session_id)
            return "closed"
        self.future = future
        if not wait([future], timeout=settings.compaction_timeout_s).done:
            log.warning(
                "compaction.timeout",
                session_id=self.session_id,
                timeout_s=settings.compaction_timeout_s,
            )
            return "timeout"
        self.future = None
        crash = future.exception()
        if crash is not None:  # compact.run audits its own failures: this is a bug
            log.error("compaction.crashed", session_id=self.session_id, error=repr(crash))
            return "failed"
        state = future.result()
        if state is None:
            return "failed"
        self._apply(state, user_id)
        self.verified_digest = state.covered_digest
        return None

    def _ceiling(self, view: View, user_id: str | None) -> tuple[View, int, str | None]:
        """DESIGN §4b, after the gates: while ``view.total`` > B, the ladder of ``ceiling``.
        Returns the view to send, how many whole turns it leaves out, and what a mid-turn
        compaction did (None: not tried; "applied"; else why it did not apply)."""
        budget = self.settings.context_window_chars
        if view.total <= budget:
            return view, view.left.turns, None
        settings = self.settings
        turn_start = ceiling.current_turn_start(view.messages, view.head)
        evictions, swept = ceiling.trim_all(
            view.messages,
            view.sizes,
            head=max(view.head, min(view.swept, turn_start)),  # before it: nothing left
            turn_start=turn_start,
            excess=view.total - budget + int(budget * ceiling.TRIM_HEADROOM),
            language=settings.language,
            ref_for=self.ref_for,
            originals=view.originals,
            evicted=view.indexes("trim"),
        )
        self._stick(
            view, [(e.index, "trim", e.ref, e.replacement, (e.text,)) for e in evictions], user_id
        )
        if all(view.kinds.get(e.index) == "trim" for e in evictions):  # the store took them
            view.swept = swept
        if evictions and swept != turn_start:
            # Rung 1's placeholders are sticky, so the next turn's gate 1 sees a smaller total
            # and may now pass the 20% rule. Run gate 1 on that view here, as the next turn
            # would: the same history then gives the same prepared messages (idempotent).
            new, hint = self._trim(view, [])
            view.trim_hint = self._record(view, new, hint, user_id)
        mid_turn = None
        if view.total > budget and settings.summary_enabled and self.future is None:
            decision = compact.plan(
                view.messages,
                view.sizes,
                head=view.head,
                settings=settings,
                mid_turn=True,
                left_chars=view.left.shown_chars,
            )
            mid_turn = (
                decision
                if isinstance(decision, str)
                else self._submit(view, decision, user_id, self._settle(view, decision))
            )
            if self.state.generation != self.returned_generation:
                mid_turn = "applied"
                view, _ = self._build(None)
                self.returned_generation = self.state.generation
                self.view = view
                turn_start = ceiling.current_turn_start(view.messages, view.head)
        if view.total > budget:
            previews = ceiling.preview_turn(
                view.messages,
                view.sizes,
                turn_start=turn_start,
                excess=view.total - budget,
                limit_chars=settings.oversized_tool_result_chars,
                language=settings.language,
                ref_for=self.ref_for,
                originals=view.originals,
                evicted=view.indexes("trim"),
            )
            self._stick(
                view,
                [(t.index, "truncate", t.refs[0], t.replacement, t.offloaded) for t in previews],
                user_id,
            )
        if view.total > budget:
            count, turns = ceiling.turns_to_leave_out(
                view.messages,
                view.sizes,
                head=view.head,
                turn_start=turn_start,
                excess=view.total - budget,
            )
            self._leave_out(view, count, turns, user_id)
        dropped_turns = view.left.turns
        if view.total > budget and view.head > view.prefix_len:
            # Only the summary is left between the system prompt and the current turn:
            # what is sent at last is the system prompt and the current turn (step 5).
            view.hand_out()
            view = view.without(view.head - 1, 1, raw_chars=0)
        if view.total > budget:
            log.warning(
                "ceiling.over_budget",
                session_id=self.session_id,
                chars_out=view.total,
                budget_chars=budget,
                dropped_turns=dropped_turns,
            )
        return view, dropped_turns, mid_turn

    def _settle(self, view: View, decision: compact.Plan) -> Callable[[int], int]:
        """What the rest of the ladder will leave of this turn once the mid-turn compaction
        ``decision`` applies, as a function of the summary message's chars: the audit row,
        committed with the generation, records the turn's real chars_out. Mirrors rungs 3-5
        of ``_ceiling`` over a copy of the kept tail (the ladder's rungs are pure)."""
        budget = self.settings.context_window_chars
        cut = decision.cut
        messages, sizes = view.messages[cut:], view.sizes[cut:]
        originals = {i - cut: m for i, m in view.originals.items() if i >= cut}
        evicted = {i - cut for i in view.indexes("trim") if i >= cut}
        prefix_chars = sum(view.sizes[: view.prefix_len])
        limit, language, ref_for = (
            self.settings.oversized_tool_result_chars,
            self.settings.language,
            self.ref_for,
        )

        def settle(summary_chars: int) -> int:
            shown = list(sizes)
            total = prefix_chars + summary_chars + sum(shown)
            if total <= budget:
                return total
            turn_start = ceiling.current_turn_start(messages, 0)
            for t in ceiling.preview_turn(
                messages,
                shown,
                turn_start=turn_start,
                excess=total - budget,
                limit_chars=limit,
                language=language,
                ref_for=ref_for,
                originals=originals,
                evicted=evicted,
            ):
                shown[t.index] = chars(t.replacement)
            total = prefix_chars + summary_chars + sum(shown)
            if total > budget:
                count, _ = ceiling.turns_to_leave_out(
                    messages, shown, head=0, turn_start=turn_start, excess=total - budget
                )
                total -= sum(shown[:count])
            return total - summary_chars if total > budget else total

        return settle

    def _stick(
        self,
        view: View,
        changes: Sequence[tuple[int, str, str, Message, Sequence[str]]],
        user_id: str | None,
    ) -> None:
        """Record the ceiling's placeholders and previews as sticky substitutions and show
        them in the session's view, so the next turn shows them too (a stable prefix); gate 1's
        kept state follows them."""
        if not changes:
            return
        new: list[_New] = [
            (index, Substitution(self._key(view, index), kind, ref, message), texts)
            for index, kind, ref, message, texts in changes
        ]
        hint = view.trim_hint
        if hint is not None and not hint.replaced([change[0] for change in changes]):
            hint = None  # gate 1 looks at the whole view again
        view.trim_hint = self._record(view, new, hint, user_id)

    def _leave_out(self, view: View, count: int, turns: int, user_id: str | None) -> None:
        """Leave the ``count`` messages after the prefix/summary (``turns`` whole turns) out of
        the session's view, so later turns keep them out while it grows (DESIGN §4b step 4);
        they are reported as having left the view (once: ``left_out`` remembers how far)."""
        if count <= 0:
            return
        first = view.head + view.offset
        stop = first + count
        self._left(
            user_id,
            [
                i
                for i in range(max(first, self.left_out), stop)
                if self._sub_at(i, view.prefix_len) is None
            ],
        )
        self.left_out = max(self.left_out, stop)
        view.leave_out(count, turns=turns, raw_chars=sum(self.raw.sizes[first:stop]))
        # Gate 1 on the view as the next turn sees it, as rung 1 does: the smaller total may
        # now pass the 20% rule, and the same history must give the same messages.
        new, hint = self._trim(view, [])
        view.trim_hint = self._record(view, new, hint or view.trim_hint, user_id)

    def _recall(self, view: View, user_id: str | None) -> tuple[int, int]:
        """DESIGN §9b, the last step: excerpts of what ``hidden`` says is out of view, for the
        current turn's user message, go in a leading text part of that message
        (``recall_block`` at raw index ``recall_at``, which the engine puts on its copy: the
        view itself, kept from turn to turn, never holds it), within ``recall_max_chars`` and
        never past B: the block is not part of the view (it never makes the view reach the
        compaction trigger), and what is sent stays within the ceiling (§4b). Room up to the
        trigger only starved recall exactly when the view had grown near it (LoCoMo,
        B = 20,000: 0.548 → 0.617).

        The block is searched for when the last message is the user's. The same turn's later
        calls (its tool loop: the last message is a tool result) show that turn's block again,
        on the same message, while it fits (byte for byte; cut to its leading excerpts when
        the loop's results left less room): the model keeps what was recalled for the
        question it is still answering, and the provider's prompt cache keeps hitting past
        that message. They search nothing: a session without the turn's block (a restart,
        another host) shows none until the next user message.
        Returns (excerpts shown, their chars)."""
        kept, self._turn_block = self._turn_block, _TurnBlock()
        self.recall_block, self.recall_at = "", -1
        recaller, settings, raw = self.services.recaller, self.settings, self.raw.messages
        if recaller is None or not settings.recall_enabled or not raw or not view.messages:
            return 0, 0
        # The block is its own text part before the question; a consumer that reads the
        # message as one text (LangChain's OpenAI conversion, many providers) joins the parts
        # with a newline, so that char is part of what the block may take of B.
        room = min(
            settings.recall_max_chars,
            settings.context_window_chars - view.total - len(PART_SEPARATOR),
        )
        role = raw[-1].get("role")
        if role == "tool":  # the turn's tool loop: the model is called again
            at = self._turn_start(view)
            if (
                at < 0
                or kept[:3] != (at, text_of(raw[at]), user_id)
                or kept.epoch is None
                or kept.epoch != recaller.epoch()  # something forgotten or dropped since
            ):
                return 0, 0
            shown = kept.found.within(room, settings.language)
            self._turn_block = kept._replace(found=shown)
            self.recall_block, self.recall_at = shown.text, at
            recaller.hand_over(self.session_id)  # as a search would: excerpts queued earlier
            return shown.excerpts, len(shown.text)
        if role != "user" or view.messages[-1].get("role") != "user" or room <= 0:
            return 0, 0
        at = len(raw) - 1
        text = text_of(raw[at])
        covered, substituted = self.hidden(view)
        found = recaller.block(
            self.session_id,
            user_id,
            text,
            visible_from=covered.stop,
            shown=substituted,
            max_chars=room,
            known_text=self.state.summary,
        )
        self.recall_block, self.recall_at = found.text, at
        self._turn_block = _TurnBlock(at, text, user_id, recaller.searched_epoch(), found)
        return found.excerpts, len(found.text)

    def _turn_start(self, view: View) -> int:
        """The raw index of the current turn's user message (the last user message) when the
        view shows it as written, else -1. Reads only the messages appended since the last
        call (all of the view's tail when an earlier one changed)."""
        raw = self.raw.messages
        low = view.head + view.offset  # the first raw index the tail shows
        at, seen, message = self._turn_user
        changed = self.raw.changed
        if (
            seen > len(raw)
            or (changed and changed[0] < seen)
            or (at >= 0 and raw[at] is not message)
        ):
            at, seen = -1, low
        for index in range(len(raw) - 1, max(seen, low) - 1, -1):
            if raw[index].get("role") == "user":
                at = index
                break
        self._turn_user = (at, len(raw), raw[at] if at >= 0 else None)
        return at if at >= low else -1

    def hidden(self, view: View) -> tuple[range, frozenset[int]]:
        """Raw indexes the view no longer shows as written: those covered by the summary,
        and those shown as a substitution (placeholder or preview)."""
        covered = range(view.prefix_len, view.head + view.offset)
        kinds, offset, known = view.kinds, view.offset, self._shown
        # ``View.show`` adds to the dict (a kind changed keeps its index), a removal
        # replaces it: the same dict at the same size holds the same indexes.
        if known is not None and known[0] is kinds and known[1:3] == (len(kinds), offset):
            return covered, known[3]
        shown = frozenset(i + offset for i in kinds)
        self._shown = (kinds, len(kinds), offset, shown)
        return covered, shown

    def _report(
        self,
        view: View,
        *,
        chars_in: int,
        compacted: bool,
        skipped: str | None,
        dropped_turns: int,
        recalled: int,
        recalled_chars: int,
    ) -> dict[str, Any]:
        """The ``TurnReport``'s fields but the two the engine adds (memory_chars,
        duration_ms): it builds the report once, when they are known."""
        total = view.total
        return dict(
            chars_raw=self.raw.total,
            chars_in=chars_in,
            chars_out=total,
            trimmed=view.counts.get("trim", 0),
            truncated=view.counts.get("truncate", 0),
            # The tail differs from the caller's messages only where something is substituted.
            reclaimed_chars=view.raw_chars - (total - view.head_chars),
            compacted=compacted,
            skipped_reason=skipped,
            generation=self.state.generation,
            over_budget=total > self.settings.context_window_chars,
            dropped_turns=dropped_turns,
            recalled=recalled,
            recalled_chars=recalled_chars,
        )
