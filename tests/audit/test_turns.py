"""The per-turn record the audit page draws: one row per prepare, numbered per session,
bounded, dropped with its session; and the store's session listing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ragent_memory import MemoryEngine
from ragent_memory.store import turns as turns_module
from ragent_memory.store.turns import TURN_COLUMNS

pytestmark = pytest.mark.both_backends


def _history(n: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for k in range(n):
        history += [
            {"role": "user", "content": f"question {k}"},
            {"role": "assistant", "content": f"answer {k} " * 20},
        ]
    return [*history, {"role": "user", "content": "and now?"}]


def test_each_prepare_is_one_turn_row(make_engine: Callable[..., MemoryEngine]) -> None:
    """A row per prepare, numbered from 1, holding that turn's report, B and the history's
    length."""
    engine = make_engine()
    reports = [engine.prepare(_history(n), session_id="s1", user_id="u1").report for n in range(3)]
    rows = engine.store.turns("s1")
    assert [1, 2, 3] == [r["turn"] for r in rows]
    assert [r.chars_out for r in reports] == [r["chars_out"] for r in rows]
    assert [r.chars_raw for r in reports] == [r["chars_raw"] for r in rows]
    assert [2, 4, 6] == [r["messages"] for r in rows]
    assert {engine.settings.context_window_chars} == {r["budget_chars"] for r in rows}
    assert {"u1"} == {r["user_id"] for r in rows}
    assert [] == engine.store.turns("other")


def test_rows_are_bounded_per_session(
    make_engine: Callable[..., MemoryEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound the oldest rows go (checked every hundred turns)."""
    monkeypatch.setattr(turns_module, "TURNS_KEPT", 150)
    store = make_engine().store
    fields = dict.fromkeys(TURN_COLUMNS, 0) | {"user_id": "u1", "skipped_reason": None}
    numbers = [store.record_turn("s1", fields) for _ in range(300)]
    assert list(range(1, 301)) == numbers
    assert list(range(151, 301)) == [r["turn"] for r in store.turns("s1")]


def test_dropping_a_session_drops_its_turns(make_engine: Callable[..., MemoryEngine]) -> None:
    """drop_session takes its turn rows; other sessions keep theirs."""
    engine = make_engine()
    for session in ("s1", "s2"):
        engine.prepare(_history(1), session_id=session, user_id="u1")
    engine.drop_session("s1")
    assert [] == engine.store.turns("s1")
    assert [1] == [r["turn"] for r in engine.store.turns("s2")]


def test_session_list_counts_and_filters_by_scope(make_engine: Callable[..., MemoryEngine]) -> None:
    """The listing has each session's user and turns, newest first, and one scope's only
    when asked."""
    engine = make_engine()
    scope = "c" * 24
    engine.prepare(_history(1), session_id="plain", user_id="u1")
    for _ in range(2):
        engine.prepare(_history(1), session_id=f"{scope}:mine", user_id=f"{scope}:u")
    listed = {r["session_id"]: r for r in engine.store.session_list()}
    assert {"plain", f"{scope}:mine"} == set(listed)
    assert (2, f"{scope}:u") == (
        listed[f"{scope}:mine"]["turns"],
        listed[f"{scope}:mine"]["user_id"],
    )
    assert [f"{scope}:mine"] == [r["session_id"] for r in engine.store.session_list(scope)]
