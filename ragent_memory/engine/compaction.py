"""Gate 2, compaction (DESIGN §5; Ragent ``AgentContextCompactor`` + middleware).

``plan`` decides whether and where to cut (pure). ``run`` executes one planned compaction in
three steps: ``summarize`` asks the summarizer for the next generation and adds the user's own
words (a ``Draft`` carrying the audit figures, computed once); ``commit`` writes the session
state and its ``applied`` audit row in one transaction; then the summary is kept as a memory
of the user (cross-session, DeepFlux; a failure only logs). It runs on the engine's dedicated
thread pool; any failure is audited ``failed`` and leaves the session as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ragent_memory.core.chars import Message, chars
from ragent_memory.core.logs import get_logger
from ragent_memory.core.toolloops import map_loops
from ragent_memory.errors import RagentMemoryError, StoreError, SummaryError
from ragent_memory.longterm.batch import summary_chunks
from ragent_memory.settings import Settings
from ragent_memory.store import Backend, SessionState
from ragent_memory.summary import retention
from ragent_memory.summary.preserved import render_preserved, update_preserved
from ragent_memory.summary.summarize import (
    ModelSummarizer,
    Summarizer,
    SummaryOutcome,
    SummaryRequest,
    compose_summary,
    fit_summary,
    render_verbatim,
    update_verbatim,
)
from ragent_memory.text.terms import index_terms

log = get_logger(__name__)

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
    head: int  # view index of the first material message shown (turns left out before it too)
    total_chars: int
    material_chars: int  # the material as shown in the view (placeholders, previews)
    kept_chars: int  # the kept tail from ``cut`` on, as shown


def plan(
    view: Sequence[Message],
    sizes: Sequence[int],
    *,
    head: int,
    settings: Settings,
    mid_turn: bool = False,
    left_chars: int = 0,
) -> Plan | str:
    """Where to cut, or why not (a skip reason). ``head`` is the first message after the
    prefix and any current summary.

    ``left_chars``: the chars of whole turns the ceiling left out of the view just before
    ``head`` (DESIGN §4b step 4). They count in the total and are material whatever the cut;
    mid-turn, ``head`` itself (a turn's start) may then be the cut: the summary covers them
    and the view keeps the rest (the ceiling's later rungs fit it, as ``Job.settle`` tells).

    ``mid_turn`` is the ceiling's compaction (DESIGN §4b step 2, the view is over B): the last
    message may be a tool result, the cut may be the current turn's user message, and any
    material is worth summarizing."""
    total = sum(sizes) + left_chars
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
        mid_turn and left_chars > 0 and head == cut < len(view) and view[cut].get("role") == "user"
    )
    if cut <= head and not only_left_out:
        return "no_safe_cut"
    material_chars = left_chars + sum(sizes[head:cut])
    if material_chars == 0:
        return "empty_material"
    if material_chars * 2 < total and not mid_turn:
        return "not_worth_it"
    tail = view[cut:]
    if map_loops(tail).orphan_indexes:
        return "orphan_in_tail"
    return Plan(cut, head, total, material_chars, sum(sizes[cut:]))


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
    # For a compaction the ceiling runs mid-turn: the turn's chars_out once the ceiling's later
    # rungs have finished it, from the summary message's chars (None: the view as applied).
    settle: Callable[[int], int] | None = None

    @property
    def material_chars(self) -> int:
        """The raw originals the summarizer is handed (not their placeholders)."""
        return sum(chars(m) for _, m in self.material)


@attrs.frozen
class Draft:
    """A summarized generation, not committed yet, with the figures its audit row reports."""

    state: SessionState
    model: str
    attempts: int
    material_chars: int  # what the summarizer was actually given
    chars_after: int  # the view once applied: prefix + summary message + kept tail
    identifiers_kept: int = 0  # identifiers of material + previous summary the summary holds
    identifiers_lost: int = 0  # ... and those it lost even after the retention check


def summarize(job: Job, *, summarizer: Summarizer, settings: Settings) -> Draft:
    """Ask the summarizer for the next generation and add the user's own words."""
    previous = job.previous
    generation = previous.last_generation + 1
    language = settings.language
    verbatim = update_verbatim(previous.verbatim, job.material)
    block = render_verbatim(verbatim, budget=settings.verbatim_max_chars, language=language)
    preserved = update_preserved(previous.preserved, job.material, settings.preserved_tools)
    kept = render_preserved(preserved, budget=settings.preserved_max_chars, language=language)
    room = settings.summary_max_chars - (len(kept) + 2 if kept else 0)
    request = SummaryRequest(
        material_of(job),
        previous.body,
        language,
        room - len(block) - 2,
        input_chars=settings.context_window_chars,
    )
    outcome, wanted = checked_summary(summarizer, request, block)
    body, summary = fit_summary(outcome.body, block, language, room)
    if kept:
        summary = f"{summary}\n\n{kept}"  # after the summary, never summarized
    lost = retention.lost(wanted, summary)
    state = SessionState(
        session_id=previous.session_id,
        user_id=job.user_id,
        generation=generation,
        last_generation=generation,
        summary=summary,
        body=body,
        prefix_len=job.prefix_len,
        covered=job.new_covered,
        covered_digest=job.covered_digest,
        verbatim=verbatim,
        preserved=preserved,
    )
    sent = outcome.material_chars
    return Draft(
        state=state,
        model=outcome.model,
        attempts=outcome.attempts,
        material_chars=sent if sent is not None else job.material_chars,
        chars_after=chars_after(job, chars(summary_message(summary, language))),
        identifiers_kept=len(wanted) - len(lost),
        identifiers_lost=len(lost),
    )


def checked_summary(
    summarizer: Summarizer, request: SummaryRequest, block: str
) -> tuple[SummaryOutcome, list[str]]:
    """The summarizer's outcome through the retention check (DESIGN §6), and the identifiers
    it had to keep: a repeat of the previous summary is retried once and then rejected; on
    the model path one retry names what was lost; what is still lost is appended extractively
    under the findings section, within ``request.max_chars``."""
    material, previous = request.material, request.previous
    wanted = retention.wanted(material, previous)
    outcome = summarizer.summarize(request)
    attempts = outcome.attempts
    try:
        retention.reject_repeat(outcome.body, previous, material)
    except SummaryError as err:
        log.warning("summary.repeat_retried", error=str(err))
        outcome = summarizer.summarize(request)
        attempts += outcome.attempts
        retention.reject_repeat(outcome.body, previous, material)
    lost = retention.lost(wanted, compose_summary(outcome.body, block, request.language))
    if lost and isinstance(summarizer, ModelSummarizer):
        retry = summarizer.summarize(attrs.evolve(request, lost=tuple(lost)))
        attempts += retry.attempts
        still = retention.lost(wanted, compose_summary(retry.body, block, request.language))
        if len(still) <= len(lost):
            try:
                retention.reject_repeat(retry.body, previous, material)
                outcome, lost = retry, still
            except SummaryError:
                pass
    if lost:
        sources = [*reversed(retention.material_texts(material)), previous]
        body = retention.restore(
            outcome.body, lost, sources, language=request.language, max_chars=request.max_chars
        )
        outcome = attrs.evolve(outcome, body=body)
    return attrs.evolve(outcome, attempts=attempts), wanted


def chars_after(job: Job, summary_chars: int) -> int:
    """The chars_out of the turn that applies this compaction."""
    if job.settle is not None:
        return job.settle(summary_chars)
    return job.prefix_chars + summary_chars + job.plan.kept_chars


def commit(store: Backend, draft: Draft, previous: SessionState, audit: Mapping[str, Any]) -> None:
    """Write the generation and its ``applied`` audit row in one transaction (DESIGN §10)."""
    if not store.commit_generation(draft.state, previous, dict(audit)):
        raise StaleCompaction(
            "the session changed while summarizing (invalidated, compacted or dropped)"
        )


def material_of(job: Job) -> tuple[Message, ...]:
    return tuple(m for _, m in job.material)


def run(
    job: Job,
    *,
    summarizer: Summarizer,
    store: Backend,
    settings: Settings,
    emit: Callable[[str, dict[str, Any]], None],
) -> SessionState | None:
    """Summarize, then commit with the audit row. Returns the new state, or None when the
    compaction failed (audited ``failed``; the session stays as it was)."""
    started = time.perf_counter()
    base = {
        "session_id": job.previous.session_id,
        "user_id": job.user_id,
        "generation": job.previous.last_generation + 1,
        "material_messages": len(job.material),
        "material_chars": job.material_chars,
        "chars_before": job.plan.total_chars,
    }
    emit("before_summarize", {**base})
    try:
        draft = summarize(job, summarizer=summarizer, settings=settings)
        summary = draft.state.summary
        applied = {
            **base,
            "status": "applied",
            "reason": "over_trigger",
            "model": draft.model,
            "attempts": draft.attempts,
            "material_chars": draft.material_chars,
            "summary_chars": len(summary),
            "chars_after": draft.chars_after,
            "identifiers_kept": draft.identifiers_kept,
            "identifiers_lost": draft.identifiers_lost,
            "duration_ms": int((time.perf_counter() - started) * 1000),
            "summary": summary,
        }
        commit(store, draft, job.previous, applied)
    except Exception as err:  # the worker boundary: any failure is audited, never raised
        fail(store, base, err, model=summarizer.name, started=started)
        emit("after_summarize", {**base, "status": "failed", "error": str(err)})
        return None
    if settings.long_term_enabled and job.user_id:
        remember_summary(store, job.user_id, draft.state)
    fields = {k: v for k, v in applied.items() if k not in ("status", "reason", "summary")}
    # chars_in/chars_out: the TurnReport names, for log queries.
    log.info(
        "compaction.applied", **fields, chars_in=job.plan.total_chars, chars_out=draft.chars_after
    )
    emit("after_summarize", {**base, "status": "applied", "summary_chars": len(summary)})
    return draft.state


def fail(
    store: Backend, base: Mapping[str, Any], err: Exception, *, model: str, started: float
) -> None:
    """Log and audit a compaction that did not apply."""
    duration_ms = int((time.perf_counter() - started) * 1000)
    log.warning("compaction.failed", **base, error=str(err), duration_ms=duration_ms)
    write_audit(
        store,
        {
            **base,
            "status": "failed",
            "reason": "stale" if isinstance(err, StaleCompaction) else type(err).__name__,
            "model": model,
            "attempts": getattr(err, "attempts", 0),
            "chars_after": base["chars_before"],
            "duration_ms": duration_ms,
            "error": str(err),
        },
    )


def remember_summary(store: Backend, user_id: str, state: SessionState) -> None:
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


def write_audit(store: Backend, row: Mapping[str, Any]) -> None:
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
