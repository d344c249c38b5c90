"""One session's state and the per-turn pipeline (docs/design.md §1, §4, §4b, §5, §8, §9b).

``Session.run`` takes the caller's whole history and returns the view to send plus a
``TurnReport``. Its steps run in this order, each a method below and the one place its concern
lives:

=========  ==================================================================================
sync       the caller's history into ``RawCache`` (by identity; only new or changed
           messages are validated and measured)
finished   a compaction that finished after its caller stopped waiting is applied
verify     the summary is dropped when the history no longer matches what it covers
build      view = leading system msgs + [summary msg] + raw[covered:] with the sticky
           substitutions shown; last turn's tail is reused while the history before its end
           is unchanged
reduce     oversized single tool results / call inputs → head+tail previews (§8)
trim       gate 1 (§4); returns the substitutions plus its ``TrimState`` for later turns
record     new substitutions persisted (originals offloaded), then shown; the state is kept
compact    gate 2 (§5) on the engine's pool, waited at most ``compaction_timeout_s``
ceiling    §4b, while the view is over B (``Ladder``): may add sticky substitutions,
           compact mid-turn, leave the oldest whole turns out (``over_budget``,
           ``dropped_turns``)
recall     §9b (``TurnRecall``), for the current turn's user message: a leading text part on it
           (``recalled``, ``recalled_chars``), searched when the last message is the user's and
           shown again (cut to fit) on the turn's tool-loop calls; ``hidden`` says what is out
           of view
report     the ``TurnReport``
=========  ==================================================================================

Whenever raw messages leave the view (covered by an applied compaction, shown as a placeholder
or a preview, left out by the ceiling) ``Services.on_leave`` receives them, so they can be indexed
off the caller's thread. The engine wraps the pipeline: input normalisation before ``sync``,
then the long-term memory block after the system messages and output post-processing (the
copy handed out, strict alternation) after ``report``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import attrs

from ragent_memory.core.chars import Message, chars
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.core.names import SkipReason
from ragent_memory.engine.compaction import Compactions, Job, Submit, invalidate, state_message
from ragent_memory.engine.ladder import Ladder
from ragent_memory.engine.raw import RawCache, digest, leading_system_count
from ragent_memory.engine.sticky import Sticky
from ragent_memory.engine.trimming import Trimming
from ragent_memory.engine.turn_recall import TurnRecall, block_chars, sizes_as_written
from ragent_memory.engine.view import View
from ragent_memory.gates.cut import CutPlan, plan_cut
from ragent_memory.recall.recaller import Recaller
from ragent_memory.settings import Settings
from ragent_memory.store import Backend, SessionState, Substitution
from ragent_memory.summary.summarize import Summarizer

__all__ = [  # what memory_engine imports from here
    "PreparedContext",
    "Services",
    "Session",
    "TurnReport",
    "View",
    "digest",
    "leading_system_count",
]

log = get_logger(__name__)


# (session_id, user_id, [(raw index, caller's original message)]) of messages leaving the view
LeaveCallback = Callable[[str, "str | None", list[tuple[int, Message]]], None]


@attrs.frozen
class TurnReport:
    """What one ``prepare`` did, in characters (docs/design.md §11)."""

    chars_raw: int  # the whole caller history
    chars_in: int  # the view before the gates (summary + raw tail, nothing substituted)
    chars_out: int  # what is sent, memory block excluded
    trimmed: int  # tool results shown as placeholders
    truncated: int  # messages shown as head/tail previews
    reclaimed_chars: int  # chars saved by placeholders and previews in this view
    compacted: bool  # a summary generation was applied in this call
    skipped_reason: SkipReason | None  # why compaction did not run, when it was considered
    generation: int  # the session's current summary generation, 0 = none
    memory_chars: int  # the long-term memory block, injected after the gates (0 = none)
    duration_ms: float
    over_budget: bool = False  # chars_out > B even after the ceiling (§4b)
    dropped_turns: int = 0  # oldest whole turns left out of the view by the ceiling (§4b)
    recalled: int = 0  # excerpts of earlier conversation shown (§9b)
    recalled_chars: int = 0
    # earlier turns' recall blocks taken off their messages (like a trim, a prefix change)
    recall_evicted: int = 0


@attrs.frozen
class MemoryBlock:
    """The long-term memory block a session shows, and what it was built from."""

    user_id: str
    version: int  # the user's memory version last seen
    generation: int  # the session's summary generation it was built at
    text: str
    fact_ids: tuple[int, ...]


@attrs.frozen
class PreparedContext:
    messages: list[Message]
    report: TurnReport


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


class Session:
    """In-memory state of one session and its turn pipeline. The engine holds ``lock``
    around every use: ``run``, the memory block cache and ``drop_session``'s look at
    ``future``."""

    def __init__(
        self, state: SessionState, subs: dict[str, Substitution], services: Services
    ) -> None:
        settings = self.settings = services.settings
        session_id = state.session_id
        self.lock = threading.Lock()
        self.state = state
        self.services = services
        self.raw = RawCache()
        self.sticky = Sticky(
            session_id, subs, store=services.store, raw=self.raw, ttl_days=settings.offload_ttl_days
        )
        self.trimming = Trimming(session_id, settings, self.sticky)
        self.compactions = Compactions(
            session_id,
            store=services.store,
            submit=services.submit,
            run_kwargs={
                "summarizer": services.summarizer,
                "store": services.store,
                "settings": settings,
                "emit": services.emit,
            },
        )
        self.ladder = Ladder(self)
        self.turn_recall = TurnRecall(session_id, settings, self.raw, services.recaller)
        self.view: View | None = None  # last turn's, extended in place by the next
        self.callers = 0  # calls holding this session (guarded by the engine's sessions lock)
        self.plain = 0  # leading messages the caller last passed as plain chat dicts
        self.last_write: tuple[str, int] | None = None  # the store's, when this was loaded
        self.verified_digest = ""  # covered_digest already checked against ``raw``
        self.returned_generation = state.generation
        self.left_out_stop = 0  # raw indexes below this, left out by the ceiling, were reported
        # The memory block shown, rebuilt at compaction events (``engine.memory``).
        self.memory: MemoryBlock | None = None

    @property
    def session_id(self) -> str:
        return self.state.session_id

    @property
    def future(self) -> Future[SessionState | None] | None:
        """The compaction in flight (None: none)."""
        return self.compactions.future

    @property
    def recall_block(self) -> str:
        """This turn's recall block (§9b), "" for none."""
        return self.turn_recall.block

    @property
    def recall_at(self) -> int:
        """The raw index of the user message the recall block rides on."""
        return self.turn_recall.at

    def is_idle(self) -> bool:
        """Nobody holds it and no compaction of it runs: dropping it from memory loses nothing."""
        if self.callers or not self.lock.acquire(blocking=False):
            return False
        try:
            return not self.compactions.running
        finally:
            self.lock.release()

    def may_wait(self, messages: Sequence[Message]) -> bool:
        """Whether ``run(messages)`` called now could wait on a compaction: False only when
        it provably cannot. The session must be idle (no call holds it, no compaction in
        flight) and ``messages`` the dicts of its last ``run`` (or equal ones) plus new ones
        too small to bring the view past the compaction trigger (the view then only grows
        by what is appended; a view under the trigger is under B as well, so the ceiling's
        mid-turn compaction cannot start either)."""
        if self.callers or self.lock.locked() or self.compactions.running:
            return True
        last, raw = self.view, self.raw
        known = len(raw.messages)
        if last is None or not isinstance(messages, list) or len(messages) < known:
            return True
        if last.end > known:
            return True
        try:
            if messages[:known] != raw.messages:  # the same dicts meet at once
                return True
            grown = sum(raw.sizes[last.end :]) + sum(map(chars, messages[known:]))
        except Exception:  # an odd or invalid message: prepare says what is wrong
            return True
        settings = self.settings
        trigger = min(settings.compact_trigger_chars, settings.context_window_chars)
        return last.with_left_out - block_chars(last, raw.sizes) + grown > trigger

    # -------------------------------------------------------------- the pipeline

    def run(
        self, messages: Sequence[Message], user_id: str | None, *, verify: bool = False
    ) -> tuple[View, dict[str, Any]]:
        """One turn: every step of the module docstring, in order. The caller holds ``lock``.
        The view returned is the session's own (the next turn extends it): copy what you hand
        out; with it, the ``TurnReport`` fields but memory_chars and duration_ms. ``verify``
        compares the whole history by digest, not only by identity."""
        last, self.view = self.view, None  # a failure mid-turn leaves no half-updated view
        self.sticky.dropped = 0
        self._sync(messages, last, verify=verify)
        finished = self.compactions.finished()
        if finished is not None:
            self._apply(finished, user_id)
        self._verify(user_id)
        view, chars_in = self._build(last)
        view, compacted, skipped, dropped_turns = self._gates(view, user_id)
        recall = self.turn_recall.recall(view, user_id, self.state.summary, self.sticky)
        fields = report_fields(view, self, chars_in, (compacted, skipped, dropped_turns), recall)
        self.turn_recall.keep(view, self.sticky)
        return view, fields

    def _gates(self, view: View, user_id: str | None) -> tuple[View, bool, SkipReason | None, int]:
        """reduce → trim → record → compact → ceiling on the view ``_build`` gave. Returns the
        view to send, whether a compaction applied, why one did not (or None), and the whole
        turns the ceiling leaves out."""
        trimming = self.trimming
        new, state = trimming.trim(view, trimming.reduce(view))
        trimming.apply(view, new, state or view.trim_hint, lambda i: self.report_left(user_id, i))
        if any(sub.kind == "trim" for _, sub, _ in new):  # a trim event: kept recall blocks go
            self.turn_recall.evict_earlier(view, self.sticky)
        compacted, skipped = False, None
        if self.settings.summary_enabled:
            skipped = self._compact_if_due(view, user_id)
            if skipped == "history_edited":
                view, _ = self._build(None)  # without the summary it no longer matches
            elif self.state.generation != self.returned_generation:
                compacted = True
                view, _ = self._build(None)  # the hint's indexes belonged to the old view
        self.returned_generation = self.state.generation
        self.view = view  # what the next turn extends: the ceiling's substitutions included
        view, dropped_turns, mid_turn = self.ladder.climb(view, user_id)
        if mid_turn is not None:
            compacted, skipped = compacted or mid_turn == "applied", skipped or mid_turn
        return view, compacted, skipped, dropped_turns

    def rebuild(self) -> View:
        """The view built anew once a generation applied mid-turn (the ceiling's rung 2)."""
        view, _ = self._build(None)
        self.returned_generation = self.state.generation
        self.view = view
        return view

    def _sync(self, messages: Sequence[Message], last: View | None, *, verify: bool) -> None:
        """Take the caller's history: every dict by identity, what the view shows (and the
        copies handed out that no longer equal it) down to their parts; summarized dicts in
        place only before a compaction builds on them, so a turn costs what the view holds
        (docs/design.md §5, §17); with ``verify``, everything by digest."""
        raw, state = self.raw, self.state
        covered = state.covered if state.generation else 0
        suspects = () if last is None else _suspects(last)
        raw.sync(messages, suspects=suspects, check_from=covered)
        if last is None and covered:  # a session loaded from the store: look at all once
            raw.recheck(raw.system_count, covered)
        if verify:
            raw.compare_digests(messages)

    def _apply(self, state: SessionState, user_id: str | None) -> None:
        """Take an applied generation; what it newly covers has left the view."""
        previous = self.state
        self.state = state
        start = previous.covered if previous.generation else state.prefix_len
        stop = min(state.covered, len(self.raw.messages))
        self.leave_view(user_id, range(max(start, self.left_out_stop), stop), state.prefix_len)

    def leave_view(self, user_id: str | None, indexes: range, prefix_len: int) -> None:
        """Raw ``indexes`` leave the view: reported unless substituted (reported back then)."""
        at = self.sticky.at
        self.report_left(user_id, [i for i in indexes if _shown_as_written(at(i, prefix_len))])

    def report_left(self, user_id: str | None, indexes: Sequence[int]) -> None:
        """Report raw messages ``indexes`` as having left the view (``Services.on_leave``)."""
        on_leave = self.services.on_leave
        if on_leave is None or not indexes:
            return
        messages = self.raw.messages
        on_leave(self.session_id, user_id, [(i, messages[i]) for i in indexes if i < len(messages)])

    def _verify(self, user_id: str | None) -> None:
        """Drop the summary when the caller's history no longer matches what it covers:
        by identity first (the covered messages are the very dicts verified before), by
        digest where identity differs (docs/design.md §5)."""
        state, raw = self.state, self.raw
        if not state.generation:
            return
        if (
            self.verified_digest == state.covered_digest
            and raw.unchanged(state.prefix_len, state.covered)
            and raw.system_count == state.prefix_len
        ):
            return
        reason = raw.mismatch(state.prefix_len, state.covered, state.covered_digest)
        if reason is None:
            self.verified_digest = state.covered_digest
            return
        self.state = invalidate(self.services.store, state, user_id, reason)
        self.verified_digest = ""
        self.returned_generation = 0

    def _build(self, last: View | None) -> tuple[View, int]:
        """The view before the gates with sticky substitutions shown, and its total before
        any substitution (``chars_in``). Last turn's view is extended in place when the
        history before its end is unchanged (only rebuilt leading system messages replaced):
        the gates then look only at what is new, and gate 1 keeps its state."""
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
                summary = state_message(state, self.settings.language)
                messages.append(summary)
                sizes.append(chars(summary))
            view = View(
                messages,
                sizes,
                len(messages),
                start - head,
                prefix_len,
                state.generation,
                total=sum(sizes),
            )
            begin = start
        view.fresh = len(view.messages)
        view.grow(raw.messages[begin:], raw.sizes[begin:])
        chars_in = view.head_chars + view.raw_chars + view.left_out.raw_chars
        self.sticky.show_recorded(view, begin)
        return view, chars_in

    def _compact_if_due(self, view: View, user_id: str | None) -> SkipReason | None:
        """Gate 2; returns why a due compaction did not apply, or None (applied, or not due
        because the view is under the trigger)."""
        if self.compactions.running:
            return "in_progress"
        settings = self.settings
        decision = plan_cut(
            view.messages,
            sizes_as_written(view, self.raw.sizes),
            head=view.head,
            settings=settings,
            left_out_chars=view.left_out.shown_chars,
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
        if self.state.generation and self.raw.recheck(self.raw.system_count, self.state.covered):
            self._verify(user_id)  # a summarized dict was edited in place: drop the summary
            return "history_edited"
        return self.compact(view, decision, user_id)

    def compact(self, view: View, decision: CutPlan, user_id: str | None) -> SkipReason | None:
        """Run one planned compaction, waiting at most ``compaction_timeout_s``; returns why
        it did not apply, or None."""
        raw = self.raw
        prefix_len = view.prefix_len
        start, stop = view.start + decision.head - view.head, decision.cut + view.offset
        job = Job(
            previous=self.state,
            user_id=user_id,
            material=tuple((i, raw.messages[i]) for i in range(start, stop)),
            prefix_len=prefix_len,
            new_covered=stop,
            covered_digest=raw.chain(prefix_len, stop),
            plan=decision,
            shown_standing=self.turn_recall.markers.standing_keys(raw.messages[stop:]),
            chars_out=self.ladder.predict(view, decision),
        )
        outcome = self.compactions.start(job, self.settings.compaction_timeout_s)
        if isinstance(outcome, str):
            return outcome
        self._apply(outcome, user_id)
        self.verified_digest = outcome.covered_digest
        return None


def report_fields(
    view: View,
    session: Session,
    chars_in: int,
    gated: tuple[bool, SkipReason | None, int],
    recall: tuple[int, int],
) -> dict[str, Any]:
    """The ``TurnReport``'s fields but the two the engine adds (memory_chars,
    duration_ms): it builds the report once, when they are known. ``gated``: whether a
    compaction applied, why one did not, the whole turns left out; ``recall``: excerpts
    shown and their chars. chars_out is the final view's measured total."""
    total = view.total
    compacted, skipped, dropped_turns = gated
    recalled, recalled_chars = recall
    return dict(
        chars_raw=session.raw.total,
        chars_in=chars_in,
        chars_out=total,
        trimmed=view.counts.get("trim", 0),
        truncated=view.counts.get("truncate", 0),
        # The tail differs from the caller's messages only where something is substituted.
        reclaimed_chars=view.raw_chars - (total - view.head_chars),
        compacted=compacted,
        skipped_reason=skipped,
        generation=session.state.generation,
        over_budget=total > session.settings.context_window_chars,
        dropped_turns=dropped_turns,
        recalled=recalled,
        recalled_chars=recalled_chars,
        recall_evicted=session.sticky.dropped,
    )


def _shown_as_written(sub: Substitution | None) -> bool:
    """Whether a message was shown as the caller wrote it (a recall block on it aside): only
    then does it leave the view when a summary covers it."""
    return sub is None or sub.kind == "recall"


def _suspects(last: View) -> list[int]:
    """Raw positions of the caller's messages last turn's view showed as written whose
    copy handed out no longer equals them (``View.recopy_edited``), and of those it showed
    but never handed out."""
    handed_end = len(last.handed) + last.offset
    return [
        index + last.offset
        for index in last.recopy_edited()
        if index >= last.head and index not in last.kinds
    ] + list(range(max(handed_end, last.head + last.offset), last.end))
