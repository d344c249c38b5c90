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
reduce     oversized single tool results / call inputs → head+tail previews (§8)
trim       gate 1 (§4); returns the substitutions plus a frozen ``TrimHint`` for later turns
record     new substitutions persisted (originals offloaded), then shown; the hint is kept
compact    gate 2 (§5) on the engine's pool, waited at most ``compaction_timeout_s``
ceiling    §4b, while the view is over B: may add sticky substitutions, compact mid-turn,
           leave the oldest whole turns out (``over_budget``, ``dropped_turns``)
recall     §9b, when the last message is the user's: a leading text part on the final user
           message (``recalled``, ``recalled_chars``); ``hidden`` says what is out of view
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
from typing import Any

import attrs

from . import ceiling, compact
from .chars import Message, chars, validate_message
from .errors import RagentMemoryError, StoreError
from .logs import get_logger
from .reduce import reduce
from .settings import Settings
from .store import Backend, SessionState, Substitution, substitution_key
from .summarize import Summarizer
from .trim import find_candidates, trim, worth_it

log = get_logger(__name__)

EventCallback = Callable[[str, dict[str, Any]], None]
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
    """What the session knows about the caller's last history, by position."""

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


def leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    while count < len(messages) and messages[count].get("role") == "system":
        count += 1
    return count


# ------------------------------------------------------------------ the view


@attrs.frozen
class TrimHint:
    """What the last trim learnt, valid while the view only grows at its end: the chars its
    candidates free (evicted or not) and the view index from which protection can still change
    (before it, nothing can become a candidate)."""

    reclaimable_chars: int
    recent_start: int


@attrs.define
class View:
    """The messages a turn works on: prefix + [summary] + raw tail, with per-message sizes.

    Positions from ``head`` on map one to one onto the raw history (``index + offset``).
    ``show`` replaces a message by its substitution and remembers the caller's original.
    """

    messages: list[Message]
    sizes: list[int]
    head: int  # view index of the first raw tail message
    offset: int  # raw index = view index + offset, from ``head`` on
    prefix_len: int  # leading system messages (substitution positions are counted after them)
    fresh: int  # first index not carried over from the last turn's tail
    originals: dict[int, Message] = attrs.field(factory=dict)
    kinds: dict[int, str] = attrs.field(factory=dict)
    trim_hint: TrimHint | None = None  # carried with last turn's tail, else unknown

    @property
    def carried(self) -> bool:
        """The view is last turn's, grown at its end."""
        return self.fresh > self.head

    def show(self, index: int, message: Message, kind: str, size: int) -> None:
        self.originals.setdefault(index, self.messages[index])
        self.kinds[index] = kind
        self.messages[index] = message
        self.sizes[index] = size

    def copy(self) -> View:
        return attrs.evolve(
            self,
            messages=list(self.messages),
            sizes=list(self.sizes),
            originals=dict(self.originals),
            kinds=dict(self.kinds),
        )

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def indexes(self, kind: str) -> set[int]:
        return {i for i, k in self.kinds.items() if k == kind}


