"""One session's state, and the owner of its turns (docs/design.md §1, §4, §4b, §5, §8, §9b).

``Session.run`` takes the caller's whole history and returns the ``Turn``: the view to send
and what each step decided, from which the engine builds the ``TurnReport``. The steps run in
this order; each looks at the turn and says what it decided, and only the session applies
decisions to its own state (the view the next turn extends, the summary, what was reported
as having left the view):

=========  ==================================================================================
sync       ``RawCache.sync``: the caller's history by identity (only new or changed messages
           validated and measured); a compaction that finished late is applied, the summary
           dropped when the history no longer matches what it covers
build      ``turn.build``: prefix + [summary msg] + raw[covered:], last turn's view extended
           while the history before its end is unchanged; ``Sticky.show_recorded`` shows the
           recorded substitutions
reduce     ``Trimming.reduce``: previews for oversized new messages (§8)
trim       ``Trimming.trim``: gate 1's placeholders (§4) and its ``TrimState``; recorded
           (originals offloaded) and shown by ``Trimming.apply``
compact    ``turn.plan_compaction``: gate 2's cut (§5); run on the engine's pool, waited at
           most ``compaction_timeout_s``
ceiling    ``Ladder`` while the view is over B (§4b): ``lower`` (rungs 0-1),
           ``plan_mid_turn`` (rung 2, run here), ``finish`` (rungs 3-5: previews, whole
           turns left out, the summary dropped from what is sent)
recall     ``TurnRecall.recall`` (§9b): a block of excerpts for the current turn's user
           message, kept on it by ``TurnRecall.keep`` when the view can
report     ``Turn.report``: the ``TurnReport``
=========  ==================================================================================

Messages leaving the view (covered by an applied compaction, shown as a placeholder or a
preview, left out by the ceiling) go on ``Turn.left`` or ``Turn.left_out``; the session
reports them to ``Services.on_leave`` after each step, before recall searches what left. The
engine wraps the turn: input normalisation before ``sync``, then the long-term memory block and
the copy handed out (strict alternation) after ``report``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import attrs

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.core.names import SkipReason
from ragent_memory.engine.compaction import Compactions, Submit, invalidate
from ragent_memory.engine.ladder import Ladder
from ragent_memory.engine.raw import RawCache, digest, leading_system_count
from ragent_memory.engine.sticky import Sticky
from ragent_memory.engine.trimming import Trimming
from ragent_memory.engine.turn import (
    Turn,
    TurnReport,
    build,
    chars_in,
    compaction_job,
    may_pass_trigger,
    plan_compaction,
)
from ragent_memory.engine.turn_recall import TurnRecall, sizes_as_written
from ragent_memory.engine.view import View
from ragent_memory.gates.cut import CutPlan
from ragent_memory.recall.recaller import Recaller
from ragent_memory.settings import Settings
from ragent_memory.store import Backend, SessionState, Substitution
from ragent_memory.summary.summarize import Summarizer

__all__ = [  # what memory_engine imports from here
    "PreparedContext",
    "Services",
    "Session",
    "Turn",
    "TurnReport",
    "View",
    "digest",
    "leading_system_count",
]

log = get_logger(__name__)


# (session_id, user_id, [(raw index, caller's original message)]) of messages leaving the view
LeaveCallback = Callable[[str, "str | None", list[tuple[int, Message]]], None]


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
        self.ladder = Ladder(session_id, settings, self.raw, self.trimming)
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
        if self.callers or self.lock.locked() or self.compactions.running or self.view is None:
            return True
        return may_pass_trigger(self.view, self.raw, messages, self.settings)

    # -------------------------------------------------------------- the turn

    def run(
        self, messages: Sequence[Message], user_id: str | None, *, verify: bool = False
    ) -> Turn:
        """One turn: every step of the module docstring, in order, each deciding on the
        ``Turn``; this applies what they decide to the session. The caller holds ``lock``.
        The turn's view is the session's own (the next turn extends it): copy what you hand
        out. ``verify`` compares the whole history by digest, not only by identity."""
        last, self.view = self.view, None  # a failure mid-turn leaves no half-updated view
        self.sticky.dropped = 0
        self._sync(messages, last, verify=verify)
        finished = self.compactions.finished()
        if finished is not None:
            self._apply(finished, user_id)
        self._verify(user_id)
        view = self._build(last)
        turn = Turn(messages, user_id, view, chars_in(view))
        try:
            self._gates(turn)
        finally:
            self._report(turn)  # before recall searches what left; a failed step's too
        changed = turn.changed_prefix(self.sticky.dropped)
        found = self.turn_recall.recall(
            turn.view, user_id, self.state.summary, self.sticky, changed=changed
        )
        turn.recalled, turn.recalled_chars = found
        turn.measure()
        self.turn_recall.keep(turn.view, self.sticky)
        turn.recall_block, turn.recall_at = self.turn_recall.block, self.turn_recall.at
        turn.chars_raw, turn.generation = self.raw.total, self.state.generation
        turn.recall_evicted, turn.budget = self.sticky.dropped, self.settings.context_window_chars
        return turn

    def _gates(self, turn: Turn) -> None:
        """reduce → trim → compact → ceiling; the view they leave is the one the next turn
        extends (the ceiling's substitutions included)."""
        self._trim(turn)
        if self.settings.summary_enabled:
            self._compact(turn)
        self.returned_generation = self.state.generation
        self.view = turn.view
        self._ceiling(turn)

    def _sync(self, messages: Sequence[Message], last: View | None, *, verify: bool) -> None:
        """Take the caller's history: every dict by identity, what the view shows (and the
        copies handed out that no longer equal it) down to their parts; summarized dicts in
        place only before a compaction builds on them, so a turn costs what the view holds
        (docs/design.md §5, §17); with ``verify``, everything by digest."""
        raw, state = self.raw, self.state
        covered = state.covered if state.generation else 0
        raw.sync(messages, suspects=() if last is None else last.suspects(), check_from=covered)
        if last is None and covered:  # a session loaded from the store: look at all once
            raw.recheck(raw.system_count, covered)
        if verify:
            raw.compare_digests(messages)

    def _build(self, last: View | None) -> View:
        """The build step, with the recorded sticky substitutions shown."""
        view = build(self.raw, self.state, last, self.settings.language)
        self.sticky.show_recorded(view, view.history_index(view.fresh))
        return view

    def _trim(self, turn: Turn) -> None:
        """reduce → trim → record: the previews and placeholders decided, then persisted
        (originals offloaded) and shown; gate 1's state kept on the view."""
        view, trimming = turn.view, self.trimming
        squeezed = self.turn_recall.squeezed(view)  # earlier blocks go: pending trims too
        new, state = trimming.trim(view, trimming.reduce(view), force=squeezed)
        turn.substitutions += new
        trimming.apply(view, new, state or view.trim_hint, turn.left.extend)
        if squeezed or any(sub.kind == "trim" for _, sub, _ in new):  # an event: blocks go
            self.turn_recall.evict_earlier(view, self.sticky)
        self._report(turn)

    def _compact(self, turn: Turn) -> None:
        """Gate 2: a compaction when the view is over the trigger, waited at most
        ``compaction_timeout_s``; the view is built anew when a generation applied or the
        summary was dropped."""
        turn.skipped = skipped = self._gate_compaction(turn.view, turn.user_id)
        if skipped == "history_edited":
            turn.view = self._build(None)  # without the summary it no longer matches
        elif self.state.generation != self.returned_generation:
            turn.compacted = True
            turn.view = self._build(None)  # the hint's indexes belonged to the old view
            self.turn_recall.applied(turn.view, self.sticky)

    def _gate_compaction(self, view: View, user_id: str | None) -> SkipReason | None:
        """Why a due compaction did not apply, or None (applied, or not due)."""
        if self.compactions.running:
            return "in_progress"
        plan = plan_compaction(view, sizes_as_written(view, self.raw.sizes), self.settings)
        if not isinstance(plan, CutPlan):
            if plan not in (None, "last_not_user"):
                log.info(
                    "compaction.skipped", session_id=self.session_id, reason=plan, chars=view.total
                )
            return plan
        if self.state.generation and self.raw.recheck(self.raw.system_count, self.state.covered):
            self._verify(user_id)  # a summarized dict was edited in place: drop the summary
            return "history_edited"
        return self._run_compaction(view, plan, user_id)

    def _ceiling(self, turn: Turn) -> None:
        """The ceiling while the view is over B: rungs 0-1, the mid-turn compaction (rung 2,
        run here), rungs 3-5; what they left out reported."""
        ladder = self.ladder
        if not ladder.over(turn.view):
            turn.dropped_turns = turn.view.left_out.turns
            return
        ladder.lower(turn)
        if ladder.over(turn.view) and self.settings.summary_enabled:
            mid_turn = self._compact_mid_turn(turn)
            if mid_turn is not None:
                turn.compacted = turn.compacted or mid_turn == "applied"
                turn.skipped = turn.skipped or mid_turn
        ladder.finish(turn)
        left_out = turn.left_out
        if left_out:
            indexes = range(max(left_out.start, self.left_out_stop), left_out.stop)
            self._leave(turn.user_id, indexes, turn.view.prefix_len)
            self.left_out_stop = max(self.left_out_stop, left_out.stop)

    def _compact_mid_turn(self, turn: Turn) -> SkipReason | None:
        """Rung 2: what a compaction whose cut may be the current turn's user message did
        (None: none tried; "applied"; else why it did not apply)."""
        if self.compactions.running:
            return None
        plan = self.ladder.plan_mid_turn(turn.view)
        outcome = plan
        if isinstance(plan, CutPlan):
            outcome = self._run_compaction(turn.view, plan, turn.user_id)
        if self.state.generation != self.returned_generation:
            turn.view = self.view = self._build(None)
            self.turn_recall.applied(turn.view, self.sticky)
            self.returned_generation = self.state.generation
            return "applied"
        return outcome  # type: ignore[return-value]

    def _run_compaction(self, view: View, plan: CutPlan, user_id: str | None) -> SkipReason | None:
        """Run one planned compaction, waiting at most ``compaction_timeout_s``; returns why
        it did not apply, or None."""
        job = compaction_job(
            view,
            plan,
            self.raw,
            previous=self.state,
            user_id=user_id,
            markers=self.turn_recall.markers,
            chars_out=self.ladder.predict(view, plan, self.turn_recall.crowds(view)),
        )
        outcome = self.compactions.start(job, self.settings.compaction_timeout_s)
        if isinstance(outcome, str):
            return outcome
        self._apply(outcome, user_id)
        self.verified_digest = outcome.covered_digest
        return None

    # -------------------------------------------------------------- applied to the session

    def _apply(self, state: SessionState, user_id: str | None) -> None:
        """Take an applied generation; what it newly covers has left the view."""
        previous = self.state
        self.state = state
        start = previous.covered if previous.generation else state.prefix_len
        stop = min(state.covered, len(self.raw.messages))
        self._leave(user_id, range(max(start, self.left_out_stop), stop), state.prefix_len)

    def _leave(self, user_id: str | None, indexes: range, prefix_len: int) -> None:
        """History ``indexes`` leave the view: reported unless substituted (reported when
        their substitution was recorded)."""
        at = self.sticky.at
        self._send(user_id, [i for i in indexes if _shown_as_written(at(i, prefix_len))])

    def _report(self, turn: Turn) -> None:
        """Report what left the turn's view since the last report (``Services.on_leave``)."""
        left, turn.left = turn.left, []
        self._send(turn.user_id, left)

    def _send(self, user_id: str | None, indexes: Sequence[int]) -> None:
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


def _shown_as_written(sub: Substitution | None) -> bool:
    """Whether a message was shown as the caller wrote it (a recall block on it aside): only
    then does it leave the view when a summary covers it."""
    return sub is None or sub.kind == "recall"
