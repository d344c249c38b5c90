"""Gates 1 and 0 on a session's view: oversized messages as previews (docs/design.md §8) and old
tool results as placeholders (§4), as substitutions to record; gate 1's ``TrimState`` is kept
on the view from turn to turn while the view only grows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ragent_memory.core.chars import chars
from ragent_memory.core.logs import get_logger
from ragent_memory.engine.sticky import NewSubstitution, Sticky
from ragent_memory.engine.view import HistoryIndex, View
from ragent_memory.gates.reduce import reduce
from ragent_memory.gates.trim import Eviction, Rebuild, Shown, TrimState
from ragent_memory.settings import Settings
from ragent_memory.store import Substitution

log = get_logger(__name__)


class Trimming:
    """Reduce and trim for one session."""

    def __init__(self, session_id: str, settings: Settings, sticky: Sticky) -> None:
        self.session_id = session_id
        self.settings = settings
        self.sticky = sticky
        self.warned_irregular = False

    def reduce(self, view: View) -> list[NewSubstitution]:
        """Previews for oversized messages new in the view, not shown in another form yet."""
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
            ref_for=self.sticky.ref_for,
            candidates=candidates,
        )
        return [
            (
                t.index,
                Substitution(self.sticky.key(view, t.index), "truncate", t.refs[0], t.replacement),
                t.offloaded,
            )
            for t in reduced.previews
        ]

    def trim(
        self, view: View, new: list[NewSubstitution]
    ) -> tuple[list[NewSubstitution], TrimState | None]:
        """Gate 1 over the view as it would be with ``new`` shown. Returns the substitutions
        to record (a trimmed result replaces its pending preview) and the gate's state for
        later turns (None: look at the whole view next time). The view's state is taken
        first, so a failure midway leaves none behind."""
        state, view.trim_hint = view.trim_hint, None
        pending = {index: sub for index, sub, _ in new}
        total = view.total + sum(chars(s.message) - view.sizes[i] for i, s in pending.items())
        if total <= self.settings.trim_trigger_chars:
            return new, state  # looked at when the view is next over the trigger
        state = self._state(view, pending, state)
        if state.due(total):
            reclaimed = state.reclaim
            new = self._with_evictions(view, new, state.take(), total, reclaimed)
        return new, state

    def retrim(
        self, view: View, on_left: Callable[[list[HistoryIndex]], None]
    ) -> list[NewSubstitution]:
        """Gate 1 on ``view`` as the next turn sees it, after the ceiling made it smaller (its
        total may now pass the 20% rule): the same history gives the same messages. Returns
        the substitutions it decided."""
        new, state = self.trim(view, [])
        self.apply(view, new, state or view.trim_hint, on_left)
        return new

    def apply(
        self,
        view: View,
        new: list[NewSubstitution],
        state: TrimState | None,
        on_left: Callable[[list[HistoryIndex]], None],
    ) -> None:
        """Record and show ``new``; keep gate 1's ``state`` unless the store failed."""
        view.trim_hint = state if self.sticky.record(view, new, on_left) else None

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
            {i: (sub.message, chars(sub.message), sub.kind) for i, sub in pending.items()},
        )
        settings = self.settings
        if state is not None:
            try:
                state.extend(shown)
            except Rebuild:
                state = None
        if state is None:
            state = TrimState(settings.evictable_tools, settings.language, self.sticky.ref_for)
            state.extend(shown)
        irregular = state.irregular
        if irregular and not self.warned_irregular:
            self.warned_irregular = True  # once per session: the caller's input, not ours
            log.warning("messages.irregular", session_id=self.session_id, **irregular)
        return state

    def _with_evictions(
        self,
        view: View,
        new: list[NewSubstitution],
        evictions: Sequence[Eviction],
        total: int,
        reclaimed_chars: int,
    ) -> list[NewSubstitution]:
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
        key = self.sticky.key
        return [n for n in new if n[0] not in evicted] + [
            (e.index, Substitution(key(view, e.index), "trim", e.ref, e.replacement), (e.text,))
            for e in evictions
        ]