@attrs.frozen
class Tail:
    """The tail of the last view as shown, so the next turn only processes what is new."""

    start: int  # raw index of the first tail message
    head: int  # view index of the first tail message
    end: int  # raw length the tail was built from
    messages: list[Message]
    sizes: list[int]
    originals: dict[int, Message]
    kinds: dict[int, str]
    trim_hint: TrimHint | None

    @classmethod
    def of(cls, view: View, end: int, trim_hint: TrimHint | None) -> Tail:
        head = view.head
        return cls(
            head + view.offset,
            head,
            end,
            view.messages[head:],
            view.sizes[head:],
            dict(view.originals),
            dict(view.kinds),
            trim_hint,
        )


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
        self.services = services
        self.settings = services.settings
        self._sizes: dict[str, tuple[Substitution, int]] = {}
        self.tail: Tail | None = None
        self.warned_irregular = False
        self.raw = RawCache()
        self.last_write: tuple[str, int] | None = None  # the store's, when this was loaded
        self.verified_digest = ""  # covered_digest already checked against ``raw``
        self.future: Future[SessionState | None] | None = None
        self.returned_generation = state.generation
        self.left_out = 0  # raw indexes below this, left out by the ceiling, were reported
        # (user_id, memory version, block text) of the last memory block built for this
        # session: rebuilt only when that user's memories change, so the prefix stays stable.
        self.memory: tuple[str, int, str] | None = None

    @property
    def session_id(self) -> str:
        return self.state.session_id

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
        return substitution_key(raw_index - view.prefix_len, self.raw.digests[raw_index])

    # -------------------------------------------------------------- the pipeline

    def run(self, messages: Sequence[Message], user_id: str | None) -> tuple[View, TurnReport]:
        """One turn: every step of the module docstring, in order. The caller holds ``lock``.
        The view returned is the session's own: copy what you hand out."""
        self.raw.sync(messages)
        self._adopt(user_id)
        self._verify(user_id)
        view, chars_in = self._build()
        new, hint = self._trim(view, self._reduce(view))
        hint = self._record(view, new, hint or view.trim_hint, user_id)
        compacted, skipped = False, None
        if self.settings.summary_enabled:
            skipped = self._compact(view, user_id)
            if self.state.generation != self.returned_generation:
                compacted = True
                view, _ = self._build()
                hint = None  # its indexes belong to the view before the summary
        self.returned_generation = self.state.generation
        self.tail = Tail.of(view, len(self.raw.messages), hint)
        view, dropped_turns, mid_turn = self._ceiling(view, user_id)
        if mid_turn is not None:
            compacted, skipped = compacted or mid_turn == "applied", skipped or mid_turn
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
        digests, subs, prefix_len = self.raw.digests, self.subs, state.prefix_len
        stop = min(state.covered, len(digests))
        self._left(
            user_id,
            [
                i
                for i in range(max(start, self.left_out), stop)
                if substitution_key(i - prefix_len, digests[i]) not in subs
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
            and leading_system_count(raw.messages[: state.prefix_len + 1]) == state.prefix_len
        ):
            return  # identity fast path: the covered messages are the very dicts verified before
        reason = None
        if len(raw.messages) < state.covered:
            reason = "history_shorter"
        elif leading_system_count(raw.messages[: state.covered]) != state.prefix_len:
            reason = "prefix_changed"
        elif chain_digest(raw.digests[state.prefix_len : state.covered]) != state.covered_digest:
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

    def _build(self) -> tuple[View, int]:
        """The view before the gates with sticky substitutions shown, and its total before
        any substitution (``chars_in``)."""
        raw = self.raw
        state = self.state
        prefix_len = leading_system_count(raw.messages)
        messages: list[Message] = list(raw.messages[:prefix_len])
        sizes = raw.sizes[:prefix_len]
        start = prefix_len
        if state.generation:
            summary = compact.summary_message(state.summary, self.settings.language)
            messages.append(summary)
            sizes.append(chars(summary))
            start = state.covered
        head = len(messages)
        chars_in = sum(sizes) + sum(raw.sizes[start:])
        # Reuse last turn's tail as shown, when the history before its end is unchanged.
        tail = self.tail
        begin = start
        originals: dict[int, Message] = {}
        kinds: dict[int, str] = {}
        hint = None
        if (
            tail is not None
            and (tail.start, tail.head) == (start, head)
            and raw.unchanged(start, tail.end)
        ):
            messages.extend(tail.messages)
            sizes.extend(tail.sizes)
            originals, kinds, hint = dict(tail.originals), dict(tail.kinds), tail.trim_hint
            begin = tail.end
        fresh = len(messages)
        messages.extend(raw.messages[begin:])
        sizes.extend(raw.sizes[begin:])
        view = View(
            messages,
            sizes,
            head,
            start - head,
            prefix_len,
            fresh,
            originals=originals,
            kinds=kinds,
            trim_hint=hint,
        )
        subs = self.subs
        for raw_index, message_digest in enumerate(raw.digests[begin:], start=begin):
            sub = subs.get(substitution_key(raw_index - prefix_len, message_digest))
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

    def _trim(self, view: View, new: list[_New]) -> tuple[list[_New], TrimHint | None]:
        """Gate 1 over the view as it would be with ``new`` shown. Returns the substitutions
        to record (a trimmed result replaces its pending preview) and what this trim learnt
        for later turns (None: nothing new)."""
        tentative = view.copy()
        for index, sub, _ in new:
            tentative.show(index, sub.message, sub.kind, self.size_of(sub))
        if tentative.total <= self.settings.trim_trigger_chars:
            return new, None
        moved = self._still_not_worth_it(tentative)
        if moved is not None:
            return new, moved  # the common turn: only the recent stretch was looked at
        result = trim(
            tentative.messages,
            trigger_chars=self.settings.trim_trigger_chars,
            evictable_tools=self.settings.evictable_tools,
            language=self.settings.language,
            ref_for=self.ref_for,
            originals=tentative.originals,
            evicted=tentative.indexes("trim"),
            sizes=tentative.sizes,
        )
        left = 0 if result.evictions else result.reclaimable_chars
        hint = TrimHint(left, result.recent_start)
        if result.irregular and not self.warned_irregular:
            self.warned_irregular = True  # once per session: the caller's input, not ours
            log.warning("messages.irregular", session_id=self.session_id, **result.irregular)
        if not result.evictions:
            return new, hint
        evicted = {e.index for e in result.evictions}
        log.info(
            "trim.applied",
            session_id=self.session_id,
            trimmed=len(evicted),
            reclaimed_chars=result.reclaimed_chars,
            chars_in=tentative.total,
            chars_out=tentative.total - result.reclaimed_chars,
        )
        return [n for n in new if n[0] not in evicted] + [
            (
                e.index,
                Substitution(self._key(view, e.index), "trim", e.ref, e.replacement),
                (e.text,),
            )
            for e in result.evictions
        ], hint

    def _still_not_worth_it(self, tentative: View) -> TrimHint | None:
        """Decide the 20% rule from the recent stretch alone, when possible; returns the hint
        moved forward when the trim is skipped, None when the whole view must be looked at.

        After a trim, nothing before its ``recent_start`` can become a candidate, and what the
        candidates there free is known. If the view has only grown at its end since, the
        candidates now are those plus the ones in the stretch from ``recent_start`` on; when
        together they stay under 20%, the trim would change nothing and is skipped without
        scanning the whole view.
        """
        hint = tentative.trim_hint
        if hint is None:
            return None
        start = hint.recent_start
        found = find_candidates(
            tentative.messages[start:],
            evictable_tools=self.settings.evictable_tools,
            language=self.settings.language,
            ref_for=self.ref_for,
            sizes=tentative.sizes[start:],
            originals={i - start: m for i, m in tentative.originals.items() if i >= start},
            evicted={i - start for i in tentative.indexes("trim") if i >= start},
        )
        reclaimable = hint.reclaimable_chars + found.reclaim_chars
        if worth_it(reclaimable, tentative.total):
            return None
        return TrimHint(reclaimable, start + found.recent_start)

    def _record(
        self, view: View, new: list[_New], hint: TrimHint | None, user_id: str | None
    ) -> TrimHint | None:
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
        decision = compact.plan(view.messages, view.sizes, head=view.head, settings=settings)
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

    def _submit(self, view: View, decision: compact.Plan, user_id: str | None) -> str | None:
        """Run one planned compaction on the engine's pool, waiting at most
        ``compaction_timeout_s``; returns why it did not apply, or None."""
        settings = self.settings
        raw = self.raw
        prefix_len = view.prefix_len
        start, stop = decision.head + view.offset, decision.cut + view.offset
        job = compact.Job(
            previous=self.state,
            user_id=user_id,
            material=tuple((i, raw.messages[i]) for i in range(start, stop)),
            prefix_len=prefix_len,
            new_covered=stop,
            covered_digest=chain_digest(raw.digests[prefix_len:stop]),
            plan=decision,
            prefix_chars=sum(view.sizes[:prefix_len]),
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
            return view, 0, None
        settings = self.settings
        turn_start = ceiling.current_turn_start(view.messages, view.head)
        evictions = ceiling.trim_all(
            view.messages,
            view.sizes,
            head=view.head,
            turn_start=turn_start,
            excess=view.total - budget,
            language=settings.language,
            ref_for=self.ref_for,
            originals=view.originals,
            evicted=view.indexes("trim"),
        )
        self._stick(
            view, [(e.index, "trim", e.ref, e.replacement, (e.text,)) for e in evictions], user_id
        )
        mid_turn = None
        if view.total > budget and settings.summary_enabled and self.future is None:
            decision = compact.plan(
                view.messages, view.sizes, head=view.head, settings=settings, mid_turn=True
            )
            mid_turn = (
                decision if isinstance(decision, str) else self._submit(view, decision, user_id)
            )
            if self.state.generation != self.returned_generation:
                mid_turn = "applied"
                view, _ = self._build()
                self.returned_generation = self.state.generation
                self.tail = Tail.of(view, len(self.raw.messages), None)
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
        dropped_turns = 0
        if view.total > budget:
            count, dropped_turns = ceiling.turns_to_leave_out(
                view.messages,
                view.sizes,
                head=view.head,
                turn_start=turn_start,
                excess=view.total - budget,
            )
            view = self._leave_out(view, count, user_id)
        if view.total > budget and view.head > view.prefix_len:
            # Only the summary is left between the system prompt and the current turn:
            # what is sent at last is the system prompt and the current turn (step 5).
            head = view.head - 1
            view = attrs.evolve(
                view,
                messages=view.messages[:head] + view.messages[head + 1 :],
                sizes=view.sizes[:head] + view.sizes[head + 1 :],
                head=head,
                offset=view.offset + 1,
                fresh=max(head, view.fresh - 1),
                originals={i - 1: m for i, m in view.originals.items()},
                kinds={i - 1: k for i, k in view.kinds.items()},
            )
        if view.total > budget:
            log.warning(
                "ceiling.over_budget",
                session_id=self.session_id,
                chars_out=view.total,
                budget_chars=budget,
                dropped_turns=dropped_turns,
            )
        return view, dropped_turns, mid_turn

    def _stick(
        self,
        view: View,
        changes: Sequence[tuple[int, str, str, Message, Sequence[str]]],
        user_id: str | None,
    ) -> None:
        """Record the ceiling's placeholders and previews as sticky substitutions and show
        them; the tail kept for the next turn shows them too, so the prefix stays stable."""
        if not changes:
            return
        new: list[_New] = [
            (index, Substitution(self._key(view, index), kind, ref, message), texts)
            for index, kind, ref, message, texts in changes
        ]
        self._record(view, new, None, user_id)
        self.tail = Tail.of(view, len(self.raw.messages), None)

    def _leave_out(self, view: View, count: int, user_id: str | None) -> View:
        """The view without its ``count`` messages after the prefix/summary; they are
        reported as having left the view (once: ``left_out`` remembers how far)."""
        if count <= 0:
            return view
        head, offset = view.head, view.offset
        first, stop = head + offset, head + offset + count
        digests, prefix_len = self.raw.digests, view.prefix_len
        self._left(
            user_id,
            [
                i
                for i in range(max(first, self.left_out), stop)
                if substitution_key(i - prefix_len, digests[i]) not in self.subs
            ],
        )
        self.left_out = max(self.left_out, stop)
        shift = {i: i - count for i in view.kinds if i >= head + count}
        return attrs.evolve(
            view,
            messages=view.messages[:head] + view.messages[head + count :],
            sizes=view.sizes[:head] + view.sizes[head + count :],
            offset=offset + count,
            fresh=max(head, view.fresh - count),
            originals={shift[i]: m for i, m in view.originals.items() if i in shift},
            kinds={shift[i]: k for i, k in view.kinds.items() if i in shift},
            trim_hint=None,
        )

    def _recall(self, view: View, user_id: str | None) -> tuple[int, int]:
        """DESIGN §9b, the last step: when the last message is the user's, excerpts of what
        ``hidden`` says is out of view go in a leading text part of the final user message.
        Returns (excerpts shown, their chars). Not built yet: nothing is recalled."""
        return 0, 0

    def hidden(self, view: View) -> tuple[range, frozenset[int]]:
        """Raw indexes the view no longer shows as written: those covered by the summary,
        and those shown as a substitution (placeholder or preview)."""
        covered = range(view.prefix_len, view.head + view.offset)
        return covered, frozenset(i + view.offset for i in view.kinds)

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
    ) -> TurnReport:
        raw_sizes = self.raw.sizes
        shown = Counter(view.kinds.values())
        head = view.head
        total = view.total
        return TurnReport(
            chars_raw=sum(raw_sizes),
            chars_in=chars_in,
            chars_out=total,
            trimmed=shown["trim"],
            truncated=shown["truncate"],
            # The tail differs from the caller's messages only where something is substituted.
            reclaimed_chars=sum(raw_sizes[head + view.offset :]) - sum(view.sizes[head:]),
            compacted=compacted,
            skipped_reason=skipped,
            generation=self.state.generation,
            memory_chars=0,
            duration_ms=0.0,
            over_budget=total > self.settings.context_window_chars,
            dropped_turns=dropped_turns,
            recalled=recalled,
            recalled_chars=recalled_chars,
        )
