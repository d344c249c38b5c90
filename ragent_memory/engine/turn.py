"""One turn as a value (``Turn``), the steps that need no session state (``build``, the
report), and the ``TurnReport`` a turn ends with (docs/design.md §1, §4, §11).

A turn goes through the steps sync → build → reduce → trim → compact → ceiling → recall →
report. Each step looks at the turn and returns (or writes on it) what it decided; the
``Session`` alone applies decisions to the session's state (its view, summary, what was
reported as having left the view)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ragent_memory.core.chars import Message, chars
from ragent_memory.core.names import SkipReason
from ragent_memory.core.provenance import Markers
from ragent_memory.engine.compaction import Job, state_message
from ragent_memory.engine.raw import RawCache
from ragent_memory.engine.sticky import NewSubstitution
from ragent_memory.engine.turn_recall import block_chars
from ragent_memory.engine.view import HistoryIndex, View
from ragent_memory.gates.cut import CutPlan, plan_cut
from ragent_memory.settings import Settings
from ragent_memory.store import SessionState

NOWHERE = HistoryIndex(-1)  # no message


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


@attrs.define
class Turn:
    """One ``prepare`` of a session: the caller's history as given, the view it works on
    and what each step decided. ``view`` is what is sent; the session keeps its own view
    (the one the next turn extends), which is this one unless the ceiling's last rung sent
    a copy without the summary."""

    history: Sequence[Message]  # as the caller gave it (normalised to chat dicts)
    user_id: str | None
    view: View
    chars_in: int  # build: the view's chars before any substitution
    # reduce, trim, ceiling: the substitutions decided in this turn, in the order recorded
    substitutions: list[NewSubstitution] = attrs.field(factory=list)
    # history indexes that left the view in this turn and were not reported yet
    left: list[HistoryIndex] = attrs.field(factory=list)
    compacted: bool = False  # compact / ceiling: a summary generation was applied
    skipped: SkipReason | None = None  # compact / ceiling: why a due compaction did not apply
    left_out: range = range(0)  # ceiling: the history indexes it left out of the view
    dropped_turns: int = 0  # ceiling: whole turns left out
    recalled: int = 0  # recall: excerpts in the block, and their chars
    recalled_chars: int = 0
    # recall: a block the view could not keep, put on the copy handed out at ``recall_at``
    recall_block: str = ""
    recall_at: HistoryIndex = NOWHERE
    # measured: the view sent once the gates ran (recall's block not in it yet)
    chars_out: int = 0
    trimmed: int = 0
    truncated: int = 0
    reclaimed_chars: int = 0
    # what the session holds once the steps ran, for the report
    chars_raw: int = 0
    generation: int = 0
    recall_evicted: int = 0
    budget: int = 0

    def changed_prefix(self, blocks_dropped: int) -> bool:
        """Whether this call already changes bytes the previous call sent (a compaction, a
        turn left out, a placeholder or preview on a message carried over, or kept recall
        blocks taken off): recall may take the other kept blocks off in the same event."""
        fresh = self.view.fresh
        return (
            self.compacted
            or bool(self.left_out)
            or blocks_dropped > 0
            or any(index < fresh for index, _, _ in self.substitutions)
        )

    def measure(self) -> None:
        """Take the report's figures of the view to send: after the gates, before a recall
        block is kept on it (the block is reported on its own)."""
        view = self.view
        self.chars_out = total = view.total
        self.trimmed = view.counts.get("trim", 0)
        self.truncated = view.counts.get("truncate", 0)
        # The tail differs from the caller's messages only where something is substituted.
        self.reclaimed_chars = view.raw_chars - (total - view.head_chars)

    def report(self, *, memory_chars: int, duration_ms: float) -> TurnReport:
        """The turn's ``TurnReport``."""
        return TurnReport(
            chars_raw=self.chars_raw,
            chars_in=self.chars_in,
            chars_out=self.chars_out,
            trimmed=self.trimmed,
            truncated=self.truncated,
            reclaimed_chars=self.reclaimed_chars,
            compacted=self.compacted,
            skipped_reason=self.skipped,
            generation=self.generation,
            memory_chars=memory_chars,
            duration_ms=duration_ms,
            over_budget=self.chars_out > self.budget,
            dropped_turns=self.dropped_turns,
            recalled=self.recalled,
            recalled_chars=self.recalled_chars,
            recall_evicted=self.recall_evicted,
        )


