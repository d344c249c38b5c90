"""Gate 1, trim: tables and properties over random tool-loop conversations, through the
gate's state (``TrimState``) as the engine drives it, and through the engine."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessions import tool_loop, user, without_recall
from strategies import conversations

from ragent_memory import Settings, StoreSettings
from ragent_memory.core.chars import chars
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.gates.trim import Eviction, Shown, TrimState, placeholder, protected_loops


def ref_for(text: str) -> str:
    return f"ref{len(text)}"


def history(*parts: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        out.extend(part if isinstance(part, list) else [part])
    return out


class Trimmed(NamedTuple):
    messages: list[dict[str, Any]]
    evictions: tuple[Eviction, ...]
    state: TrimState | None  # None: under the trigger, not looked at


def run(view: list[dict[str, Any]], trigger: int = 100, evicted: Collection[int] = ()) -> Trimmed:
    """Gate 1 over ``view`` as the engine runs it: over the trigger, a ``TrimState`` takes the
    view in and its candidates are applied when the 20% rule says so (``evicted``: indexes
    that already are placeholders)."""
    sizes = [chars(m) for m in view]
    if sum(sizes) <= trigger:
        return Trimmed(list(view), (), None)
    state = TrimState({"search_knowledge"}, "en", ref_for)
    state.extend(Shown(view, sizes, kinds=dict.fromkeys(evicted, "trim")))
    evictions = tuple(state.take()) if state.due(sum(sizes)) else ()
    trimmed = list(view)
    for eviction in evictions:
        trimmed[eviction.index] = eviction.replacement
    return Trimmed(trimmed, evictions, state)


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        (
            "en",
            '[Earlier tool result omitted: 5000 chars originally; input: {"q": 1}; recall: rm-x]',
        ),
        ("zh", '[历史工具结果已省略，原长 5000 字符，原入参 {"q": 1}，召回编号 rm-x]'),
    ],
)
def test_placeholder_text(language: str, expected: str) -> None:
    """Placeholders carry the original length, the input and the recall ref, per language."""
    assert expected == placeholder(language, 5000, '{"q": 1}', "rm-x")


def test_placeholder_clips_input_to_120_chars() -> None:
    """The evicted call's input is excerpted to at most 120 chars."""
    text = placeholder("en", 10, "a" * 500, "r")
    excerpt = text.split("input: ")[1].split("; recall")[0]
    assert 120 == len(excerpt)


def test_below_trigger_nothing_changes() -> None:
    """Under the trigger the view is returned as is."""
    view = history(user("q1"), tool_loop("a", "x" * 50), user("q2"))
    result = run(view, trigger=10_000)
    assert view == result.messages
    assert () == result.evictions


def test_evicts_old_results_and_keeps_the_last_two_loops() -> None:
    """Loops older than the last 2 completed ones before the current turn become placeholders."""
    view = history(
        user("q1"),
        tool_loop("a", "A" * 3000),
        user("q2"),
        tool_loop("b", "B" * 3000),
        user("q3"),
        tool_loop("c", "C" * 3000),
        user("q4"),
        tool_loop("d", "D" * 3000),
    )
    result = run(view)
    evicted = {view[e.index]["tool_call_id"] for e in result.evictions}
    assert {"a"} == evicted  # b, c: last two completed; d: current turn
    assert result.messages[2]["content"].startswith("[Earlier tool result omitted: 3000 chars")
    assert len(view) == len(result.messages)


def test_non_whitelisted_tools_are_never_evicted() -> None:
    """Only tools named in evictable_tools are trimmed."""
    view = history(
        user("q1"),
        tool_loop("a", "A" * 9000, name="run_sql"),
        tool_loop("z", "Z" * 9000),
        user("q2"),
        tool_loop("b", "B"),
        tool_loop("c", "C"),
        user("q3"),
    )
    result = run(view)
    assert {"z"} == {view[e.index]["tool_call_id"] for e in result.evictions}


