"""The ceiling (docs/design.md §4b): B is a promise, not a hope.

While the view is over B after the gates, the session climbs a ladder and stops on the first
rung that fits. These are the rungs that only look at the view, as pure functions returning what
to change; the session applies them. Rung 1 is ``trim_all``, rung 2 a mid-turn compaction
(``plan_cut(..., mid_turn=True)``), rungs 3-5 are ``fit``: the session also calls it, before a
mid-turn compaction applies, to predict the chars_out its audit row records (docs/design.md §10)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from ragent_memory.core.chars import Message, chars
from ragent_memory.core.toolloops import last_user_index, map_loops
from ragent_memory.gates.reduce import Preview, reduce
from ragent_memory.gates.trim import Eviction, evict

MIN_PREVIEW_CHARS = 1_000  # step 3 never lowers a preview limit below this
# Step 1 frees this share of B beyond the excess (when there is that much to trim): a long tool
# loop that keeps the view at B would otherwise trim one more result on every call, and each
# such trim changes the prefix that provider prompt caches key on.
TRIM_HEADROOM = 0.1


@attrs.frozen
class Forms:
    """How the rungs make and read the forms a view shows: the language and ref maker of
    placeholders and previews, the caller's ``originals`` of messages shown in another form
    and the indexes ``evicted`` (already placeholders)."""

    language: str
    ref_for: Callable[[str], str]
    originals: Mapping[int, Message]
    evicted: frozenset[int] | set[int]


def current_turn_start(view: Sequence[Message], head: int) -> int:
    """Where the current turn starts: the last user message after ``head``, else ``head``."""
    return max(last_user_index(view), head)


def trim_all(
    view: Sequence[Message],
    sizes: Sequence[int],
    *,
    head: int,
    turn_start: int,
    excess: int,
    forms: Forms,
) -> tuple[list[Eviction], int]:
    """Step 1: placeholders for tool results in ``[head, turn_start)`` of any tool, oldest
    first, until they free ``excess`` chars; irregular loops are left alone (docs/design.md §3).
    Returns them and the loop boundary before which nothing is left to evict once they are
    shown (``turn_start`` when all were planned): the next call may start there."""
    loops = map_loops(view[head:turn_start])
    evicted, originals = forms.evicted, forms.originals
    planned: list[Eviction] = []
    freed = 0
    for loop in loops.loops:
        if not loop.is_complete:
            continue
        call = view[head + loop.call_index]
        arguments = {
            c["id"]: (c.get("function") or {}).get("arguments") or ""
            for c in call.get("tool_calls") or ()
        }
        for relative in loop.result_indexes:
            index = head + relative
            if index in evicted:
                continue
            shown = view[index]
            args = arguments.get(shown["tool_call_id"], "")
            original = originals.get(index, shown)
            eviction = evict(
                shown, index, original, args, sizes[index], forms.language, forms.ref_for
            )
            if eviction is None:
                continue
            planned.append(eviction)
            freed += sizes[index] - chars(eviction.replacement)
            if freed >= excess:
                return planned, head + loop.call_index
    return planned, turn_start


def preview_turn(
    view: Sequence[Message],
    sizes: Sequence[int],
    *,
    turn_start: int,
    excess: int,
    limit_chars: int,
    forms: Forms,
) -> list[Preview]:
    """Step 3: previews of the current turn's tool results and tool-call inputs (from the
    originals), the limit bisected down from ``limit_chars`` to the highest that frees
    ``excess``, never below ``MIN_PREVIEW_CHARS``; only previews smaller than shown now."""
    items = [
        i
        for i in range(turn_start, len(view))
        if i not in forms.evicted
        and (view[i].get("role") == "tool" or bool(view[i].get("tool_calls")))
    ]
    if not items:
        return []
    base = list(view)
    for index in items:
        base[index] = forms.originals.get(index, view[index])

    def plan(limit: int) -> tuple[int, list[Preview]]:
        result = reduce(
            base,
            limit_chars=limit,
            language=forms.language,
            ref_for=forms.ref_for,
            candidates=items,
        )
        kept = [t for t in result.previews if chars(t.replacement) < sizes[t.index]]
        return sum(sizes[t.index] - chars(t.replacement) for t in kept), kept

    low, high = MIN_PREVIEW_CHARS, max(limit_chars, MIN_PREVIEW_CHARS)
    freed, best = plan(low)
    if freed < excess:
        return best  # even the floor does not fit: the most it can free
    while high - low > 16:  # previews are a few hundred chars apart at most this close
        middle = (low + high) // 2
        freed, found = plan(middle)
        if freed >= excess:
            low, best = middle, found
        else:
            high = middle
    return best


def turns_to_leave_out(
    view: Sequence[Message], sizes: Sequence[int], *, head: int, turn_start: int, excess: int
) -> tuple[int, int]:
    """Step 4: how many messages from ``head`` on, and whole turns, to leave out to free
    ``excess``; cuts fall only on user messages before the current turn (no loop is split)."""
    freed = 0
    turns = 0
    at = head
    while at < turn_start and freed < excess:
        cut = at + 1
        while cut < turn_start and view[cut].get("role") != "user":
            cut += 1
        freed += sum(sizes[at:cut])
        turns += 1
        at = cut
    return at - head, turns


@attrs.frozen
class Fit:
    """What rungs 3-5 do to a view over B, and the chars_out they leave."""

    previews: list[Preview]  # rung 3
    left_out: int  # rung 4: messages from ``head`` on left out...
    left_turns: int  # ... as whole turns
    drop_summary: bool  # rung 5: the summary message (just before ``head``) is not sent
    chars_out: int


def fit(
    view: Sequence[Message],
    sizes: Sequence[int],
    *,
    head: int,
    prefix_len: int,
    budget: int,
    limit_chars: int | None,
    forms: Forms,
) -> Fit:
    """Rungs 3-5 over ``view`` (``head``: its first message after the prefix and summary),
    stopping on the first that fits ``budget``. ``limit_chars`` is the oversized limit
    rung 3 lowers from; None skips rung 3 (its previews could not be kept)."""
    shown = list(sizes)
    total = sum(shown)
    if total <= budget:
        return Fit([], 0, 0, False, total)
    turn_start = current_turn_start(view, head)
    made: list[Preview] = []
    if limit_chars is not None:
        excess = total - budget
        made = preview_turn(
            view, shown, turn_start=turn_start, excess=excess, limit_chars=limit_chars, forms=forms
        )
        for item in made:
            shown[item.index] = chars(item.replacement)
        total = sum(shown)
    count = turns = 0
    if total > budget:
        # Down to B less the headroom, as rung 1 trims: turns left out stay out while the view
        # grows, so the next turns append without another rung (a prefix change) each time.
        headroom = int(budget * TRIM_HEADROOM)
        count, turns = turns_to_leave_out(
            view, shown, head=head, turn_start=turn_start, excess=total - budget + headroom
        )
        total -= sum(shown[head : head + count])
    drop = total > budget and head > prefix_len
    if drop:
        total -= shown[head - 1]
    return Fit(made, count, turns, drop, total)
