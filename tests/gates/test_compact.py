"""Gate 2, compaction: the long simulated session, restart, invalidation, failure, timeout."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from hypothesis import assume, event, given
from hypothesis import strategies as st
from sessions import (
    CountingSummarizer,
    build_history,
    run_session,
    without_recall,
)
from strategies import conversations, texts

from ragent_memory import Settings
from ragent_memory.core.chars import chars
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.memory_engine import MemoryEngine, leading_system_count
from ragent_memory.gates.cut import CutPlan as Plan
from ragent_memory.gates.cut import plan_cut as plan
from ragent_memory.settings import MIN_CONTEXT_WINDOW_CHARS
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest
from ragent_memory.summary.validate import section_count


def assert_valid_context(messages: list[dict[str, Any]]) -> None:
    loops = map_loops(messages)
    assert not loops.orphan_indexes, "orphan tool result in the prepared context"
    assert all(loop.is_complete for loop in loops.loops), "unanswered call in the context"


def test_long_rag_session(make_settings: Callable[..., Settings], db_path: str) -> None:
    """300 turns at B = 40,000: ≥ 3 contiguous generations, every context ≤ B from the first
    turn, valid tool loops, the caller's last message last, summaries within bounds,
    and the turn-1 constraint verbatim at turn 300."""
    settings = make_settings(context_window_chars=40_000)
    engine = MemoryEngine(settings)
    seen: dict[str, Any] = {"last": None}

    def check(turn: int, prepared: Any) -> None:
        assert prepared.report.chars_out <= settings.context_window_chars, f"turn {turn}"
        assert_valid_context(prepared.messages)
        seen["last"] = prepared

    with engine:
        history = run_session(engine, 300, check=check)
        last = seen["last"]
        assert history[-4] == without_recall(last.messages[-1])
        text = "\n".join(str(m.get("content")) for m in last.messages)
        assert "Never exceed 4,321 euros in total." in text
    rows = (
        sqlite3.connect(db_path)
        .execute("SELECT generation, status, summary FROM compactions ORDER BY id")
        .fetchall()
    )
    applied = [r for r in rows if r[1] == "applied"]
    assert len(applied) >= 3
    assert list(range(1, len(applied) + 1)) == [r[0] for r in applied]
    for _, _, summary in applied:
        assert section_count(summary) >= 3
        assert len(summary) <= settings.summary_max_chars


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_restart_resumes_without_summarizing(make_settings: Callable[..., Settings]) -> None:
    """A second engine on the same store continues at the same generation, no new call."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 60)
        history.append({"role": "user", "content": "and now?"})
        before = engine.prepare(history, session_id="s1", user_id="u1")
    assert before.report.generation >= 1
    counting = CountingSummarizer()
    with MemoryEngine(settings, summarizer=counting) as engine:
        rebuilt = [dict(m) for m in history]
        after = engine.prepare(rebuilt, session_id="s1", user_id="u1")
    assert 0 == counting.calls
    assert before.report.generation == after.report.generation
    assert before.messages == after.messages


def test_edit_invalidates_and_rebuilds(
    make_settings: Callable[..., Settings], db_path: str
) -> None:
    """Editing a covered message audits `invalidated` and the summary is rebuilt."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 60)
        history.append({"role": "user", "content": "status?"})
        first = engine.prepare(history, session_id="s1")
        generation = first.report.generation
        assert generation >= 1
        history[1] = {"role": "user", "content": "Plan the offsite. Budget is 9,999 euros."}
        second = engine.prepare(history, session_id="s1")
    rows = (
        sqlite3.connect(db_path)
        .execute("SELECT generation, status, reason FROM compactions ORDER BY id")
        .fetchall()
    )
    assert (generation, "invalidated", "history_edited") in rows
    assert second.report.compacted
    assert generation + 1 == second.report.generation
    text = "\n".join(str(m.get("content")) for m in second.messages)
    assert "9,999 euros" in text
    assert "4,321" not in text


def test_in_place_edit_is_noticed(make_settings: Callable[..., Settings], db_path: str) -> None:
    """An edit made in place on a covered dict also invalidates the summary."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 60)
        history.append({"role": "user", "content": "status?"})
        assert engine.prepare(history, session_id="s1").report.generation >= 1
        history[1]["content"] = "Plan the offsite. No budget limit."
        engine.prepare(history, session_id="s1")
    statuses = [r[0] for r in sqlite3.connect(db_path).execute("SELECT status FROM compactions")]
    assert "invalidated" in statuses


