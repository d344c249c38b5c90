"""The closed sets of names more than one room speaks (docs/design.md §16b).

Each set is a ``typing.Literal``: the value *is* the string that goes on the wire, into the
store and into ``TurnReport``, so nothing converts at a boundary and rows read back compare
as they were written, while mypy (strict equality) refuses a typo wherever a value is made
or compared. A set one room alone uses lives in that room (``gates.cut.NotDue``,
``llm.client.Phase``, ``longterm.batch.ExtractionStatus``, ``audit.probes.Outcome``).
"""

from __future__ import annotations

from typing import Literal, NewType, TypeAlias

# Why gate 2's planner will not cut the view (``gates.cut.plan_cut``).
CutSkip: TypeAlias = Literal[
    "last_not_user", "no_safe_cut", "empty_material", "not_worth_it", "orphan_in_tail"
]
# Why a planned compaction did not apply when it was run (``engine.compaction.Compactions``).
RunSkip: TypeAlias = Literal["in_progress", "timeout", "failed", "cooling_down", "closed"]
# Why the history no longer matches what the summary covers (``engine.raw.RawCache``): the
# summary is dropped and the drop audited with this reason.
InvalidationReason: TypeAlias = Literal["history_shorter", "prefix_changed", "history_edited"]
# ``TurnReport.skipped_reason``: why a due compaction did not apply; ``applied`` when only the
# ceiling's mid-turn compaction ran and applied.
SkipReason: TypeAlias = CutSkip | RunSkip | Literal["history_edited", "applied"]

# The ``compactions`` table's ``status`` (the schema checks the same three).
AuditStatus: TypeAlias = Literal["applied", "failed", "invalidated"]
# The ``compactions`` table's ``reason``: ``over_trigger`` for ``applied``; ``stale``,
# ``cooling_down`` or the failure's exception class name (an ``ErrorName``) for ``failed``; an
# ``InvalidationReason`` for ``invalidated``.
AuditReason: TypeAlias = Literal["over_trigger", "stale", "cooling_down"] | InvalidationReason
ErrorName = NewType("ErrorName", str)  # ``type(err).__name__`` of a failed compaction

# Who wrote a summary (``SummaryOutcome.written_by``, the audit's ``written_by``); "" when not
# said (rows that never reached a summarizer).
WrittenBy: TypeAlias = Literal["model", "offline", "offline_fallback", ""]

# A sticky substitution's kind: a trim placeholder, a head/tail preview, a turn's recall block.
SubstitutionKind: TypeAlias = Literal["trim", "truncate", "recall"]

# The ``memories`` table's ``kind`` and ``status`` (the schema checks the same values).
MemoryKind: TypeAlias = Literal["fact", "summary"]
MemoryStatus: TypeAlias = Literal["active", "superseded", "retracted", "evicted"]
