"""The public surface of docs/design.md §11 is importable from the package root."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import attrs
from sessions import SHIPPED, tool_loop

import ragent_memory
from ragent_memory import MemoryEngine, StoreSettings, load_settings
from ragent_memory.recall.refs import FOOTER_MARK, find_refs
from ragent_memory.store import GCReport


def test_all_is_sorted_and_importable() -> None:
    """__all__ is sorted and every name in it exists."""
    assert sorted(ragent_memory.__all__) == ragent_memory.__all__
    for name in ragent_memory.__all__:
        assert hasattr(ragent_memory, name)


def test_design_example_runs(tmp_path: Path) -> None:
    """The docs/design.md §11 example works as written, from the package root, and every call in it
    does its job: prepare offloads, recall reads back, after_turn + flush learn facts,
    forget erases them, gc deletes what expired."""
    settings = attrs.evolve(
        load_settings(SHIPPED),
        context_window_chars=40_000,  # an oversized tool result at 4,000 chars
        store=StoreSettings(path=str(tmp_path / "m.db")),
    )
    now = [datetime(2025, 3, 1, tzinfo=UTC)]
    export = "order shipped; " * 800  # 12,000 chars
    messages = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "My name is Anna."},
        {"role": "assistant", "content": "Hello Anna."},
        {"role": "user", "content": "I live in Lisbon."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "I like surfing. Export my orders."},
        *tool_loop("c1", export, name="export"),
    ]
    with MemoryEngine(settings, clock=lambda: now[0]) as engine:
        prepared = engine.prepare(messages, session_id="s1", user_id="u1")
        assert messages[:-1] == prepared.messages[:-1]
        assert (1, 0) == (prepared.report.truncated, prepared.report.generation)
        (ref,) = find_refs(prepared.messages[-1]["content"])
        assert "recall_tool_result" == engine.recall_tool()["function"]["name"]
        assert export == engine.recall("s1", ref, 0, 100_000).rpartition(FOOTER_MARK)[0]
        assert "not found" in engine.recall("s1", "rm-0000")

        engine.after_turn(messages, session_id="s1", user_id="u1")
        engine.flush()
        assert ["Is called Anna", "Lives in Lisbon", "Likes surfing"] == [
            f.content for f in engine.memories("u1")
        ]
        engine.forget("u1")
        assert [] == engine.memories("u1")

        assert GCReport() == engine.gc()
        now[0] += timedelta(days=8)
        assert GCReport(expired_offloads=1, freed_bytes=len(export)) == engine.gc()
        assert "not found" in engine.recall("s1", ref)
