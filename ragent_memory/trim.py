"""Gate 1, trim (DESIGN §4; Ragent ``AgentContextTrimmer``).

Above the trim trigger, old results of evictable tools become short placeholders that keep the
original length, a clipped copy of the call's input and a recall ref. Only tool-result content
changes: the message count, roles, ids and every tool call stay as they are, so no orphan can
appear. All replacements are computed before any is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from .chars import Message, chars, text_of
from .loops import ToolLoop, last_user_index, map_loops
from .settings import EVICTED_INPUT_EXCERPT_CHARS, KEEP_RECENT_TOOL_LOOPS, MIN_TRIM_RECLAIM_RATIO

PLACEHOLDERS = {
    "en": "[Earlier tool result omitted: {n} chars originally; input: {args}; recall: {ref}]",
    "zh": "[历史工具结果已省略，原长 {n} 字符，原入参 {args}，召回编号 {ref}]",
}


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


@attrs.frozen
class TrimResult:
    messages: list[Message]
    evictions: tuple[Eviction, ...] = ()
    reclaimed_chars: int = 0
    skipped_reason: str | None = None
    # What a later turn needs to know to skip a trim that cannot pay off: the chars the
    # candidates free (evicted or not), and the index from which protection can still change
    # as the conversation grows (before it, nothing can become a candidate).
    reclaimable_chars: int = 0
    recent_start: int = 0
    # Provider-level oddities seen (orphan results, duplicate ids, unanswered loops): tolerated,
    # never evicted, reported so the engine can warn once.
    irregular: Mapping[str, int] = attrs.field(factory=dict)


def recent_start(view: Sequence[Mapping[str, Any]], loops: Sequence[ToolLoop]) -> int:
    """Where protection may still change: the earliest of the last completed loops kept before
    the current turn (or the current turn itself). Without a user message, everything."""
    last_user = last_user_index(view)
    if last_user < 0:
        return 0
    earlier = [
        loop.call_index for loop in loops if loop.call_index < last_user and loop.is_complete
    ]
    window = earlier[-KEEP_RECENT_TOOL_LOOPS:]
    return window[0] if window else last_user


def protected_loops(view: Sequence[Mapping[str, Any]], loops: Sequence[ToolLoop]) -> set[int]:
    """Call indexes of loops the trim must not touch."""
    last_user = last_user_index(view)
    if last_user < 0:
        return {loop.call_index for loop in loops}
    protected = {loop.call_index for loop in loops if loop.call_index > last_user}
    protected |= {loop.call_index for loop in loops if not loop.is_complete}
    earlier = [loop for loop in loops if loop.call_index < last_user and loop.is_complete]
    protected |= {loop.call_index for loop in earlier[-KEEP_RECENT_TOOL_LOOPS:]}
    return protected


@attrs.frozen
class Candidates:
    """What a trim could do now: the evictions it would make and what they would free."""

    evictions: tuple[Eviction, ...]
    reclaim_chars: int
    recent_start: int  # see :func:`recent_start`
    irregular: Mapping[str, int]


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


def find_candidates(
    view: Sequence[Message],
    *,
    evictable_tools: Collection[str],
    language: str,
    ref_for: Callable[[str], str],
    sizes: Sequence[int],
    originals: Mapping[int, Message] | None = None,
    evicted: Collection[int] = (),
) -> Candidates:
    """Old results of evictable tools outside every protected loop, with their placeholders.

    Works on any stretch of a view that starts at a loop boundary and runs to its end, which
    lets the engine look only at what changed since the last trim.
    """
    originals = originals or {}
    loop_map = map_loops(view)
    protected = protected_loops(view, loop_map.loops)
    planned: list[Eviction] = []
    reclaim = 0
    for loop in loop_map.loops:
        if loop.call_index in protected:
            continue
        calls = {c["id"]: c for c in view[loop.call_index].get("tool_calls") or ()}
        for index in loop.result_indexes:
            shown = view[index]
            if index in evicted:
                continue
            call_id = shown["tool_call_id"]
            if loop.tool_names.get(call_id) not in evictable_tools:
                continue
            arguments = (calls[call_id].get("function") or {}).get("arguments") or ""
            eviction = evict(
                shown,
                index,
                originals.get(index, shown),
                arguments,
                sizes[index],
                language,
                ref_for,
            )
            if eviction is None:
                continue
            planned.append(eviction)
            reclaim += sizes[index] - chars(eviction.replacement)
    return Candidates(
        tuple(planned), reclaim, recent_start(view, loop_map.loops), loop_map.irregular
    )


def trim(
    view: Sequence[Message],
    *,
    trigger_chars: int,
    evictable_tools: Collection[str],
    language: str,
    ref_for: Callable[[str], str],
    originals: Mapping[int, Message] | None = None,
    evicted: Collection[int] = (),
    sizes: Sequence[int] | None = None,
) -> TrimResult:
    """Replace old evictable tool results by placeholders when the view exceeds the trigger.

    ``originals`` maps view indexes already shown in another form (a truncation preview) to
    the caller's message; ``evicted`` lists view indexes that already are placeholders;
    ``sizes``, when given, are ``chars`` of each view message (the engine knows them).
    """
    sizes = sizes if sizes is not None else [chars(m) for m in view]
    current = sum(sizes)
    if current <= trigger_chars:
        return TrimResult(list(view))
    found = find_candidates(
        view,
        evictable_tools=evictable_tools,
        language=language,
        ref_for=ref_for,
        sizes=sizes,
        originals=originals,
        evicted=evicted,
    )
    hints = partial(
        TrimResult,
        reclaimable_chars=found.reclaim_chars,
        recent_start=found.recent_start,
        irregular=found.irregular,
    )
    if not found.evictions:
        return hints(list(view), skipped_reason="nothing_evictable")
    if not worth_it(found.reclaim_chars, current):
        return hints(list(view), skipped_reason="not_worth_it")
    trimmed = list(view)
    for eviction in found.evictions:
        trimmed[eviction.index] = eviction.replacement
    return hints(trimmed, found.evictions, found.reclaim_chars)


def worth_it(reclaim_chars: int, total_chars: int) -> bool:
    """The 20% rule: a trim that frees less than 20% of the total is skipped whole."""
    return reclaim_chars >= MIN_TRIM_RECLAIM_RATIO * total_chars
