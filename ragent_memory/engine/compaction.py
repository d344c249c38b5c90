"""Gate 2, compaction (docs/design.md §5; Ragent ``AgentContextCompactor`` + middleware).

``gates.cut.plan_cut`` decides whether and where to cut (pure). ``Compactions`` holds
one session's compaction in flight: leased in the store, run on the engine's pool, waited for
at most ``compaction_timeout_s``. ``run`` executes one planned compaction in three steps:
``summarize`` asks the summarizer for the next generation and adds the user's own words (a
``SummaryDraft`` carrying the audit figures, computed once); ``commit`` writes the session
state and its ``applied`` audit row in one transaction; then the summary is kept as a memory
of the user (cross-session, DeepFlux; a failure only logs). It runs on the engine's dedicated
thread pool; any failure is audited ``failed`` and leaves the session as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ragent_memory.core import tracing
from ragent_memory.core.chars import Message, chars
from ragent_memory.core.logs import get_logger
from ragent_memory.core.names import ErrorName, InvalidationReason, RunSkip, WrittenBy
from ragent_memory.core.provenance import INSTRUCTION_ROLES, Markers, latest_standing
from ragent_memory.core.records import AuditRow
from ragent_memory.errors import RagentMemoryError, StoreError
from ragent_memory.gates.cut import CutPlan
from ragent_memory.longterm.vocabulary import summary_chunks
from ragent_memory.settings import Settings
from ragent_memory.store import (
    AuditLog,
    LeaseStore,
    MemoryStore,
    SessionState,
    SessionStore,
)
from ragent_memory.summary import retention
from ragent_memory.summary.preserved import render_preserved, update_preserved
from ragent_memory.summary.summarize import (
    ModelSummarizer,
    Summarizer,
    SummaryOutcome,
    SummaryRequest,
)
from ragent_memory.summary.verbatim import (
    compose_summary,
    fit_summary,
    render_verbatim,
    update_verbatim,
)
from ragent_memory.text.terms import index_terms

log = get_logger(__name__)


class AuditedStates(SessionStore, AuditLog, Protocol):
    """What dropping a summary writes: the session's fresh state, its audit row."""


class CompactionStore(AuditedStates, MemoryStore, Protocol):
    """What a compaction job writes: the new generation with its audit row, and the summary's
    copy in long-term memory."""


class LeasedAudit(LeaseStore, AuditLog, Protocol):
    """What a session's compactions in flight ask: the lease, and auditing a skipped one."""


