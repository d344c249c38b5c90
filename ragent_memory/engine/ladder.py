"""The ceiling (docs/design.md §4b) on a session's view: the rungs of ``gates.ceiling`` applied, their
placeholders and previews recorded as sticky substitutions, the mid-turn compaction run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.core.names import SkipReason, SubstitutionKind
from ragent_memory.engine.view import View
from ragent_memory.gates import ceiling
from ragent_memory.gates.cut import CutPlan, plan_cut
from ragent_memory.store import Substitution

if TYPE_CHECKING:
    from ragent_memory.engine.session import Session

log = get_logger(__name__)

# (view index, kind, ref, message shown, texts to offload)
Change = tuple[int, SubstitutionKind, str, Message, Sequence[str]]


class Ladder:
    """Climbs the ceiling's rungs over a session's view while it is over B."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.settings = session.settings

    def fit(
        self,
        view: Sequence[Message],
        sizes: Sequence[int],
        *,
        head: int,
        prefix_len: int,
        originals: Mapping[int, Message],
        evicted: set[int],
        previews: bool = True,
    ) -> ceiling.Fit:
        """Rungs 3-5 with this session's settings: to fit the view, and to predict the
        chars_out of a compaction's turn (``predict``)."""
        settings = self.settings
        return ceiling.fit(
            view,
            sizes,
            head=head,
            prefix_len=prefix_len,
            budget=settings.context_window_chars,
            limit_chars=settings.oversized_tool_result_chars if previews else None,
            forms=self._forms(originals, evicted),
        )

    def _forms(self, originals: Mapping[int, Message], evicted: set[int]) -> ceiling.Forms:
        return ceiling.Forms(
            self.settings.language, self.session.sticky.ref_for, originals, evicted
        )

    def predict(self, view: View, decision: CutPlan) -> Callable[[int], int]:
        """The chars_out of the turn that applies the compaction ``decision``, from the
        summary message's chars: the ceiling's ``fit`` over the view as it will be (prefix +
        summary + the kept tail), the same code that fits it then."""
        cut, prefix_len = decision.cut, view.prefix_len
        summary: Message = {"role": "user", "content": ""}
        messages = [*view.messages[:prefix_len], summary, *view.messages[cut:]]
        sizes = [*view.sizes[:prefix_len], 0, *view.sizes[cut:]]
        shift = prefix_len + 1 - cut
        originals = {i + shift: m for i, m in view.originals.items() if i >= cut}
        evicted = {i + shift for i in view.indexes("trim") if i >= cut}

        def chars_out(summary_chars: int) -> int:
            sizes[prefix_len] = summary_chars
            found = self.fit(
                messages,
                sizes,
                head=prefix_len + 1,
                prefix_len=prefix_len,
                originals=originals,
                evicted=evicted,
            )
            return found.chars_out

        return chars_out

    def climb(self, view: View, user_id: str | None) -> tuple[View, int, SkipReason | None]:
        """While ``view.total`` > B, the rungs in order. Returns the view to send, how many
        whole turns it leaves out, and what a mid-turn compaction did (None: not tried;
        "applied"; else why it did not apply)."""
        budget = self.settings.context_window_chars
        if view.total <= budget:
            return view, view.left_out.turns, None
        self.session.sticky.drop_recall_blocks(view, sorted(view.indexes("recall")))
        if view.total > budget:
            self._trim_all(view, user_id)
        mid_turn = None
        if view.total > budget:
            view, mid_turn = self._compact_mid_turn(view, user_id)
        view, dropped_turns = self._finish(view, user_id)
        return view, dropped_turns, mid_turn

    def _trim_all(self, view: View, user_id: str | None) -> None:
        """Rung 1, then gate 1 on the smaller view as the next turn would run it (the same
        history then gives the same prepared messages)."""
        budget = self.settings.context_window_chars
        turn_start = ceiling.current_turn_start(view.messages, view.head)
        evictions, swept = ceiling.trim_all(
            view.messages,
            view.sizes,
            head=max(view.head, min(view.swept, turn_start)),  # before it: nothing left
            turn_start=turn_start,
            excess=view.total - budget + int(budget * ceiling.TRIM_HEADROOM),
            forms=self._forms(view.originals, view.indexes("trim")),
        )
        self._stick(
            view, [(e.index, "trim", e.ref, e.replacement, (e.text,)) for e in evictions], user_id
        )
        if all(view.kinds.get(e.index) == "trim" for e in evictions):  # the store took them
            view.swept = swept
        if evictions and swept != turn_start:
            self.session.trimming.retrim(view, self._report_left(user_id))

    def _compact_mid_turn(self, view: View, user_id: str | None) -> tuple[View, SkipReason | None]:
        """Rung 2: a compaction whose cut may be the current turn's user message."""
        session, settings = self.session, self.settings
        if not settings.summary_enabled or session.compactions.running:
            return view, None
        decision = plan_cut(
            view.messages,
            view.sizes,
            head=view.head,
            settings=settings,
            mid_turn=True,
            left_out_chars=view.left_out.shown_chars,
        )
        outcome: SkipReason | None
        if decision == "below_trigger":  # not met: a view over B is over the trigger
            outcome = None
        elif isinstance(decision, str):
            outcome = decision
        else:
            outcome = session.compact(view, decision, user_id)
        if session.state.generation != session.returned_generation:
            return session.rebuild(), "applied"
        return view, outcome

    def _finish(self, view: View, user_id: str | None) -> tuple[View, int]:
        """Rungs 3-5 as ``fit`` decides them, applied to the session's view."""
        budget = self.settings.context_window_chars
        found = self._fit_view(view, previews=True)
        self._stick(
            view,
            [(t.index, "truncate", t.refs[0], t.replacement, t.offloaded) for t in found.previews],
            user_id,
        )
        if any(view.messages[t.index] is not t.replacement for t in found.previews):
            found = self._fit_view(view, previews=False)  # the store kept none: rung 4 alone
        self._leave_out(view, found.left_out, found.left_turns, user_id)
        dropped_turns = view.left_out.turns
        if view.total > budget and view.head > view.prefix_len:
            # Only the summary is left between the system prompt and the current turn:
            # what is sent at last is the system prompt and the current turn (rung 5).
            view.hand_out()
            view = view.without(view.head - 1, 1, raw_chars=0)
        if view.total > budget:
            log.warning(
                "ceiling.over_budget",
                session_id=self.session.session_id,
                chars_out=view.total,
                budget_chars=budget,
                dropped_turns=dropped_turns,
            )
        return view, dropped_turns

    def _fit_view(self, view: View, *, previews: bool) -> ceiling.Fit:
        return self.fit(
            view.messages,
            view.sizes,
            head=view.head,
            prefix_len=view.prefix_len,
            originals=view.originals,
            evicted=view.indexes("trim"),
            previews=previews,
        )

    def _stick(self, view: View, changes: Sequence[Change], user_id: str | None) -> None:
        """Record the ceiling's placeholders and previews as sticky substitutions and show
        them in the session's view, so the next turn shows them too (a stable prefix);
        gate 1's kept state follows them."""
        if not changes:
            return
        key = self.session.sticky.key
        new = [
            (index, Substitution(key(view, index), kind, ref, message), texts)
            for index, kind, ref, message, texts in changes
        ]
        state = view.trim_hint
        if state is not None:
            state.replaced([change[0] for change in changes])
        self.session.trimming.apply(view, new, state, self._report_left(user_id))

    def _leave_out(self, view: View, count: int, turns: int, user_id: str | None) -> None:
        """Rung 4: leave the ``count`` messages after the prefix/summary (``turns`` whole
        turns) out of the session's view, so later turns keep them out while it grows; they
        are reported as having left the view (once: ``Session.left_out_stop`` remembers how far)."""
        if count <= 0:
            return
        session = self.session
        first = view.head + view.offset
        stop = first + count
        session.leave_view(user_id, range(max(first, session.left_out_stop), stop), view.prefix_len)
        session.left_out_stop = max(session.left_out_stop, stop)
        view.leave_out(count, turns=turns, raw_chars=sum(session.raw.sizes[first:stop]))
        session.trimming.retrim(view, self._report_left(user_id))

    def _report_left(self, user_id: str | None) -> Callable[[list[int]], None]:
        return lambda indexes: self.session.report_left(user_id, indexes)