def test_shorter_history_invalidates(make_settings: Callable[..., Settings], db_path: str) -> None:
    """A history shorter than the covered prefix drops the summary."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 60)
        history.append({"role": "user", "content": "status?"})
        assert engine.prepare(history, session_id="s1").report.generation >= 1
        short = history[:3]
        result = engine.prepare(short, session_id="s1")
    assert 0 == result.report.generation
    assert short == result.messages
    reasons = [
        r[0]
        for r in sqlite3.connect(db_path).execute(
            "SELECT reason FROM compactions WHERE status = 'invalidated'"
        )
    ]
    assert ["history_shorter"] == reasons


def test_failing_summarizer_audits_and_returns_trimmed_view(
    make_settings: Callable[..., Settings], db_path: str
) -> None:
    """A failing summarizer yields a `failed` row and a valid context, never an exception."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer(fail=True)) as engine:
        history = run_session(engine, 40)
        history.append({"role": "user", "content": "go on"})
        prepared = engine.prepare(history, session_id="s1")
    assert history[-1] == prepared.messages[-1]
    assert_valid_context(prepared.messages)
    assert 0 == prepared.report.generation
    assert "failed" == prepared.report.skipped_reason
    rows = (
        sqlite3.connect(db_path)
        .execute("SELECT status, error, attempts FROM compactions")
        .fetchall()
    )
    assert rows and all(r[0] == "failed" and "endpoint down" in r[1] and r[2] == 3 for r in rows)


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_timeout_returns_trimmed_view_and_applies_late(
    make_settings: Callable[..., Settings],
) -> None:
    """Past compaction_timeout_s the caller gets the trimmed view; the late summary is applied
    on the next prepare."""
    gate = threading.Event()
    summarizer = CountingSummarizer(gate=gate)
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0.05)
    with MemoryEngine(settings, summarizer=summarizer) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "next?"})
        slow = engine.prepare(history, session_id="s1")
        assert "timeout" == slow.report.skipped_reason
        assert 0 == slow.report.generation
        assert history[-1] == slow.messages[-1]
        busy = engine.prepare(history, session_id="s1")
        assert "in_progress" == busy.report.skipped_reason
        gate.set()
        assert engine.flush(timeout_s=30)  # the late compaction finished, however slow
        history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        late = engine.prepare(history, session_id="s1")
    assert 1 == summarizer.calls
    assert late.report.compacted
    assert 1 == late.report.generation


def test_applied_generation_and_its_audit_row_commit_together(
    make_settings: Callable[..., Settings],
) -> None:
    """When the applied row cannot be written, the generation is not committed either
    (docs/design.md §10: both or neither); the attempt is audited failed and the turn goes on uncompacted."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        engine.store.db.execute(
            "CREATE TRIGGER no_applied BEFORE INSERT ON compactions WHEN NEW.status = 'applied'"
            " BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
        )
        history = run_session(engine, 40)
        history.append({"role": "user", "content": "go"})
        prepared = engine.prepare(history, session_id="s1")
        rows = engine.store.compactions("s1")
        stored = engine.store.load_session("s1")
    assert 0 == prepared.report.generation
    assert "failed" == prepared.report.skipped_reason
    assert stored is None or 0 == stored.generation
    assert rows and {"failed"} == {r["status"] for r in rows}
    assert {"StoreError"} == {r["reason"] for r in rows}


def test_audit_failure_of_a_failed_attempt_only_logs(
    make_settings: Callable[..., Settings],
) -> None:
    """When the audit row of a failed attempt cannot be written, `audit.write_failed` is
    logged and the turn goes on."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer(fail=True)) as engine:

        def broken(row: dict[str, Any]) -> int:
            raise sqlite3.OperationalError("disk I/O error")

        engine.store.audit = broken  # type: ignore[method-assign]
        with structlog.testing.capture_logs() as logs:
            history = run_session(engine, 40)
            history.append({"role": "user", "content": "go"})
            prepared = engine.prepare(history, session_id="s1")
    assert "failed" == prepared.report.skipped_reason
    assert any(e["event"] == "audit.write_failed" for e in logs)


