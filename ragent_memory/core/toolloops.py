"""Tool loops: an assistant message with tool calls plus the tool messages answering it.

Provider-level oddities (orphan results, duplicate call ids, unanswered calls) are tolerated:
such messages are marked irregular so the gates never evict or cut them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs


@attrs.frozen
class ToolLoop:
    call_index: int
    result_indexes: tuple[int, ...]
    tool_names: Mapping[str, str]  # call id -> tool name
    is_complete: bool  # every call answered exactly once, no duplicate ids


@attrs.frozen
class LoopMap:
    loops: tuple[ToolLoop, ...]
    orphan_indexes: frozenset[int]  # tool results that answer no call of their loop
    duplicate_ids: frozenset[str]

    @property
    def irregular(self) -> dict[str, int]:
        """Counts of the oddities present (empty when the history is regular)."""
        counts = {
            "orphan_results": len(self.orphan_indexes),
            "duplicate_call_ids": len(self.duplicate_ids),
            "incomplete_loops": sum(1 for loop in self.loops if not loop.is_complete),
        }
        return {name: count for name, count in counts.items() if count}


def map_loops(view: Sequence[Mapping[str, Any]]) -> LoopMap:
    """Split a view into tool loops; results are the tool messages right after the call."""
    seen: set[str] = set()
    duplicates: set[str] = set()
    for message in view:
        for call in message.get("tool_calls") or ():
            call_id = call.get("id")
            if call_id in seen:
                duplicates.add(call_id)
            seen.add(call_id)
    loops: list[ToolLoop] = []
    orphans: set[int] = set()
    i, n = 0, len(view)
    at = view.__getitem__
    while i < n:
        message = view[i]
        role = message.get("role")
        calls = message.get("tool_calls") if role == "assistant" else None
        if not calls:
            if role == "tool":
                orphans.add(i)
            i += 1
            continue
        loop, i = loop_at(at, i, n, calls, duplicates, orphans)
        loops.append(loop)
    return LoopMap(tuple(loops), frozenset(orphans), frozenset(duplicates))


def loop_at(
    at: Callable[[int], Mapping[str, Any]],
    i: int,
    n: int,
    calls: Sequence[Mapping[str, Any]],
    duplicates: AbstractSet[Any],
    orphans: set[int],
) -> tuple[ToolLoop, int]:
    """The loop of the assistant message at ``i`` (its ``calls``): the tool messages right
    after it, up to ``n``, are its results (those answering none of its calls go to
    ``orphans``). Returns it and the index after its results."""
    names = {c["id"]: (c.get("function") or {}).get("name", "") for c in calls}
    answered: dict[str, int] = {}
    results: list[int] = []
    j = i + 1
    while j < n and at(j).get("role") == "tool":
        call_id = at(j).get("tool_call_id")
        if isinstance(call_id, str) and call_id in names:
            answered[call_id] = answered.get(call_id, 0) + 1
            results.append(j)
        else:
            orphans.add(j)
        j += 1
    complete = (
        len(names) == len(calls)
        and len(answered) == len(names)
        and all(count == 1 for count in answered.values())
        and duplicates.isdisjoint(names)
    )
    return ToolLoop(i, tuple(results), names, complete), j


def last_user_index(view: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last user message, or -1."""
    for index in range(len(view) - 1, -1, -1):
        if view[index].get("role") == "user":
            return index
    return -1
