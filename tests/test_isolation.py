"""What the caller gets is its own: changing a prepared message changes neither the caller's
history nor later turns (issue 8, item 10); the history is read incrementally, yet edits are
caught (README, "Speed")."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from test_compact import CountingSummarizer, build_history

from ragent_memory import Settings
from ragent_memory.engine import MemoryEngine


def _history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "persona"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search_knowledge", "arguments": '{"q": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "user", "content": "and?"},
    ]


def _decorate(messages: list[dict[str, Any]]) -> None:
    """What apps do to what they send: cache_control on parts, edited calls, popped keys."""
    messages[1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    messages[1]["content"][1]["image_url"]["detail"] = "low"
    messages[2]["tool_calls"][0]["function"]["arguments"] = "{}"
    messages[2]["tool_calls"].append({"id": "x"})
    messages[3].pop("tool_call_id")
    messages[4]["content"] = "changed"


def test_decorating_the_output_changes_neither_history_nor_later_turns(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """Parts, tool calls and keys of a prepared message are fresh objects: decorating them
    leaves the caller's history as it was, and the next prepare sends the original again."""
    engine = make_engine()
    history = _history()
    before = copy.deepcopy(history)
    first = engine.prepare(history, session_id="s").messages
    _decorate(first)
    assert before == history
    second = engine.prepare(history, session_id="s").messages
    assert before == second
    _decorate(second)
    history.append({"role": "assistant", "content": "done"})
    third = engine.prepare(history, session_id="s").messages
    assert [*before, {"role": "assistant", "content": "done"}] == third


def test_decorating_an_engine_made_preview_does_not_stick(
    make_settings: Callable[..., Settings],
) -> None:
    """An oversized tool-call input is shown as a preview the engine made; editing that preview
    in the output does not reappear on later turns."""
    engine = MemoryEngine(make_settings(context_window_chars=80_000))
    try:
        history = _history()
        history[2]["tool_calls"][0]["function"]["arguments"] = '{"q": "' + "a" * 9_000 + '"}'
        first = engine.prepare(history, session_id="s")
        assert 1 == first.report.truncated
        shown = copy.deepcopy(first.messages[2])
        first.messages[2]["tool_calls"][0]["function"]["arguments"] = "tampered"
        first.messages[2]["tool_calls"][0]["function"]["extra"] = {"nested": True}
        second = engine.prepare(history, session_id="s")
        assert shown == second.messages[2]
    finally:
        engine.close()


def test_in_place_edit_of_a_covered_message_is_caught_before_the_next_summary(
    make_settings: Callable[..., Settings],
) -> None:
    """An edit in place of a message the summary covers (not shown any more) is caught when
    the next compaction is due, before a new generation builds on it: the summary is
    invalidated and rebuilt from the edited history."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer()) as engine:
        history = [*build_history(60), {"role": "user", "content": "go on"}]
        assert engine.prepare(history, session_id="s").report.compacted
        state = engine.store.load_session("s")
        assert state is not None
        covered = next(i for i in range(state.covered) if history[i]["role"] == "user" and i > 10)
        history[covered]["content"] = "an edit the summary never saw"
        history += build_history(40, seed=2)[1:]
        history.append({"role": "user", "content": "and now?"})
        engine.prepare(history, session_id="s")
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert ["applied", "invalidated"] == statuses[:2]


def test_verify_catches_an_edit_inside_a_content_part(
    make_settings: Callable[..., Settings],
) -> None:
    """An edit deep inside a content part of a covered message is invisible to identity
    checks; prepare(verify=True) compares digests: the summary is invalidated at once and
    rebuilt from the edited history in the same call."""
    settings = make_settings(context_window_chars=20_000)
    with MemoryEngine(settings, summarizer=CountingSummarizer()) as engine:
        history = [*build_history(60), {"role": "user", "content": "go on"}]
        history[3] = {"role": "user", "content": [{"type": "text", "text": "original words"}]}
        assert engine.prepare(history, session_id="s").report.compacted
        history[3]["content"][0]["text"] = "rewritten words"
        assert 1 == engine.prepare(history, session_id="s").report.generation
        verified = engine.prepare(history, session_id="s", verify=True).report
        statuses = [r["status"] for r in engine.store.compactions("s")]
    assert (True, 2) == (verified.compacted, verified.generation)
    assert ["applied", "invalidated", "applied"] == statuses


def test_an_edit_inside_a_shown_content_part_is_caught_on_the_next_turn(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    """The copy handed out last turn no longer equals the edited message, so the engine looks
    at it again: the next prepare measures and sends the edit, without verify=True."""
    engine = make_engine()
    history = _history()
    before = engine.prepare(history, session_id="s").report.chars_raw
    history[1]["content"][0]["text"] = "look at this, and at the second page too"
    after = engine.prepare(history, session_id="s")
    assert before + len(", and at the second page too") == after.report.chars_raw
    assert history[1] == after.messages[1]


def test_untouched_copies_are_handed_out_again(make_engine: Callable[..., MemoryEngine]) -> None:
    """Only what changed is copied: a message neither the caller nor the engine changed comes
    back as the same copy, a decorated one as a fresh copy equal to the history."""
    engine = make_engine()
    history = _history()
    first = engine.prepare(history, session_id="s").messages
    first[3]["content"] = "decorated"
    history.append({"role": "assistant", "content": "done"})
    second = engine.prepare(history, session_id="s").messages
    assert (True, False) == (first[2] is second[2], first[3] is second[3])
    assert history == second