def test_summary_disabled_only_trims(make_settings: Callable[..., Settings], db_path: str) -> None:
    """summary_enabled: false never compacts (the degrade switch)."""
    settings = make_settings(context_window_chars=20_000, summary_enabled=False)
    with MemoryEngine(settings) as engine:
        history = run_session(engine, 40)
        history.append({"role": "user", "content": "go"})
        prepared = engine.prepare(history, session_id="s1")
    assert 0 == prepared.report.generation
    assert prepared.report.trimmed > 0
    assert [] == sqlite3.connect(db_path).execute("SELECT * FROM compactions").fetchall()


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_one_compaction_per_session_under_threads(make_settings: Callable[..., Settings]) -> None:
    """Many threads preparing one session never run two compactions for the same cut."""
    summarizer = CountingSummarizer()
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=summarizer) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        snapshot = list(history)
        results: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(engine.prepare(snapshot, session_id="s1"))
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    generations = {r.report.generation for r in results}
    assert 8 == len(results)
    assert {1} == generations
    assert 1 == summarizer.calls


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_sessions_are_isolated(make_settings: Callable[..., Settings]) -> None:
    """Two sessions on one engine keep separate summaries and generations."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        a = run_session(engine, 40)
        a.append({"role": "user", "content": "a?"})
        pa = engine.prepare(a, session_id="s1")
        b = [{"role": "user", "content": "hello"}]
        pb = engine.prepare(b, session_id="s2")
    assert pa.report.generation >= 1
    assert 0 == pb.report.generation
    assert b == pb.messages


# ---------------------------------------------------------------------------- plan properties


@st.composite
def over_the_trigger(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int]:
    """A conversation ending on a user message, and a budget B whose 80% gate it passes."""
    view = [*draw(conversations(max_turns=14)), {"role": "user", "content": draw(texts) or "q"}]
    total = sum(chars(m) for m in view)
    budget = draw(st.integers(MIN_CONTEXT_WINDOW_CHARS, max(total * 5 // 4 - 1, 8_000)))
    return view, budget


@given(over_the_trigger())
def test_cut_is_safe(case: tuple[list[dict[str, Any]], int]) -> None:
    """The cut lands on a user message, never inside a tool loop, and keeps ≥ 20% of B raw."""
    view, budget = case
    settings = Settings(context_window_chars=budget)
    sizes = [chars(m) for m in view]
    head = leading_system_count(view)
    decision = plan(view, sizes, head=head, settings=settings)
    event(decision if isinstance(decision, str) else "plan")
    if sum(sizes) <= settings.compact_trigger_chars:  # only when B is at its 8,000 floor
        assert "below_trigger" == decision
    assume(isinstance(decision, Plan))
    assert isinstance(decision, Plan)
    assert "user" == view[decision.cut]["role"]
    assert decision.cut > head
    for loop in map_loops(view).loops:
        sides = {i >= decision.cut for i in (loop.call_index, *loop.result_indexes)}
        assert 1 == len(sides)
    assert sum(sizes[decision.cut :]) >= settings.keep_recent_chars
    assert decision.material_chars * 2 >= decision.total_chars


@pytest.mark.parametrize(
    ("first_chars", "last", "reason"),
    [
        (1_000_000, {"role": "assistant", "content": "x"}, "last_not_user"),
        (100, {"role": "user", "content": "x"}, "below_trigger"),
    ],
)
def test_plan_preconditions(first_chars: int, last: dict[str, Any], reason: str) -> None:
    """No compaction unless the view is over 80% and the last message is the user's."""
    view = [{"role": "user", "content": "a" * first_chars}, last]
    assert reason == plan(view, [chars(m) for m in view], head=0, settings=Settings())


