"""Planning a batch (DESIGN §9 capacity): the operations applied to the facts, then the block
fitted under its cap — one consolidation toward 0.75 × cap, then eviction of the oldest facts
the batch did not touch (never below that stop), else the batch is ``Rejected``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ragent_memory.core.records import Draft, Fact, Plan
from ragent_memory.longterm.operations import apply_operations, merge_drafts
from ragent_memory.longterm.vocabulary import Merge, Operation, block_chars


@attrs.frozen
class Rejected:
    """The batch cannot fit the block even after consolidation and eviction."""

    reason: str


Consolidate = Callable[[Sequence[Draft]], Sequence[Merge]]


def plan_batch(
    facts: Sequence[Fact],
    operations: Sequence[Operation],
    *,
    max_chars: int,
    stop_chars: int,
    language: str,
    consolidate: Consolidate | None = None,
) -> Plan | Rejected:
    """Apply ``operations`` to ``facts`` and fit the block (DESIGN §9 capacity).

    Over ``max_chars``: one ``consolidate`` call (which aims at ``stop_chars``); still over:
    evict the oldest drafts this batch did not touch while the block is over ``stop_chars``;
    still over ``max_chars``: ``Rejected``.
    """
    drafts, retracted, added, superseded = apply_operations(facts, operations)
    chars_before = chars = block_chars(drafts, language)
    merged = 0
    is_consolidated = False
    if chars > max_chars and consolidate is not None:
        drafts, merged = merge_drafts(drafts, consolidate(drafts))
        chars = block_chars(drafts, language)
        is_consolidated = True
    chars_consolidated = chars
    evicted: set[int] = set()
    if chars > max_chars:
        for victim in sorted((d for d in drafts if not d.is_touched), key=lambda d: d.order):
            if chars <= stop_chars:
                break
            drafts.remove(victim)
            evicted |= victim.sources
            chars = block_chars(drafts, language)
        if chars > max_chars:
            return Rejected(
                f"the facts this batch touches need {chars} chars, over the {max_chars} cap"
            )
    return Plan(
        tuple(drafts),
        retracted,
        frozenset(evicted),
        added,
        superseded,
        merged,
        chars_before,
        chars_consolidated,
        chars,
        is_consolidated,
    )
