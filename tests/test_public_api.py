"""The public surface of DESIGN §11 is importable from the package root."""

from __future__ import annotations

from pathlib import Path

import ragent_memory
from ragent_memory import MemoryEngine, Settings, StoreSettings, load_settings

SHIPPED = Path(__file__).resolve().parent.parent / "config" / "ragent-memory.yaml"


def test_all_is_sorted_and_importable() -> None:
    """__all__ is sorted and every name in it exists."""
    assert sorted(ragent_memory.__all__) == ragent_memory.__all__
    for name in ragent_memory.__all__:
        assert hasattr(ragent_memory, name)


def test_design_example_runs(tmp_path: Path) -> None:
    """The DESIGN §11 example works as written, from the package root."""
    settings = load_settings(SHIPPED)
    settings = Settings(
        context_window_chars=settings.context_window_chars,
        store=StoreSettings(path=str(tmp_path / "m.db")),
    )
    with MemoryEngine(settings) as engine:
        prepared = engine.prepare(
            [{"role": "user", "content": "hi"}], session_id="s1", user_id="u1"
        )
        assert [{"role": "user", "content": "hi"}] == prepared.messages
        assert 0 == prepared.report.generation
        assert "recall_tool_result" == engine.recall_tool()["function"]["name"]
        assert "not found" in engine.recall("s1", "rm-0000")
        engine.flush()
        engine.gc()