def test_plan_not_worth_it_and_no_safe_cut() -> None:
    """Material under half the total is not worth it; a tail with no user start has no cut."""
    settings = Settings(context_window_chars=10_000)
    big_tail = [{"role": "user", "content": "a" * 500}, {"role": "user", "content": "b" * 8_000}]
    assert "not_worth_it" == plan(big_tail, [chars(m) for m in big_tail], head=0, settings=settings)
    one = [{"role": "user", "content": "a" * 9_000}]
    assert "no_safe_cut" == plan(one, [9_000], head=0, settings=settings)


def test_events_carry_the_numbers(make_settings: Callable[..., Settings]) -> None:
    """trim.applied and compaction.applied carry char counts; on_event sees the summary
    lifecycle."""
    seen: list[tuple[str, dict[str, Any]]] = []
    settings = make_settings(context_window_chars=20_000)
    with (
        structlog.testing.capture_logs() as logs,
        MemoryEngine(settings, on_event=lambda name, data: seen.append((name, data))) as engine,
    ):
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        prepared = engine.prepare(history, session_id="s1")
    applied = [e for e in logs if e["event"] == "compaction.applied"]
    assert 1 == len(applied)
    event = applied[0]
    assert prepared.report.generation == event["generation"]
    assert event["chars_before"] > event["chars_after"] > 0
    assert event["summary_chars"] <= settings.summary_max_chars
    assert any(e["event"] == "trim.applied" and e["reclaimed_chars"] > 0 for e in logs)
    names = [name for name, _ in seen]
    assert ["before_summarize", "after_summarize"] == names
    assert "applied" == seen[-1][1]["status"]


