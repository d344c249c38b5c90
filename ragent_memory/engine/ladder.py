"""The ceiling step (docs/design.md §4b) on a turn's view: the rungs of ``gates.ceiling``
applied, their placeholders and previews recorded as sticky substitutions. Rung 2, the
mid-turn compaction, is planned here (``plan_mid_turn``) and run by the session between
``lower`` (rungs 0-1) and ``finish`` (rungs 3-5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import get_logger
from ragent_memory.core.names import SkipReason, SubstitutionKind
from ragent_memory.engine.raw import RawCache
from ragent_memory.engine.sticky import Sticky
from ragent_memory.engine.trimming import Trimming
from ragent_memory.engine.turn import Turn
from ragent_memory.engine.turn_recall import sizes_as_written
from ragent_memory.engine.view import View
from ragent_memory.gates import ceiling
from ragent_memory.gates.cut import CutPlan, plan_cut
from ragent_memory.settings import Settings
from ragent_memory.store import Substitution

log = get_logger(__name__)

# (view index, kind, ref, message shown, texts to offload)
Change = tuple[int, SubstitutionKind, str, Message, Sequence[str]]


class Ladder:
    """Climbs the ceiling's rungs over a turn's view while it is over B. What leaves the view
    goes on the turn (``Turn.left``, ``Turn.left_out``) for the session to report."""

    def __init__(
        self, session_id: str, settings: Settings, raw: RawCache, trimming: Trimming
    ) -> None:
        self.session_id = session_id
        self.settings = settings
        self.raw = raw
        self.trimming = trimming
        self.sticky: Sticky = trimming.sticky

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
        return ceiling.Forms(self.settings.language, self.sticky.ref_for, originals, evicted)

    def predict(
        self, view: View, decision: CutPlan, crowds: Callable[[int], bool]
    ) -> Callable[[int], int]:
        """The chars_out of the turn that applies the compaction ``decision``, from the
        summary message's chars: the ceiling's ``fit`` over the view as it will be (prefix +
        summary + the kept tail), the same code that fits it then. ``crowds`` says, from what
        that view sends, whether the kept recall blocks in the tail leave the turn's new
        block too little room: the session then takes them off as the compaction applies
        (``TurnRecall.applied``), so they are not counted."""
        prefix_len = view.prefix_len
        summary: Message = {"role": "user", "content": ""}
        messages, sizes, originals, evicted = view.after_compaction(decision.cut, summary)
        written = [
            *sizes[: prefix_len + 1],
            *sizes_as_written(view, self.raw.sizes)[decision.cut :],
        ]

        def chars_out(summary_chars: int) -> int:
            sizes[prefix_len] = written[prefix_len] = summary_chars
            found = self.fit(
                messages,
                written if crowds(sum(sizes)) else sizes,
                head=prefix_len + 1,
                prefix_len=prefix_len,
                originals=originals,
                evicted=evicted,
            )
            return found.chars_out

        return chars_out

    def over(self, view: View) -> bool:
        """Whether ``view`` sends more than B."""
        return view.total > self.settings.context_window_chars

    def lower(self, turn: Turn) -> None:
        """Rungs 0 and 1 on a view over B: the kept recall blocks taken off, then every
        evictable tool result before the current turn trimmed."""
        view = turn.view
        if view.counts.get("recall"):  # the prefix changes: gate 1's pending trims go too
            self.sticky.drop_recall_blocks(view, sorted(view.indexes("recall")))
            turn.substitutions += self.trimming.retrim(view, turn.left.extend, force=True)
        if self.over(view):
            self._trim_all(turn)

    def plan_mid_turn(self, view: View) -> CutPlan | SkipReason | None:
        """Rung 2's plan: a compaction whose cut may be the current turn's user message
        (None: not met, a view over B is over the trigger; else why none can be cut)."""
        decision = plan_cut(
            view.messages,
            view.sizes,
            head=view.head,
            settings=self.settings,
            mid_turn=True,
            left_out_chars=view.left_out.shown_chars,
        )
        return None if decision == "below_trigger" else decision

    def _trim_all(self, turn: Turn) -> None:
        """Rung 1, then gate 1 on the smaller view as the next turn would run it (the same
        history then gives the same prepared messages)."""
        view, budget = turn.view, self.settings.context_window_chars
        turn_start = ceiling.current_turn_start(view.messages, view.head)
        evictions, swept = ceiling.trim_all(
            view.messages,
            view.sizes,
            head=max(view.head, min(view.swept, turn_start)),  # before it: nothing left
            turn_start=turn_start,
            excess=view.total - budget + int(budget * ceiling.TRIM_HEADROOM),
            forms=self._forms(view.originals, view.indexes("trim")),
        )
        self._stick(turn, [(e.index, "trim", e.ref, e.replacement, (e.text,)) for e in evictions])
        if all(view.kinds.get(e.index) == "trim" for e in evictions):  # the store took them
            view.swept = swept
        if evictions and swept != turn_start:
            turn.substitutions += self.trimming.retrim(view, turn.left.extend)

    def finish(self, turn: Turn) -> None:
        """Rungs 3-5 as ``fit`` decides them, applied to the turn's view (the session's);
        rung 5 sends a copy without the summary."""
        view, budget = turn.view, self.settings.context_window_chars
        found = self._fit_view(view, previews=True)
        self._stick(
            turn,
            [(t.index, "truncate", t.refs[0], t.replacement, t.offloaded) for t in found.previews],
        )
        if any(view.messages[t.index] is not t.replacement for t in found.previews):
            found = self._fit_view(view, previews=False)  # the store kept none: rung 4 alone
        self._leave_out(turn, found.left_out, found.left_turns)
        turn.dropped_turns = view.left_out.turns
        if view.total > budget and view.head > view.prefix_len:
            # Only the summary is left between the system prompt and the current turn:
            # what is sent at last is the system prompt and the current turn (rung 5).
            view.hand_out()
            turn.view = view = view.without(view.head - 1, 1, raw_chars=0)
        if view.total > budget:
            log.warning(
                "ceiling.over_budget",
                session_id=self.session_id,
                chars_out=view.total,
                budget_chars=budget,
                dropped_turns=turn.dropped_turns,
            )

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

    def _stick(self, turn: Turn, changes: Sequence[Change]) -> None:
        """Record the ceiling's placeholders and previews as sticky substitutions and show
        them in the turn's view, so the next turn shows them too (a stable prefix); gate 1's
        kept state follows them."""
        if not changes:
            return
        view, key = turn.view, self.sticky.key
        new = [
            (index, Substitution(key(view, index), kind, ref, message), texts)
            for index, kind, ref, message, texts in changes
        ]
        state = view.trim_hint
        if state is not None:
            state.replaced([change[0] for change in changes])
        turn.substitutions += new
        self.trimming.apply(view, new, state, turn.left.extend)

    def _leave_out(self, turn: Turn, count: int, turns: int) -> None:
        """Rung 4: leave the ``count`` messages after the prefix/summary (``turns`` whole
        turns) out of the turn's view, so later turns keep them out while it grows;
        ``Turn.left_out`` says which, for the session to report."""
        if count <= 0:
            return
        view = turn.view
        first = view.tail_start
        turn.left_out = range(first, first + count)
        view.leave_out(count, turns=turns, raw_chars=sum(self.raw.sizes[first : first + count]))
        turn.substitutions += self.trimming.retrim(view, turn.left.extend)