SUMMARY_HEADERS = MappingProxyType(
    {
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
)


def summary_message(summary: str, language: str, standing: Sequence[str] = ()) -> Message:
    """The message that stands for the covered turns: role ``user``, header + summary; the
    standing instructions the covered turns carried (CLAUDE.md, AGENTS.md, the environment
    block — ``standing_texts``) go first, each a text part as the harness wrote it."""
    text = f"{SUMMARY_HEADERS[language]}\n\n{summary}"
    if not standing:
        return {"role": "user", "content": text}
    parts = [{"type": "text", "text": t} for t in (*standing, text)]
    return {"role": "user", "content": parts}


def state_message(state: SessionState, language: str) -> Message:
    """The summary message of a session's state, its standing instructions first."""
    return summary_message(state.summary, language, standing_texts(state))


def standing_texts(state: SessionState) -> tuple[str, ...]:
    """The standing instructions a session's summary carries (kept with the preserved tool
    outputs, as ``{"standing": key, "i": raw index, "text": …}`` entries)."""
    return tuple(str(e["text"]) for e in state.preserved if "standing" in e)


class StaleCompaction(RagentMemoryError):
    """A finished summary whose session moved on meanwhile; it is not committed."""


class Leased(RagentMemoryError):
    """Another holder took the session's lease while this compaction waited to run."""


@attrs.frozen
class Job:
    """Everything a worker needs, captured on the caller's thread."""

    previous: SessionState
    user_id: str | None
    material: tuple[tuple[int, Message], ...]  # (raw index, caller's original message)
    prefix_len: int
    new_covered: int
    covered_digest: str
    plan: CutPlan
    # Standing-instruction keys the kept tail holds (a newer version than any covered).
    shown_standing: frozenset[str]
    # The chars_out of the turn that applies this generation, from its summary message's
    # chars: what the audit row's chars_after records (docs/design.md §10).
    chars_out: Callable[[int], int]

    @property
    def material_chars(self) -> int:
        """The raw originals the summarizer is handed (not their placeholders)."""
        return sum(chars(m) for _, m in self.material)


@attrs.frozen
class SummaryDraft:
    """A summarized generation, not committed yet, with the figures its audit row reports."""

    state: SessionState
    model: str
    attempts: int
    material_chars: int  # what the summarizer was actually given
    chars_after: int  # the view once applied: prefix + summary message + kept tail
    identifiers_kept: int = 0  # identifiers of material + previous summary the summary holds
    identifiers_lost: int = 0  # ... and those it lost even after the retention check
    written_by: WrittenBy = ""  # SummaryOutcome.written_by


def carried(job: Job, markers: Markers, tools: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """What the next generation carries verbatim: the latest result of each preserved tool,
    then the latest version of each standing instruction the tail does not show."""
    previous = job.previous.preserved
    outputs = update_preserved([e for e in previous if "tool" in e], job.material, tools)
    standing = latest_standing(
        [e for e in previous if "standing" in e],
        job.material,
        markers,
        shown=job.shown_standing,
    )
    return (*outputs, *standing)


def summarize(job: Job, *, summarizer: Summarizer, settings: Settings) -> SummaryDraft:
    """Ask the summarizer for the next generation and add the user's own words. The
    summarizer reads the user's turns as the user wrote them: the harness's text is not
    summarized (standing instructions are carried whole, the rest is not the conversation)."""
    previous = job.previous
    generation = previous.last_generation + 1
    language = settings.language
    markers = Markers.from_settings(settings)
    said = tuple(
        (i, markers.user_words(m))
        for i, m in job.material
        if m.get("role") not in INSTRUCTION_ROLES  # carried whole (``carried``)
    ) or tuple(job.material)
    verbatim = update_verbatim(previous.verbatim, said)
    block = render_verbatim(verbatim, budget=settings.verbatim_max_chars, language=language)
    preserved = carried(job, markers, settings.preserved_tools)
    outputs = [e for e in preserved if "tool" in e]
    kept = render_preserved(outputs, budget=settings.preserved_max_chars, language=language)
    room = settings.summary_max_chars - (len(kept) + 2 if kept else 0)
    request = SummaryRequest(
        tuple(m for _, m in said),
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
    return SummaryDraft(
        state=state,
        model=outcome.model,
        attempts=outcome.attempts,
        material_chars=sent if sent is not None else job.material_chars,
        chars_after=job.chars_out(chars(state_message(state, language))),
        identifiers_kept=len(wanted) - len(lost),
        identifiers_lost=len(lost),
        written_by=outcome.written_by,
    )


def checked_summary(
    summarizer: Summarizer, request: SummaryRequest, block: str
) -> tuple[SummaryOutcome, list[str]]:
    """The summarizer's outcome through the retention check (docs/design.md §6), and the identifiers
    it had to keep: a repeat of the previous summary while the material is new is asked once
    more, naming what is new, and a second repeat is kept (the previous summary plus nothing);
    with ``llm.retention_retry`` one more model call names what was lost; what is still lost
    (a repeat's new facts included) is appended extractively under the findings section,
    within ``request.max_chars``. By default a compaction costs the model one call."""
    material, previous = request.material, request.previous
    wanted = retention.wanted(material, previous)
    outcome = retention.moved_on(summarizer, request, summarizer.summarize(request))
    attempts = outcome.attempts
    lost = retention.lost(wanted, compose_summary(outcome.body, block, request.language))
    if lost and isinstance(summarizer, ModelSummarizer) and summarizer.retention_retry:
        retry = summarizer.summarize(attrs.evolve(request, lost=tuple(lost)))
        attempts += retry.attempts
        still = retention.lost(wanted, compose_summary(retry.body, block, request.language))
        if len(still) <= len(lost) and not retention.repeated(retry.body, previous, material):
            outcome, lost = retry, still
    if lost:
        sources, tags = retention.tagged_sources(material, previous)
        body = retention.restore(
            outcome.body,
            lost,
            sources,
            language=request.language,
            max_chars=request.max_chars,
            tags=tags,
        )
        outcome = attrs.evolve(outcome, body=body)
    return attrs.evolve(outcome, attempts=attempts), wanted


def commit(
    store: SessionStore, draft: SummaryDraft, previous: SessionState, audit: AuditRow
) -> None:
    """Write the generation and its ``applied`` audit row in one transaction (docs/design.md §10)."""
    if not store.commit_generation(draft.state, previous, audit):
        raise StaleCompaction(
            "the session changed while summarizing (invalidated, compacted or dropped)"
        )


def run(
    job: Job,
    *,
    summarizer: Summarizer,
    store: CompactionStore,
    settings: Settings,
    emit: Callable[[str, dict[str, Any]], None],
) -> SessionState | None:
    """Summarize, then commit with the audit row. Returns the new state, or None when the
    compaction failed (audited ``failed``; the session stays as it was)."""
    base = {
        "session_id": job.previous.session_id,
        "user_id": job.user_id,
        "generation": job.previous.last_generation + 1,
        "material_messages": len(job.material),
        "material_chars": job.material_chars,
        "chars_before": job.plan.total_chars,
        "covered_from": job.material[0][0] if job.material else job.new_covered,
        "covered_to": job.new_covered,
    }
    values = {f"ragent_memory.{k}": v for k, v in base.items()}
    with tracing.span("ragent_memory.compaction", values) as span:
        return _run(
            job, base, span, summarizer=summarizer, store=store, settings=settings, emit=emit
        )


def _run(
    job: Job,
    base: dict[str, Any],
    span: Any,
    *,
    summarizer: Summarizer,
    store: CompactionStore,
    settings: Settings,
    emit: Callable[[str, dict[str, Any]], None],
) -> SessionState | None:
    started = time.perf_counter()
    emit("before_summarize", {**base})
    try:
        draft = summarize(job, summarizer=summarizer, settings=settings)
        summary = draft.state.summary
        applied = attrs.evolve(
            AuditRow(**base, status="applied", reason="over_trigger"),
            model=draft.model,
            attempts=draft.attempts,
            material_chars=draft.material_chars,  # what the summarizer was actually sent
            summary_chars=len(summary),
            chars_after=draft.chars_after,
            identifiers_kept=draft.identifiers_kept,
            identifiers_lost=draft.identifiers_lost,
            written_by=draft.written_by,
            duration_ms=int((time.perf_counter() - started) * 1000),
            summary=summary,
        )
        commit(store, draft, job.previous, applied)
    except Exception as err:  # the worker boundary: any failure is audited, never raised
        fail(store, base, err, model=summarizer.name, started=started)
        emit("after_summarize", {**base, "status": "failed", "error": str(err)})
        tracing.failed(span, type(err).__name__, str(err))
        return None
    if settings.long_term_enabled and job.user_id:
        remember_summary(store, job.user_id, draft.state)
    unlogged = ("status", "reason", "summary", "error")
    fields = {k: v for k, v in attrs.asdict(applied).items() if k not in unlogged}
    tracing.annotate(span, {f"ragent_memory.{k}": v for k, v in fields.items()})
    # chars_in/chars_out: the TurnReport names, for log queries.
    log.info(
        "compaction.applied", **fields, chars_in=job.plan.total_chars, chars_out=draft.chars_after
    )
    emit("after_summarize", {**base, "status": "applied", "summary_chars": len(summary)})
    return draft.state


def fail(
    store: AuditLog, base: Mapping[str, Any], err: Exception, *, model: str, started: float
) -> None:
    """Log and audit a compaction that did not apply."""
    duration_ms = int((time.perf_counter() - started) * 1000)
    log.warning("compaction.failed", **base, error=str(err), duration_ms=duration_ms)
    write_audit(
        store,
        AuditRow(
            **base,
            status="failed",
            reason="stale" if isinstance(err, StaleCompaction) else ErrorName(type(err).__name__),
            model=model,
            attempts=getattr(err, "attempts", 0),
            chars_after=base["chars_before"],
            duration_ms=duration_ms,
            error=str(err),
        ),
    )


def remember_summary(store: MemoryStore, user_id: str, state: SessionState) -> None:
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


def write_audit(store: AuditLog, row: AuditRow) -> None:
    """Append an audit row; a failure is logged (``audit.write_failed``), never raised."""
    try:
        store.audit(row)
    except Exception as err:  # the audit boundary: a failed audit never undoes a compaction
        log.error(
            "audit.write_failed",
            session_id=row.session_id,
            generation=row.generation,
            error=repr(err),
        )


# Submits a function to the engine's compaction pool; None when the engine takes no more work.
Submit = Callable[..., "Future[SessionState | None] | None"]


class Compactions:
    """One session's compaction in flight (at most one, across hosts too: a lease in the
    store, taken when the job starts running, never while it waits in the pool's queue),
    run on the engine's pool. ``start`` waits at most ``compaction_timeout_s``; a generation
    that finishes later is ``finished`` next turn."""

    def __init__(
        self,
        session_id: str,
        *,
        store: LeasedAudit,
        submit: Submit,
        run_kwargs: Mapping[str, Any],
    ) -> None:
        self.session_id = session_id
        self.store = store
        self.submit = submit
        self.run_kwargs = run_kwargs  # summarizer, store, settings, emit
        self.future: Future[SessionState | None] | None = None
        # This session's skip for a model cooling down is audited (once per cooldown).
        self.cooling_audited = False

    @property
    def running(self) -> bool:
        return self.future is not None

    def finished(self) -> SessionState | None:
        """The generation of a compaction that finished after its caller stopped waiting
        (None: none in flight, still running, or it did not apply)."""
        future = self.future
        if future is None or not future.done():
            return None
        self.future = None
        return self._outcome(future)

    def start(self, job: Job, timeout_s: float) -> SessionState | RunSkip:
        """Run ``job`` under the session's lease and wait for it; returns the applied state,
        or why it did not apply (``in_progress``, ``failed``, ``closed``, ``timeout``,
        ``cooling_down``)."""
        session_id = self.session_id
        refused = self._refused(job)
        if refused is not None:
            return refused
        future = self.submit(tracing.carried(self._leased), job)
        if future is None:
            return "closed"
        self.future = future
        if not wait([future], timeout=timeout_s).done:
            log.warning("compaction.timeout", session_id=session_id, timeout_s=timeout_s)
            return "timeout"
        self.future = None
        if isinstance(future.exception(), Leased):
            return "in_progress"
        state = self._outcome(future)
        return "failed" if state is None else state

    def _refused(self, job: Job) -> RunSkip | None:
        """Why ``job`` cannot start now (``cooling_down``, ``in_progress`` while another
        holder has the lease, ``failed`` when the store cannot say), or None."""
        session_id = self.session_id
        if self._cooling_down(job):
            return "cooling_down"
        try:
            if self.store.compaction_leased(session_id):
                log.info("compaction.skipped", session_id=session_id, reason="leased")
                return "in_progress"
        except StoreError as err:
            log.error("compaction.lease_failed", session_id=session_id, error=repr(err))
            return "failed"
        return None

    def _cooling_down(self, job: Job) -> bool:
        """Whether the model summarizer has every endpoint cooling down after repeated
        failures, with no offline fallback: the compaction is skipped, audited ``failed``
        (reason ``cooling_down``) once, then only logged until a retry is due (docs/design.md §7)."""
        summarizer = self.run_kwargs["summarizer"]
        wait_s = summarizer.cooling_down() if isinstance(summarizer, ModelSummarizer) else None
        if wait_s is None:
            self.cooling_audited = False
            return False
        session_id = self.session_id
        log.info("compaction.skipped", session_id=session_id, reason="cooling_down")
        if self.cooling_audited:
            return True
        self.cooling_audited = True
        chars_before = job.plan.total_chars
        error = (
            "every LLM endpoint is cooling down after repeated failures: no compaction until "
            f"a retry is due in {wait_s:.0f} s"
        )
        write_audit(
            self.store,
            AuditRow(
                session_id=session_id,
                user_id=job.user_id,
                generation=job.previous.last_generation + 1,
                status="failed",
                reason="cooling_down",
                model=summarizer.name,
                material_messages=len(job.material),
                material_chars=job.material_chars,
                chars_before=chars_before,
                chars_after=chars_before,
                error=error,
            ),
        )
        return True

    def _leased(self, job: Job) -> SessionState | None:
        """``run`` under the lease, taken now that the job runs (``Leased`` when another
        holder has it) and released before its result is seen (the next host to get the
        session finds the lease free)."""
        session_id = self.session_id
        try:
            if not self.store.claim_compaction(session_id):
                log.info("compaction.skipped", session_id=session_id, reason="leased")
                raise Leased(session_id)
        except StoreError as err:
            log.error("compaction.lease_failed", session_id=session_id, error=repr(err))
            return None
        try:
            return run(job, **self.run_kwargs)
        finally:
            self._release()

    def _release(self) -> None:
        try:
            self.store.release_compaction(self.session_id)
        except StoreError as err:  # the lease expires on its own
            log.error("compaction.release_failed", session_id=self.session_id, error=repr(err))

    def _outcome(self, future: Future[SessionState | None]) -> SessionState | None:
        crash = future.exception()
        if isinstance(crash, Leased):  # another holder compacts it
            return None
        if crash is not None:  # ``run`` audits its own failures: this is a bug
            log.error("compaction.crashed", session_id=self.session_id, error=repr(crash))
            return None
        return future.result()


def invalidate(
    store: AuditedStates, state: SessionState, user_id: str | None, reason: InvalidationReason
) -> SessionState:
    """Drop the summary ``state`` holds (the caller's history no longer matches what it
    covers): the fresh state is saved and the drop audited ``invalidated``."""
    log.warning(
        "compaction.invalidated",
        session_id=state.session_id,
        generation=state.generation,
        reason=reason,
    )
    fresh = SessionState(state.session_id, user_id=user_id, last_generation=state.last_generation)
    try:
        store.save_session(fresh)
    except StoreError as err:  # the caller's history wins either way; retried on restart
        log.error("session.write_failed", session_id=state.session_id, error=repr(err))
    write_audit(
        store,
        AuditRow(
            session_id=state.session_id,
            user_id=user_id,
            generation=state.generation,
            status="invalidated",
            reason=reason,
            summary=state.summary,
            summary_chars=len(state.summary),
        ),
    )
    return fresh