def test_report_after_compaction(make_settings: Callable[..., Settings]) -> None:
    """The report of a compacting call: compacted, generation, chars_out within budget."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        prepared = engine.prepare(history, session_id="s1")
        again = engine.prepare(history, session_id="s1")
    report = prepared.report
    assert report.compacted
    assert 1 == report.generation
    assert report.chars_in > settings.compact_trigger_chars
    assert report.chars_out <= settings.context_window_chars
    assert report.chars_out == sum(chars(m) for m in prepared.messages)
    assert report.chars_raw == sum(chars(m) for m in history)
    assert not again.report.compacted
    assert prepared.messages == again.messages
    summary = prepared.messages[0]
    assert "user" == summary["role"]
    assert "not a new instruction" in summary["content"]


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_store_failure_during_invalidation_is_not_raised(
    make_settings: Callable[..., Settings],
) -> None:
    """If the store cannot record an invalidation, prepare still returns the edited history's
    view (no stale summary) instead of raising."""
    from ragent_memory import StoreError

    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        assert engine.prepare(history, session_id="s1").report.generation >= 1

        def broken(state: Any) -> None:
            raise StoreError("disk full")

        engine.store.save_session = broken  # type: ignore[method-assign]
        history[0] = {"role": "user", "content": "Plan the offsite. Budget is 9,999 euros."}
        prepared = engine.prepare(history, session_id="s1")
    assert 0 == prepared.report.generation
    assert history[-1] == prepared.messages[-1]
    assert "4,321" not in "\n".join(str(m.get("content")) for m in prepared.messages)


def test_offline_summary_keeps_constraint_todo_and_tools(
    make_settings: Callable[..., Settings],
) -> None:
    """After compaction the summary holds the planted constraint word for word, the latest
    to-do of the covered turns and every tool used there."""
    import json

    rng = random.Random(4)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Book the team offsite. Never exceed 4,321 euros in total."}
    ]
    tools = ("search_knowledge", "run_sql", "fetch_calendar")
    for turn in range(45):
        tool = tools[turn % 3]
        ask = f"Please check venue option {turn} for the offsite."
        if turn == 40:
            ask = "Please email the shortlist to Bob before Friday."
        history += [
            {"role": "user", "content": ask},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps({"q": turn})},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"c{turn}",
                "content": " ".join(
                    f"venue {rng.randint(1, 99)} costs {rng.randint(500, 9000)} EUR."
                    for _ in range(60)
                ),
            },
            {"role": "assistant", "content": f"Venue {turn} checked."},
        ]
    for turn in range(45, 60):
        history += [
            {"role": "user", "content": f"Small talk {turn}."},
            {"role": "assistant", "content": "Sure."},
        ]
    history.append({"role": "user", "content": "What is left?"})
    with MemoryEngine(make_settings(context_window_chars=20_000)) as engine:
        prepared = engine.prepare(history, session_id="s1")
    assert prepared.report.generation >= 1
    summary = prepared.messages[0]["content"]
    assert "Never exceed 4,321 euros in total." in summary
    assert "Please email the shortlist to Bob before Friday." in summary
    for tool in tools:
        assert tool in summary


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_unexpected_summarizer_error_is_audited(make_settings: Callable[..., Settings]) -> None:
    """Any exception from a summarizer is audited as failed and never reaches the caller,
    not even through flush()."""

    class Broken(CountingSummarizer):
        def summarize(self, request: SummaryRequest) -> SummaryOutcome:
            raise KeyError("choices")

    with MemoryEngine(make_settings(context_window_chars=20_000), summarizer=Broken()) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        prepared = engine.prepare(history, session_id="s1")
        assert engine.flush(timeout_s=30)
        rows = engine.store.compactions("s1")
    assert "failed" == prepared.report.skipped_reason
    assert [("failed", "KeyError")] == [(r["status"], r["reason"]) for r in rows]


@pytest.mark.both_backends
def test_a_dropped_id_used_again_compacts_with_new_generation_numbers(
    make_settings: Callable[..., Settings],
) -> None:
    """The same history replayed under a dropped id compacts again: its generations number
    on after the first life's (the audit keeps them, each applied number once)."""
    with MemoryEngine(make_settings(context_window_chars=20_000)) as engine:
        history = build_history(60)
        lives = []
        for _life in range(2):
            reports = [
                engine.prepare(history[: end + 1], session_id="s1").report
                for end in range(0, len(history), 4)
            ]
            lives.append([r.generation for r in reports if r.compacted])
            engine.drop_session("s1")
        applied = [r["generation"] for r in engine.store.compactions("s1")]
    first, second = lives
    assert first and len(first) == len(second)
    assert second == [g + first[-1] for g in first]
    assert [*first, *second] == applied


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_dropped_session_is_not_resurrected_by_a_late_compaction(
    make_settings: Callable[..., Settings],
) -> None:
    """A compaction that finishes after its session was dropped is audited stale, not saved."""
    gate = threading.Event()
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0.05)
    with MemoryEngine(settings, summarizer=CountingSummarizer(gate=gate)) as engine:
        history = build_history(60)
        history.append({"role": "user", "content": "go"})
        assert "timeout" == engine.prepare(history, session_id="s1").report.skipped_reason
        engine.drop_session("s1")  # waits compaction_timeout_s for the worker, then drops
        gate.set()
        assert engine.flush(timeout_s=30)  # the worker's own wait, not the turn's 0.05 s
        assert engine.store.load_session("s1") is None
        reasons = [r["reason"] for r in engine.store.compactions("s1")]
    assert ["stale"] == reasons
