"""A view's positions: view, history and substitution indexes, converted by ``View`` alone."""

from __future__ import annotations

from collections.abc import Callable

from ragent_memory import MemoryEngine, Settings
from ragent_memory.core.chars import Message
from ragent_memory.engine.view import View


def _history(turns: int) -> list[Message]:
    history: list[Message] = [
        {"role": "system", "content": "You answer questions."},
        {"role": "system", "content": "Be brief."},
    ]
    for n in range(turns):
        history += [
            {"role": "user", "content": f"q{n} " + "u" * 1_500},
            {"role": "assistant", "content": f"a{n} " + "a" * 1_000},
        ]
    return history


def _shown_as_written(view: View, history: list[Message]) -> None:
    for index in range(view.head, len(view.messages)):
        at = view.history_index(index)
        assert view.view_index(at) == index
        assert view.substitution_index(at) == at - view.prefix_len
        if index not in view.kinds:
            assert view.messages[index] == history[at]


def test_history_indexes_name_the_callers_messages_after_turns_are_left_out(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Once the ceiling leaves whole turns out, each view index from the tail on still maps to
    the caller's message it shows, and back; what the view no longer shows starts after the
    system messages."""
    engine = make_engine(make_settings(context_window_chars=8_000, summary_enabled=False))
    history = _history(2)
    dropped = 0
    for n in range(2, 12):
        history += _history(n + 1)[-2:]
        report = engine.prepare(history, session_id="s").report
        dropped = max(dropped, report.dropped_turns)
        session = engine.sessions.get("s")
        assert session is not None and session.view is not None
        view = session.view
        _shown_as_written(view, history)
        assert view.end == len(history)
        assert view.covered() == range(2, view.tail_start)
        assert view.tail_start - view.left_out.messages == view.start == 2
    assert dropped >= 1
