"""The engine's lifecycle: ``flush``, ``close`` and what happens after it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from sessions import CountingSummarizer, build_history

from ragent_memory import EngineClosedError, Settings
from ragent_memory.engine.memory_engine import MemoryEngine


def _due(turns: int = 60) -> list[dict[str, Any]]:
    """A history that ends on a user turn over the compaction trigger of B = 20,000."""
    return [*build_history(turns), {"role": "user", "content": "go on"}]


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_flush_times_out_then_finishes(make_settings: Callable[..., Settings]) -> None:
    """flush(timeout_s) says False while a compaction is still running and True once it has
    finished; the next prepare adopts the summary."""
    gate = threading.Event()
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0)
    with MemoryEngine(settings, summarizer=CountingSummarizer(gate=gate)) as engine:
        history = _due()
        assert "timeout" == engine.prepare(history, session_id="s").report.skipped_reason
        assert False is engine.flush(timeout_s=0.01)
        gate.set()
        assert engine.flush(timeout_s=30) is True
        adopted = engine.prepare(history, session_id="s").report
    assert (True, 1) == (adopted.compacted, adopted.generation)


def test_flush_with_nothing_in_flight_is_true(make_engine: Callable[..., MemoryEngine]) -> None:
    """With no background work, flush returns at once and says everything finished."""
    engine = make_engine()
    engine.prepare([{"role": "user", "content": "hi"}], session_id="s")
    assert engine.flush(timeout_s=0) is True


def test_close_waits_for_a_compaction_in_flight(
    make_settings: Callable[..., Settings], db_path: str
) -> None:
    """close() returns only after the running compaction committed and audited its summary."""
    gate = threading.Event()
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0)
    engine = MemoryEngine(settings, summarizer=CountingSummarizer(gate=gate))
    assert "timeout" == engine.prepare(_due(), session_id="s").report.skipped_reason
    closing = threading.Thread(target=engine.close)
    closing.start()
    closing.join(timeout=0.2)
    assert closing.is_alive()  # still waiting on the gated summarizer
    gate.set()
    closing.join(timeout=30)
    assert not closing.is_alive()
    rows = sqlite3.connect(db_path).execute("SELECT status FROM compactions").fetchall()
    assert [("applied",)] == rows


def _calls(engine: MemoryEngine) -> dict[str, Callable[[], Any]]:
    messages = [{"role": "user", "content": "hi"}]
    return {
        "prepare": lambda: engine.prepare(messages, session_id="s"),
        "aprepare": lambda: asyncio.run(engine.aprepare(messages, session_id="s")),
        "after_turn": lambda: engine.after_turn(messages, session_id="s", user_id="u"),
        "aafter_turn": lambda: asyncio.run(
            engine.aafter_turn(messages, session_id="s", user_id="u")
        ),
        "memories": lambda: engine.memories("u"),
        "forget": lambda: engine.forget("u"),
        "recall": lambda: engine.recall("s", "rm-x"),
        "drop_session": lambda: engine.drop_session("s"),
        "gc": engine.gc,
    }


CALLS = (
    "prepare",
    "aprepare",
    "after_turn",
    "aafter_turn",
    "memories",
    "forget",
    "recall",
    "drop_session",
    "gc",
)


def test_every_public_call_is_listed(make_engine: Callable[..., MemoryEngine]) -> None:
    """The table below covers every call the closed engine must refuse."""
    assert sorted(CALLS) == sorted(_calls(make_engine()))


@pytest.mark.both_backends  # reliability on PostgreSQL too
@pytest.mark.parametrize("name", CALLS)
def test_every_call_after_close_raises_one_error(
    make_engine: Callable[..., MemoryEngine], name: str
) -> None:
    """After close(), each public call raises EngineClosedError (never a store error)."""
    engine = make_engine()
    engine.prepare([{"role": "user", "content": "hi"}], session_id="s")
    engine.close()
    with pytest.raises(EngineClosedError, match="engine is closed"):
        _calls(engine)[name]()


def test_close_is_idempotent_and_flush_after_close_is_true(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """A second close() does nothing; flush() after close has nothing left to wait for."""
    engine = make_engine()
    engine.close()
    engine.close()
    assert engine.flush(timeout_s=0) is True


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_messages_leaving_the_view_are_reported_once(
    make_settings: Callable[..., Settings],
) -> None:
    """on_leave receives each raw message as it leaves the view (a trimmed original, or
    covered by an applied summary), with its raw index, and no index twice."""
    left: list[tuple[int, dict[str, Any]]] = []

    def on_leave(session_id: str, user_id: str | None, items: list[Any]) -> None:
        assert ("s", "u") == (session_id, user_id)
        left.extend(items)

    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, on_leave=on_leave) as engine:
        history = _due()
        report = engine.prepare(history, session_id="s", user_id="u").report
        state = engine.store.load_session("s")
    assert report.compacted
    indexes = [i for i, _ in left]
    assert len(indexes) == len(set(indexes))
    assert all(history[i] is message for i, message in left)
    assert state is not None
    assert set(range(state.prefix_len, state.covered)) <= set(indexes)


def test_session_cache_is_bounded_and_an_evicted_session_continues_byte_identically(
    make_settings: Callable[..., Settings], tmp_path: Any
) -> None:
    """With session_cache_size 2 and three sessions taking turns, at most two stay in memory;
    the one evicted before each of its turns sends exactly what an engine that kept it sends
    (trims, previews and summaries included)."""
    import re

    from ragent_memory import StoreSettings
    from ragent_memory.cli.demo import simulate_session

    def normalised(messages: list[dict[str, Any]]) -> str:
        return re.sub(r"rm-[0-9a-f]+", "REF", repr(messages))

    # Recall off: BM25 ranks with the statistics of the whole index, which here holds sessions
    # b and c too (the reference's store holds only a), so equal excerpts may come in another
    # order. What eviction must keep is the session's own view.
    small = make_settings(context_window_chars=12_000, session_cache_size=2, recall_enabled=False)
    roomy = make_settings(
        context_window_chars=12_000,
        store=StoreSettings(path=str(tmp_path / "roomy.db")),
        recall_enabled=False,
    )
    histories: dict[str, list[dict[str, Any]]] = {"a": [], "b": [], "c": []}
    kept: list[dict[str, Any]] = []
    with MemoryEngine(small) as engine, MemoryEngine(roomy) as reference:
        for turn in simulate_session(60, seed=3):
            for session_id, history in histories.items():
                history.append(turn[0])
                sent = engine.prepare(history, session_id=session_id)
                assert len(engine.sessions) <= 2
                if session_id == "a":
                    expected = reference.prepare(history, session_id="a")
                    assert normalised(expected.messages) == normalised(sent.messages)
                    assert attrs.evolve(expected.report, duration_ms=0) == attrs.evolve(
                        sent.report, duration_ms=0
                    )
                    kept.append(attrs.asdict(sent.report))
                history.extend(turn[1:])
    assert any(r["trimmed"] for r in kept) and any(r["generation"] for r in kept)
