"""One extraction batch (docs/design.md §9; Ragent ``AgentUserMemoryMiddleware``): durable facts about
a user learnt in the background from their pending messages, fitted under the block's cap
(``plan_batch``) and committed atomically."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs

from ragent_memory.core.logs import get_logger
from ragent_memory.core.records import Draft, Fact, Plan
from ragent_memory.errors import ExtractionError, LLMError, StoreError
from ragent_memory.longterm.operations import apply_operations, merge_drafts
from ragent_memory.longterm.vocabulary import (
    Extraction,
    ExtractionRequest,
    Extractor,
    Merge,
    Operation,
    block_chars,
)
from ragent_memory.settings import TRANSCRIPT_CLIP_OVER_CHARS, Settings

if TYPE_CHECKING:
    from ragent_memory.core.records import PendingMessage
    from ragent_memory.store import MemoryStore

log = get_logger(__name__)

MAX_BATCH_MESSAGES: Final = 32  # pending user messages read by one extraction
MAX_ATTEMPTS: Final = 3  # a batch failing this often is dropped


@attrs.frozen
class Rejected:
    """The batch cannot fit the block even after consolidation and eviction."""

    reason: str


def plan_batch(
    facts: Sequence[Fact],
    operations: Sequence[Operation],
    *,
    max_chars: int,
    stop_chars: int,
    language: str,
    consolidate: Callable[[Sequence[Draft]], Sequence[Merge]] | None = None,
) -> Plan | Rejected:
    """Apply ``operations`` to ``facts`` and fit the block (docs/design.md §9 capacity): over
    ``max_chars``, one ``consolidate`` (aiming at ``stop_chars``), then the oldest untouched
    drafts evicted down to ``stop_chars``; still over: ``Rejected``."""
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


# What one extraction batch came to; ``idle``: nothing was pending.
ExtractionStatus: TypeAlias = Literal["applied", "failed", "rejected", "idle"]


@attrs.frozen
class ExtractionReport:
    """What one :func:`run_extraction` did."""

    status: ExtractionStatus
    messages: int = 0
    added: int = 0
    superseded: int = 0
    retracted: int = 0
    rejected_items: int = 0
    merged: int = 0
    evicted: int = 0
    dropped: int = 0  # pending messages given up on after MAX_ATTEMPTS
    facts: int = 0  # active facts afterwards
    chars: int = 0  # the block (facts only) afterwards
    error: str | None = None


def run_extraction(
    store: MemoryStore, extractor: Extractor, user_id: str, *, settings: Settings
) -> ExtractionReport:
    """Learn from one batch of the user's pending messages and commit the result atomically;
    a failed or rejected batch stays pending, and is dropped after ``MAX_ATTEMPTS``."""
    started = time.perf_counter()
    batch = _fitting(store.pending_messages(user_id, limit=MAX_BATCH_MESSAGES), settings)
    if not batch:
        return ExtractionReport("idle")
    ids = [p.id for p in batch]
    try:
        extraction, plan = _plan(store, extractor, user_id, batch, settings)
        if isinstance(plan, Rejected):
            return _give_up(store, user_id, ids, "rejected", plan.reason)
        store.commit_memories(user_id, ids, plan, session_id=batch[-1].session_id)
    except (ExtractionError, LLMError, StoreError) as err:
        return _give_up(store, user_id, ids, "failed", str(err))
    report = ExtractionReport(
        "applied",
        messages=len(batch),
        added=plan.added,
        superseded=plan.superseded,
        retracted=len(plan.retracted),
        rejected_items=extraction.rejected,
        merged=plan.merged,
        evicted=len(plan.evicted),
        facts=len(plan.drafts),
        chars=plan.chars,
    )
    _log_applied(user_id, report, extraction, plan, int((time.perf_counter() - started) * 1000))
    return report


def _plan(
    store: MemoryStore,
    extractor: Extractor,
    user_id: str,
    batch: Sequence[PendingMessage],
    settings: Settings,
) -> tuple[Extraction, Plan | Rejected]:
    """The extractor's operations on the user's facts, and the batch planned from them."""
    facts = store.facts(user_id)
    language = settings.language
    extraction = extractor.extract(
        ExtractionRequest(tuple(facts), tuple(p.content for p in batch), language)
    )
    target = settings.memory_consolidate_chars
    plan = plan_batch(
        facts,
        extraction.operations,
        max_chars=settings.memory_max_chars,
        stop_chars=target,
        language=language,
        consolidate=partial(extractor.consolidate, target_chars=target, language=language),
    )
    return extraction, plan


def _log_applied(
    user_id: str, report: ExtractionReport, extraction: Extraction, plan: Plan, duration_ms: int
) -> None:
    log.info(
        "memory.extracted",
        user_id=user_id,
        messages=report.messages,
        added=report.added,
        superseded=report.superseded,
        retracted=report.retracted,
        rejected=report.rejected_items,
        facts=report.facts,
        chars=report.chars,
        model=extraction.model,
        attempts=extraction.attempts,
        duration_ms=duration_ms,
    )
    if plan.is_consolidated:
        log.info(
            "memory.consolidated",
            user_id=user_id,
            merged=plan.merged,
            chars_before=plan.chars_before,
            chars_after=plan.chars_consolidated,
        )
    if plan.evicted:
        log.info("memory.evicted", user_id=user_id, evicted=len(plan.evicted), chars=plan.chars)


def _fitting(batch: Sequence[PendingMessage], settings: Settings) -> list[PendingMessage]:
    """The oldest messages of ``batch`` whose prompt fits the model's input (all of them
    offline); the rest wait for the next batch."""
    if settings.llm is None:
        return list(batch)
    room = settings.llm.max_input_chars - settings.memory_max_chars - 4_000  # facts, prompt
    out: list[PendingMessage] = []
    for message in batch:
        room -= min(len(message.content), TRANSCRIPT_CLIP_OVER_CHARS + 40) + 10
        if out and room < 0:
            break
        out.append(message)
    return out


def _give_up(
    store: MemoryStore,
    user_id: str,
    ids: Sequence[int],
    status: Literal["failed", "rejected"],
    error: str,
) -> ExtractionReport:
    """A batch that did not apply: its attempts counted, dropped after ``MAX_ATTEMPTS``."""
    try:
        dropped = store.fail_pending(user_id, ids, max_attempts=MAX_ATTEMPTS)
    except StoreError as err:
        log.error("memory.fail_write_failed", user_id=user_id, error=repr(err))
        dropped = 0
    event = "memory.rejected" if status == "rejected" else "memory.failed"
    log.warning(event, user_id=user_id, messages=len(ids), error=error, dropped=dropped)
    if dropped:
        log.error("memory.dropped", user_id=user_id, messages=dropped, attempts=MAX_ATTEMPTS)
    return ExtractionReport(status, len(ids), dropped=dropped, error=error)
