"""Gate 2's decision (docs/design.md §5): whether and where to cut a view for a compaction (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import attrs

from ragent_memory.core.chars import Message
from ragent_memory.core.names import CutSkip
from ragent_memory.core.toolloops import map_loops
from ragent_memory.settings import Settings

# The planner's answer when the view is under the trigger: nothing is due, so it is no skip
# and never reaches the turn report.
NotDue: TypeAlias = Literal["below_trigger"]


@attrs.frozen
class CutPlan:
    """Where a compaction cuts the view, with the figures its audit row starts from."""

    cut: int  # view index of the first kept message (a user message)
    head: int  # view index of the first material message shown (turns left out before it too)
    total_chars: int
    material_chars: int  # the material as shown in the view (placeholders, previews)
    kept_chars: int  # the kept tail from ``cut`` on, as shown


def plan_cut(
    view: Sequence[Message],
    sizes: Sequence[int],
    *,
    head: int,
    settings: Settings,
    mid_turn: bool = False,
    left_out_chars: int = 0,
) -> CutPlan | CutSkip | NotDue:
    """Where to cut, or why not (a skip reason, or ``below_trigger``: not due). ``head``: the first message after the prefix
    and any summary. ``left_out_chars``: whole turns the ceiling left out just before ``head``
    (§4b step 4); they count in the total and are material, so mid-turn ``head`` itself may
    be the cut. ``mid_turn`` (§4b step 2, the view over B): the last message may be a tool
    result, the cut may be the current turn's user message, and any material is worth it."""
    total = sum(sizes) + left_out_chars
    if total <= settings.compact_trigger_chars:
        return "below_trigger"
    if not view or (view[-1].get("role") != "user" and not mid_turn):
        return "last_not_user"  # tool loops still open: wait for the next user message
    kept = 0
    point = len(view)
    while point > head and kept < settings.keep_recent_chars:
        point -= 1
        kept += sizes[point]
    cut = point
    while cut > head and view[cut].get("role") != "user":
        cut -= 1
    only_left_out = (
        mid_turn
        and left_out_chars > 0
        and head == cut < len(view)
        and view[cut].get("role") == "user"
    )
    if cut <= head and not only_left_out:
        return "no_safe_cut"
    material_chars = left_out_chars + sum(sizes[head:cut])
    skip: CutSkip | None = (
        "empty_material"
        if material_chars == 0
        else "not_worth_it"
        if material_chars * 2 < total and not mid_turn
        else "orphan_in_tail"
        if map_loops(view[cut:]).orphan_indexes
        else None
    )
    return skip or CutPlan(cut, head, total, material_chars, sum(sizes[cut:]))