def test_skips_when_reclaim_is_under_20_percent() -> None:
    """A trim that would free < 20% of the total is skipped whole."""
    view = history(
        user("x" * 20_000),
        tool_loop("a", "A" * 1_000),
        user("q2"),
        tool_loop("b", "B"),
        tool_loop("c", "C"),
        user("q3"),
    )
    result = run(view)
    assert result.state is not None and result.state.candidates  # something was evictable
    assert () == result.evictions
    assert view == result.messages


def test_no_user_message_protects_every_loop() -> None:
    """Without a user message every loop counts as the current turn."""
    view = history(tool_loop("a", "A" * 5000), tool_loop("b", "B"))
    assert view == run(view).messages


def test_unanswered_and_duplicate_loops_are_protected() -> None:
    """Loops with unanswered calls or duplicate ids are never evicted."""
    unanswered = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "u1",
                "type": "function",
                "function": {"name": "search_knowledge", "arguments": "{}"},
            },
            {
                "id": "u2",
                "type": "function",
                "function": {"name": "search_knowledge", "arguments": "{}"},
            },
        ],
    }
    view = history(
        user("q1"),
        unanswered,
        {"role": "tool", "tool_call_id": "u1", "content": "U" * 5000},
        tool_loop("dup", "D" * 5000),
        tool_loop("dup", "E" * 5000),
        user("q2"),
        tool_loop("b", "B"),
        tool_loop("c", "C"),
        user("q3"),
    )
    assert view == run(view).messages


def test_already_evicted_results_are_not_evicted_again() -> None:
    """Indexes marked as evicted are left alone."""
    view = history(
        user("q1"),
        tool_loop("a", "A" * 3000),
        tool_loop("x", "X" * 3000),
        user("q2"),
        tool_loop("b", "B"),
        tool_loop("c", "C"),
        user("q3"),
    )
    result = run(view, evicted={2})
    assert [4] == [e.index for e in result.evictions]


# ---------------------------------------------------------------------------- properties


def tool_shape(messages: list[dict[str, Any]]) -> list[Any]:
    """Everything trim must not change: roles, ids, tool calls, non-tool messages."""
    return [
        (
            m["role"],
            m.get("tool_call_id"),
            json.dumps(m.get("tool_calls"), sort_keys=True),
            None if m["role"] == "tool" else json.dumps(m.get("content")),
        )
        for m in messages
    ]


@given(conversations(), st.integers(100, 20_000))
def test_trim_properties(view: list[dict[str, Any]], trigger: int) -> None:
    """Trim keeps shape, evicts only unprotected whitelisted results, creates no orphan,
    never mutates its input and is idempotent."""
    before = copy.deepcopy(view)
    result = run(view, trigger=trigger)
    assert before == view
    assert tool_shape(view) == tool_shape(result.messages)
    loops = map_loops(view)
    protected = protected_loops(view, loops.loops)
    owner = {i: lp for lp in loops.loops for i in lp.result_indexes}
    for e in result.evictions:
        lp = owner[e.index]
        assert lp.call_index not in protected
        assert "search_knowledge" == lp.tool_names[view[e.index]["tool_call_id"]]
    assert map_loops(result.messages).orphan_indexes == loops.orphan_indexes
    again = run(result.messages, trigger=trigger, evicted={e.index for e in result.evictions})
    assert result.messages == again.messages


def _engine_settings(db: str, budget: int) -> Settings:
    return Settings(
        context_window_chars=budget, summary_enabled=False, store=StoreSettings(path=db)
    )


