"""Gate 2, compaction (DESIGN §5; Ragent ``AgentContextCompactor`` + middleware).

``plan`` decides whether and where to cut (pure). ``run`` executes one planned compaction: it
asks the summarizer for the next generation, adds the user's own words, commits the session
state in one transaction, keeps the summary as a memory of the user (cross-session, DeepFlux)
and writes the audit row (a failure of either only logs). It runs on the engine's dedicated
thread pool; any failure leaves the session as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import structlog

from .chars import Message
from .errors import RagentMemoryError, StoreError
from .longterm import index_terms, summary_chunks
from .loops import map_loops
from .settings import Settings
from .store import SessionState, Store
from .summarize import (
    Summarizer,
    SummaryRequest,
    fit_summary,
    render_verbatim,
    update_verbatim,
)

log = structlog.get_logger(__name__)

SUMMARY_HEADERS = {
    "en": (
        "[Summary of earlier turns — generated automatically, lossy] This is background on the "
        "conversation so far, not a new instruction. The messages after it are the latest "
        "turns; the user's most recent message is the current request."
    ),
    "zh": (
        "[早期对话摘要——自动生成，有损] 以下是此前对话的背景信息，不是新的指令。其后的消息是最近的对话，"
        "用户的最新消息才是当前请求。"
    ),
}


def summary_message(summary: str, language: str) -> Message:
    """The message that stands for the covered turns: role ``user``, header + summary."""
    return {"role": "user", "content": f"{SUMMARY_HEADERS[language]}\n\n{summary}"}


@attrs.frozen
class Plan:
    cut: int  # view index of the first kept message (a user message)
    head: int  # view index of the first material message
    total_chars: int
    material_chars: int
    kept_chars: int


def plan(
    view: Sequence[Message], sizes: Sequence[int], *, head: int, settings: Settings
) -> Plan | str:
    """Where to cut, or why not (a skip reason). ``head`` is the first message after the
    prefix and any current summary."""
    total = sum(sizes)
    if total <= settings.compact_trigger_chars:
        return "below_trigger"
    if not view or view[-1].get("role") != "user":
        return "last_not_user"  # tool loops still open: wait for the next user message
    kept = 0
    point = len(view)
    while point > head and kept < settings.keep_recent_chars:
        point -= 1
        kept += sizes[point]
    cut = point
    while cut > head and view[cut].get("role") != "user":
        cut -= 1
    if cut <= head:
        return "no_safe_cut"
    material_chars = sum(sizes[head:cut])
    if material_chars == 0:
        return "empty_material"
    if material_chars * 2 < total:
        return "not_worth_it"
    tail = view[cut:]
    if map_loops(tail).orphan_indexes:
        return "orphan_in_tail"
    return Plan(cut, head, total, material_chars, total - material_chars)


class StaleCompaction(RagentMemoryError):
    """A finished summary whose session moved on meanwhile; it is not committed."""


@attrs.frozen
class Job:
    """Everything a worker needs, captured on the caller's thread."""

    previous: SessionState
    user_id: str | None
    material: tuple[tuple[int, Message], ...]  # (raw index, caller's original message)
    prefix_len: int
    new_covered: int
    covered_digest: str
    plan: Plan
    prefix_chars: int


def run(
    job: Job,
    *,
    summarizer: Summarizer,
    store: Store,
    settings: Settings,
    emit: Callable[[str, dict[str, Any]], None],
) -> SessionState | None:
    """Summarize, commit, audit. Returns the new state, or None when the compaction failed."""
    started = time.perf_counter()
    previous = job.previous
    generation = previous.last_generation + 1
    session_id = previous.session_id
    language = settings.language
    verbatim = update_verbatim(previous.verbatim, job.material)
    block = render_verbatim(verbatim, budget=settings.verbatim_max_chars, language=language)
    body_budget = settings.summary_max_chars - len(block) - 2
    material = tuple(m for _, m in job.material)
    base = {
        "session_id": session_id,
        "user_id": job.user_id,
        "generation": generation,
        "material_messages": len(material),
        "material_chars": job.plan.material_chars,
        "chars_before": job.plan.total_chars,
    }
    emit("before_summarize", {**base})
    summary_name = summarizer.name
    try:
        outcome = summarizer.summarize(
            SummaryRequest(material, previous.body, language, body_budget)
        )
        summary_name = outcome.model
        body, summary = fit_summary(outcome.body, block, language, settings.summary_max_chars)
        state = SessionState(
            session_id=session_id,
            user_id=job.user_id,
            generation=generation,
            last_generation=generation,
            summary=summary,
            body=body,
            prefix_len=job.prefix_len,
            covered=job.new_covered,
            covered_digest=job.covered_digest,
            verbatim=verbatim,
        )
        if not store.commit_generation(state, previous):
            raise StaleCompaction(
                "the session changed while summarizing (invalidated, compacted or dropped)"
            )
    except Exception as err:  # the worker boundary: any failure is audited, never raised
        duration_ms = int((time.perf_counter() - started) * 1000)
        attempts = getattr(err, "attempts", 0)
        log.warning("compaction.failed", **base, error=str(err), duration_ms=duration_ms)
        write_audit(
            store,
            {
                **base,
                "status": "failed",
                "reason": "stale" if isinstance(err, StaleCompaction) else type(err).__name__,
                "model": summary_name,
                "attempts": attempts,
                "chars_after": job.plan.total_chars,
                "duration_ms": duration_ms,
                "error": str(err),
            },
        )
        emit("after_summarize", {**base, "status": "failed", "error": str(err)})
        return None
    if settings.long_term_enabled and job.user_id:
        remember_summary(store, job.user_id, state)
    duration_ms = int((time.perf_counter() - started) * 1000)
    chars_after = (
        job.prefix_chars
        + len(summary_message(summary, language)["content"])
        + (job.plan.kept_chars)
    )
    log.info(
        "compaction.applied",
        **base,
        summary_chars=len(summary),
        chars_after=chars_after,
        chars_in=job.plan.total_chars,  # the TurnReport names, for log queries
        chars_out=chars_after,
        duration_ms=duration_ms,
        model=summary_name,
    )
    write_audit(
        store,
        {
            **base,
            "status": "applied",
            "reason": "over_trigger",
            "model": summary_name,
            "attempts": outcome.attempts,
            "summary_chars": len(summary),
            "chars_after": chars_after,
            "duration_ms": duration_ms,
            "summary": summary,
        },
    )
    emit("after_summarize", {**base, "status": "applied", "summary_chars": len(summary)})
    return state


def remember_summary(store: Store, user_id: str, state: SessionState) -> None:
    """Keep an applied summary as a ``summary`` memory of the user, indexed by its excerpts,
    so the user's other sessions can draw on it. A failure only logs: the compaction stands."""
    excerpts = [(index_terms(e), e) for e in summary_chunks(state.summary)]
    try:
        store.record_summary(user_id, state.session_id, state.generation, state.summary, excerpts)
    except StoreError as err:
        log.error(
            "memory.summary_write_failed",
            session_id=state.session_id,
            generation=state.generation,
            error=repr(err),
        )


def write_audit(store: Store, row: Mapping[str, Any]) -> None:
    """Append an audit row; a failure is logged (``audit.write_failed``), never raised."""
    try:
        store.audit(dict(row))
    except Exception as err:  # the audit boundary: a failed audit never undoes a compaction
        log.error(
            "audit.write_failed",
            session_id=row.get("session_id"),
            generation=row.get("generation"),
            error=repr(err),
        )
