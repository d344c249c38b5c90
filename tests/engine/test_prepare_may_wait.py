"""``MemoryEngine.prepare_may_wait``: False only for a ``prepare`` that provably cannot wait
on a compaction (``serve`` then runs it on the event loop)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ragent_memory import MemoryEngine
from ragent_memory.cli.demo import simulate_session
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

B = 20_000
SYSTEM = {"role": "system", "content": "You are a support agent for ACME."}


class Watched(OfflineSummarizer):
    """The offline summarizer, counting the compactions it was asked for; ``gate`` (when
    set) holds each one until it is set (at most 30 s)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.calls = 0
        self.gate = gate

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(30)
        return super().summarize(request)


def test_false_only_for_turns_that_start_no_compaction(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Any]
) -> None:
    """The demo session, as an app sends it (the reply appended, its tool loop after): every
    turn said not to wait starts no compaction, and most turns are said not to wait."""
    summarizer = Watched()
    engine = make_engine(make_settings(context_window_chars=B), summarizer=summarizer)
    history: list[dict[str, Any]] = [SYSTEM]
    quiet = compacting = 0
    for turn, messages in enumerate(simulate_session(120)):
        history.append(messages[0])
        # as the proxy sends it: every other turn the history is parsed afresh (equal dicts)
        sent = history if turn % 2 else [dict(message) for message in history]
        may_wait = engine.prepare_may_wait(sent, session_id="s")
        before = summarizer.calls
        report = engine.prepare(sent, session_id="s").report
        started = summarizer.calls != before or report.skipped_reason == "timeout"
        assert may_wait or not started, f"turn {turn} started a compaction"
        quiet += not may_wait
        compacting += started
        history.append({"role": "assistant", "content": f"answer {turn}"})
        history.extend(messages[1:])
    assert compacting >= 3  # the session does compact
    assert quiet >= 60


def test_what_makes_a_turn_wait(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Any]
) -> None:
    engine = make_engine(make_settings(context_window_chars=B))
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "hello"}]
    assert engine.prepare_may_wait(history, session_id="s")  # not in memory yet
    engine.prepare(history, session_id="s")
    history.append({"role": "assistant", "content": "hi"})
    more = [*history, {"role": "user", "content": "how are you?"}]
    assert not engine.prepare_may_wait(more, session_id="s")
    big = [*history, {"role": "user", "content": "x" * int(0.8 * B)}]
    assert engine.prepare_may_wait(big, session_id="s")  # could reach the trigger
    edited = [SYSTEM, {"role": "user", "content": "hello!"}, *more[2:]]
    assert engine.prepare_may_wait(edited, session_id="s")  # not what it saw
    rebuilt = [dict(message) for message in more]
    assert not engine.prepare_may_wait(rebuilt, session_id="s")  # equal dicts are the same
    assert engine.prepare_may_wait(more[:1], session_id="s")  # shorter
    assert engine.prepare_may_wait([*history, "not a message"], session_id="s")
    assert engine.prepare_may_wait(more, session_id="other")


def test_never_wait_without_compaction_waits(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Any]
) -> None:
    big = [SYSTEM, {"role": "user", "content": "x" * 2 * B}]
    for settings in ({"compaction_timeout_s": 0}, {"summary_enabled": False}):
        engine = make_engine(make_settings(context_window_chars=B, **settings))
        assert not engine.prepare_may_wait(big, session_id="s")


def test_a_compaction_in_flight_or_a_busy_session_may_wait(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Any]
) -> None:
    """While a compaction runs (it may land and let the next one start) or another call
    holds the session, the answer is True."""
    gate = threading.Event()
    engine = make_engine(
        make_settings(context_window_chars=B, compaction_timeout_s=0.01),
        summarizer=Watched(gate),
    )
    history: list[dict[str, Any]] = [SYSTEM]
    for turn in range(40):
        history += [
            {"role": "user", "content": f"question {turn} " + "q" * 300},
            {"role": "assistant", "content": f"answer {turn} " + "a" * 300},
        ]
    history.append({"role": "user", "content": "and now?"})
    try:
        assert "timeout" == engine.prepare(history, session_id="s").report.skipped_reason
        small = [*history, {"role": "assistant", "content": "ok"}]
        assert engine.prepare_may_wait(small, session_id="s")
    finally:
        gate.set()
    engine.flush(30)
    engine.prepare(small, session_id="s")  # adopts the summary
    again = [*small, {"role": "user", "content": "fine"}]
    assert not engine.prepare_may_wait(again, session_id="s")
    session = engine.sessions["s"]
    with session.lock:
        assert engine.prepare_may_wait(again, session_id="s")