def build(raw: RawCache, state: SessionState, last: View | None, language: str) -> View:
    """The build step: the view before the gates, without substitutions shown yet (from
    ``fresh`` on it holds the caller's messages as written). Last turn's view is extended in
    place when the history before its end is unchanged (only rebuilt leading system
    messages replaced): the gates then look only at what is new, and gate 1 keeps its
    state."""
    prefix_len = raw.system_count
    start = state.covered if state.generation else prefix_len
    head = prefix_len + (1 if state.generation else 0)
    if (
        last is not None
        and (last.prefix_len, last.head, last.generation) == (prefix_len, head, state.generation)
        and last.start == start
        and raw.unchanged(start, last.end)
    ):
        view = last
        for index in raw.changed:
            if index >= prefix_len:
                break
            view.replace_head(index, raw.messages[index], raw.sizes[index])
    else:
        messages = raw.messages[:prefix_len]
        sizes = raw.sizes[:prefix_len]
        if state.generation:
            summary = state_message(state, language)
            messages.append(summary)
            sizes.append(chars(summary))
        view = View.starting(
            messages, sizes, start=start, prefix_len=prefix_len, generation=state.generation
        )
    view.fresh = len(view.messages)
    begin = view.history_index(view.fresh)  # the first message new in the view
    view.grow(raw.messages[begin:], raw.sizes[begin:])
    return view


def chars_in(view: View) -> int:
    """What the view built measures before any substitution: prefix, summary and the
    caller's messages as written, the ceiling's left-out turns counted back in."""
    return view.head_chars + view.raw_chars + view.left_out.raw_chars


def plan_compaction(
    view: View, sizes: Sequence[int], settings: Settings
) -> CutPlan | SkipReason | None:
    """The compact step's decision (gate 2) on ``view`` measured with ``sizes`` (kept recall
    blocks not counted): where to cut, why no cut can be made, or None when the view is
    under the trigger (nothing is due: not a skip)."""
    decision = plan_cut(
        view.messages,
        sizes,
        head=view.head,
        settings=settings,
        left_out_chars=view.left_out.shown_chars,
    )
    return None if decision == "below_trigger" else decision


def compaction_job(
    view: View,
    plan: CutPlan,
    raw: RawCache,
    *,
    previous: SessionState,
    user_id: str | None,
    markers: Markers,
    chars_out: Callable[[int], int],
) -> Job:
    """The compaction ``plan`` cut in ``view`` as a job for the engine's pool: what it
    summarizes (the turns the ceiling left out counted back in), what it will cover, the
    standing instructions still shown after it and how to predict its turn's chars_out."""
    material = view.material(plan.head, plan.cut)
    return Job(
        previous=previous,
        user_id=user_id,
        material=tuple((i, raw.messages[i]) for i in material),
        prefix_len=view.prefix_len,
        new_covered=material.stop,
        covered_digest=raw.chain(view.prefix_len, material.stop),
        plan=plan,
        shown_standing=markers.standing_keys(raw.messages[material.stop :]),
        chars_out=chars_out,
    )


def may_pass_trigger(
    last: View, raw: RawCache, messages: Sequence[Message], settings: Settings
) -> bool:
    """Whether a turn of ``messages`` after the one that built ``last`` (the session's view)
    could reach the compaction trigger: False only when ``messages`` are the dicts of that
    turn (or equal ones) plus new ones too small to bring the view past it (the view then
    only grows by what is appended; a view under the trigger is under B as well, so the
    ceiling's mid-turn compaction cannot start either)."""
    known = len(raw.messages)
    if not isinstance(messages, list) or len(messages) < known or last.end > known:
        return True
    try:
        if messages[:known] != raw.messages:  # the same dicts meet at once
            return True
        grown = sum(raw.sizes[last.end :]) + sum(map(chars, messages[known:]))
    except Exception:  # an odd or invalid message: prepare says what is wrong
        return True
    trigger = min(settings.compact_trigger_chars, settings.context_window_chars)
    return last.with_left_out - block_chars(last, raw.sizes) + grown > trigger