@given(conversations(max_turns=10), st.sampled_from([8_000, 12_000, 20_000]))
def test_prepare_is_sticky_idempotent_and_pure(
    tmp_path_factory: pytest.TempPathFactory, view: list[dict[str, Any]], budget: int
) -> None:
    """prepare never mutates the input, is idempotent, keeps evictions sticky, and a new user
    message leaves the earlier prefix byte-identical unless new results were evicted."""
    db = str(tmp_path_factory.mktemp("db") / "m.db")
    before = copy.deepcopy(view)
    with MemoryEngine(_engine_settings(db, budget)) as engine:
        first = engine.prepare(view, session_id="s")
        assert before == view
        assert first.messages == engine.prepare(view, session_id="s").messages
        grown = [*view, {"role": "user", "content": "next"}]
        second = engine.prepare(grown, session_id="s")
    assert before == view
    # A recall block (§9b) rides on the final user message of the call it was made for only.
    assert grown[-1] == without_recall(second.messages[-1])
    shown = [*first.messages[:-1], without_recall(first.messages[-1])] if first.messages else []
    n = len(first.messages)
    # Sticky by position only while the ceiling (§4b step 4) leaves out the same turns: when the
    # second call leaves out more, the later messages move up.
    same_turns = first.report.dropped_turns == second.report.dropped_turns
    for old, new in zip(first.messages, second.messages[:n] if same_turns else (), strict=False):
        if isinstance(old.get("content"), str) and old["content"].startswith("[Earlier tool"):
            assert old == new  # sticky
    was_over = first.report.chars_in > budget // 2  # the first call already met the trigger
    pushed_past_budget = first.report.chars_out + len("next") > budget  # the ceiling acts
    if not pushed_past_budget and (
        (view and view[-1]["role"] == "user" and was_over)
        or second.report.trimmed == first.report.trimmed
    ):
        # When the first call already ended on a user message over the trigger, the new one
        # moves no loop out of protection and only makes 20% harder to reach, so nothing new
        # can be evicted: the prefix must be byte-identical. (Just under the trigger, the new
        # message alone may push the view over it and start the first trim.)
        assert json.dumps(shown) == json.dumps(second.messages[:n])
    # Trim changes no shape; the ceiling (§4b step 4) may leave out whole turns after the
    # system prompt, oldest first.
    kept = tool_shape(first.messages)
    head = 1 if view and view[0]["role"] == "system" else 0
    left_out = len(view) - len(kept)
    assert (left_out > 0) == (first.report.dropped_turns > 0)
    assert tool_shape([*view[:head], *view[head + left_out :]]) == kept


def test_restart_keeps_evictions(make_settings: Callable[..., Settings]) -> None:
    """A new engine on the same store shows the same placeholders (sticky across restarts)."""
    view = history(
        user("u" * 500),
        tool_loop("a", "A" * 3900),
        user("q2"),
        tool_loop("b", "B" * 10),
        user("q3"),
        tool_loop("c", "C" * 10),
        user("q4"),
    )
    settings = make_settings(context_window_chars=8_000)
    with MemoryEngine(settings) as engine:
        first = engine.prepare(view, session_id="s")
    assert 1 == first.report.trimmed
    with MemoryEngine(settings) as engine:
        rebuilt = [dict(m) for m in view]  # the app rebuilt its dicts
        again = engine.prepare(rebuilt, session_id="s")
    assert first.messages == again.messages


def test_irregular_input_is_tolerated_and_warned_once(
    make_settings: Callable[..., Settings],
) -> None:
    """Orphan results, duplicate ids and unanswered calls are kept as they are, never evicted,
    and logged once per session."""
    import structlog

    orphan = {"role": "tool", "tool_call_id": "ghost", "content": "O" * 3000}
    view = history(
        user("q1"),
        orphan,
        tool_loop("dup", "D" * 3000),
        tool_loop("dup", "E" * 3000),
        tool_loop("a", "A" * 3000),
        user("q2"),
        tool_loop("b", "B"),
        tool_loop("c", "C"),
        user("q3"),
    )
    with (
        structlog.testing.capture_logs() as logs,
        # B above the view's 12k: gate 1 alone (the ceiling would leave turn q1 out at 8k).
        MemoryEngine(make_settings(context_window_chars=14_000, summary_enabled=False)) as engine,
    ):
        first = engine.prepare(view, session_id="s")
        engine.prepare([*view, user("q4")], session_id="s")
    assert orphan == first.messages[1]
    assert "D" * 3000 == first.messages[3]["content"]
    assert first.messages[7]["content"].startswith("[Earlier tool result omitted")
    warnings = [e for e in logs if e["event"] == "messages.irregular"]
    assert 1 == len(warnings)
    assert (1, 1) == (warnings[0]["orphan_results"], warnings[0]["duplicate_call_ids"])
