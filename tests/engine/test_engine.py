"""MemoryEngine: the public surface, the report, input handling and concurrency."""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from sessions import build_history

from ragent_memory import EngineClosedError, InvalidMessagesError, Settings, StoreSettings
from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext, TurnReport

# The engine end to end on both stores (docs/design.md §10: one contract, the same suite).
pytestmark = pytest.mark.both_backends


@pytest.mark.parametrize(
    ("messages", "index"),
    [
        ("x", None),
        ({"role": "user"}, None),
        ([{"role": "user", "content": "a"}, {"role": "ghost", "content": "b"}], 1),
        ([{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}], 1),
        ([{"role": "user", "content": "a"}, 7], 1),
    ],
)
def test_garbage_input_raises_with_index(
    make_engine: Callable[..., MemoryEngine], messages: Any, index: int | None
) -> None:
    """prepare rejects garbage with InvalidMessagesError naming the index."""
    engine = make_engine()
    with pytest.raises(InvalidMessagesError) as info:
        engine.prepare(messages, session_id="s")
    assert index == info.value.index
    if index is not None:
        assert f"[{index}]" in str(info.value)


def test_bad_input_loses_nothing(make_engine: Callable[..., MemoryEngine]) -> None:
    """A rejected call leaves the session as it was; the next good call works."""
    engine = make_engine()
    good = [{"role": "user", "content": "hi"}]
    engine.prepare(good, session_id="s")
    with pytest.raises(InvalidMessagesError):
        engine.prepare([*good, {"role": "tool", "content": "x"}], session_id="s")
    assert good == engine.prepare(good, session_id="s").messages


def test_session_id_is_required(make_engine: Callable[..., MemoryEngine]) -> None:
    """An empty session id is rejected."""
    with pytest.raises(InvalidMessagesError, match="session_id"):
        make_engine().prepare([], session_id="")


def test_small_history_passes_through_with_report(make_engine: Callable[..., MemoryEngine]) -> None:
    """Under every gate the messages come back equal, with a report in chars."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    prepared = make_engine().prepare(messages, session_id="s")
    assert isinstance(prepared, PreparedContext)
    assert messages == prepared.messages
    report = prepared.report
    assert (8, 8, 8) == (report.chars_raw, report.chars_in, report.chars_out)
    assert (0, 0, 0, False, 0, 0) == (
        report.trimmed,
        report.truncated,
        report.reclaimed_chars,
        report.compacted,
        report.generation,
        report.memory_chars,
    )
    assert report.skipped_reason is None  # nothing was due, so nothing was skipped
    assert report.duration_ms >= 0


def test_input_is_never_mutated(make_engine: Callable[..., MemoryEngine]) -> None:
    """Neither the list nor any dict handed in is changed, even when gates fire."""
    messages: list[dict[str, Any]] = []
    for i in range(30):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "search_knowledge", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "r" * 3000},
        ]
    messages.append({"role": "user", "content": "end"})
    before = copy.deepcopy(messages)
    engine = make_engine(Settings(context_window_chars=20_000, store=make_engine().settings.store))
    prepared = engine.prepare(messages, session_id="s")
    assert prepared.report.trimmed > 0 or prepared.report.generation > 0
    assert before == messages


def test_from_yaml_and_context_manager(tmp_path: Path) -> None:
    """from_yaml loads the config; the context manager closes the engine."""
    config = tmp_path / "c.yaml"
    config.write_text(f"context_window_chars: 50000\nstore: {{path: {tmp_path / 'x.db'}}}\n")
    with MemoryEngine.from_yaml(config) as engine:
        assert 25_000 == engine.settings.trim_trigger_chars
        engine.prepare([{"role": "user", "content": "x"}], session_id="s")
    with pytest.raises(EngineClosedError):
        engine.prepare([{"role": "user", "content": "x"}], session_id="s")


def test_memory_store_path(tmp_path: Path) -> None:
    """store.path ':memory:' works for throwaway engines."""
    from ragent_memory import StoreSettings

    with MemoryEngine(Settings(store=StoreSettings(path=":memory:"))) as engine:
        assert 1 == len(engine.prepare([{"role": "user", "content": "x"}], session_id="s").messages)


def prepared_on_a_new_store(
    path: Path, history: list[dict[str, Any]], *, run_async: bool = False
) -> tuple[str, TurnReport]:
    """``history`` prepared by a fresh engine at B = 20,000 on the store at ``path``: the
    messages with their recall refs (unguessable per store) set aside, and the report."""
    settings = Settings(context_window_chars=20_000, store=StoreSettings(path=str(path)))
    with MemoryEngine(settings) as engine:
        if run_async:
            prepared = asyncio.run(engine.aprepare(history, session_id="s"))
        else:
            prepared = engine.prepare(history, session_id="s")
    messages = re.sub(r"rm-[0-9a-f]+", "REF", repr(prepared.messages))
    return messages, attrs.evolve(prepared.report, duration_ms=0.0)


def test_aprepare(tmp_path: Path) -> None:
    """The asyncio variant returns what prepare returns, on a history where the gates fire."""
    history = [*build_history(60), {"role": "user", "content": "go"}]
    expected = prepared_on_a_new_store(tmp_path / "sync.db", history)
    actual = prepared_on_a_new_store(tmp_path / "async.db", history, run_async=True)
    assert (True, 1) == (actual[1].compacted, actual[1].generation)
    assert expected == actual


def test_many_threads_many_sessions(make_engine: Callable[..., MemoryEngine]) -> None:
    """One engine serves many threads and sessions at once."""
    engine = make_engine()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            history: list[dict[str, Any]] = []
            for i in range(20):
                history.append({"role": "user", "content": f"s{n} q{i}"})
                out = engine.prepare(history, session_id=f"s{n}")
                assert history == out.messages
                history.append({"role": "assistant", "content": "a"})
        except BaseException as err:  # collected and re-raised on the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [] == [t.name for t in threads if t.is_alive()]
    assert [] == errors


def test_deterministic_across_stores(tmp_path: Path) -> None:
    """With the offline summarizer the same history gives the same messages (refs aside)."""
    history = [*build_history(60), {"role": "user", "content": "go"}]
    first, _ = prepared_on_a_new_store(tmp_path / "a.db", history)
    second, _ = prepared_on_a_new_store(tmp_path / "b.db", history)
    assert first == second


@pytest.mark.parametrize("budget", [8_000, 30_000, 120_000])
def test_incremental_paths_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """The view carried from turn to turn and gate 1's kept state give exactly the output of a full rebuild,
    turn by turn, over a long session with previews, trims and compactions."""
    import re

    from ragent_memory import StoreSettings
    from ragent_memory.cli.demo import simulate_session
    from ragent_memory.engine import session as session_module

    def replay(name: str) -> list[str]:
        settings = Settings(
            context_window_chars=budget, store=StoreSettings(path=str(tmp_path / f"{name}.db"))
        )
        outputs, history = [], []
        with MemoryEngine(settings) as engine:
            for messages in simulate_session(150, seed=9):
                history.append(messages[0])
                prepared = engine.prepare(history, session_id="s")
                outputs.append(re.sub(r"rm-[0-9a-f]+", "REF", repr(prepared.messages)))
                history.extend(messages[1:])
        return outputs

    fast = replay("fast")
    never_kept = property(lambda _s: None, lambda _s, _v: None)  # every turn rebuilds its view
    # With no view kept, gate 1's state (kept on the view) is never kept either.
    monkeypatch.setattr(session_module.Session, "view", never_kept, raising=False)
    slow = replay("slow")
    assert slow == fast


def test_fresh_system_prompt_each_turn_stays_incremental(
    make_engine: Callable[..., MemoryEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app that rebuilds only its system message every turn measures just that message
    and the new ones, and hashes none of the history (digests are computed when needed)."""
    from ragent_memory.engine import raw as session_module

    hashed: list[int] = []
    measured: list[int] = []
    real_digest, real_measured = session_module.digest, session_module.measured

    def counting_digest(message: dict[str, Any]) -> str:
        hashed.append(1)
        return real_digest(message)

    def counting_measured(message: dict[str, Any], index: int) -> int:
        measured.append(1)
        return real_measured(message, index)

    monkeypatch.setattr(session_module, "digest", counting_digest)
    monkeypatch.setattr(session_module, "measured", counting_measured)
    engine = make_engine()
    history: list[dict[str, Any]] = []
    for i in range(50):
        history += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
    engine.prepare([{"role": "system", "content": "t=0"}, *history], session_id="s")
    hashed.clear()
    measured.clear()
    history.append({"role": "user", "content": "next"})
    prepared = engine.prepare([{"role": "system", "content": "t=1"}, *history], session_id="s")
    assert 2 == len(measured)  # the new system message (position 0) and the new user message
    assert [] == hashed
    assert "t=1" == prepared.messages[0]["content"]


def test_in_place_edit_anywhere_is_seen(make_engine: Callable[..., MemoryEngine]) -> None:
    """Replacing a message's content in place is noticed, wherever the message is."""
    engine = make_engine()
    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    engine.prepare(history, session_id="s")
    history[1]["content"] = "edited"
    assert "edited" == engine.prepare(history, session_id="s").messages[1]["content"]
    history[1] = {"role": "tool", "content": "x"}
    with pytest.raises(InvalidMessagesError, match=r"messages\[1\]"):
        engine.prepare(history, session_id="s")


def _search_turn(i: int, content: str, call_id: str | None = None) -> list[dict[str, Any]]:
    from sessions import tool_loop

    return [
        {"role": "user", "content": f"question {i}"},
        *tool_loop(call_id or f"c{i}", content),
        {"role": "assistant", "content": "ok"},
    ]


def test_repeated_result_in_the_current_turn_is_not_substituted(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A result identical to an evicted one (same reused call id, same text) in the current
    turn is shown in full: substitutions belong to positions, not to content."""
    same = "policy text " * 150
    engine = make_engine(make_settings(context_window_chars=8_000, summary_enabled=False))
    history = [*_search_turn(0, same, "call_0")]
    for i in range(1, 4):
        history += _search_turn(i, "x" * 1500)
    history.append({"role": "user", "content": "check the policy again"})
    assert engine.prepare(history, session_id="s").report.trimmed >= 1
    history += _search_turn(9, same, "call_0")[1:3]
    shown = engine.prepare(history, session_id="s").messages
    assert same == shown[-1]["content"]


def test_failed_substitution_write_does_not_stop_later_trims(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """When the store cannot record a trim, the next turn trims again instead of trusting a
    skip hint computed for evictions that never happened."""
    from ragent_memory import StoreError

    engine = make_engine(make_settings(context_window_chars=8_000, summary_enabled=False))
    real = engine.store.save_substitutions
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreError("disk full")
        real(*args, **kwargs)

    engine.store.save_substitutions = flaky  # type: ignore[method-assign]
    history: list[dict[str, Any]] = []
    for i in range(6):
        history += _search_turn(i, "x" * 1500)
    history.append({"role": "user", "content": "q"})
    first = engine.prepare(history, session_id="s")
    assert 1 == calls["n"] or first.report.chars_out <= 8_000  # gate 1 failed; the ceiling fits B
    history += [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]
    second = engine.prepare(history, session_id="s")
    assert second.report.trimmed > 0
    assert second.report.chars_out <= engine.settings.trim_trigger_chars


def test_prepared_placeholders_are_the_callers_own(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Decorating a returned placeholder dict does not leak into later turns."""
    engine = make_engine(make_settings(context_window_chars=8_000, summary_enabled=False))
    history: list[dict[str, Any]] = []
    for i in range(6):
        history += _search_turn(i, "x" * 1500)
    history.append({"role": "user", "content": "q"})
    first = engine.prepare(history, session_id="s")
    for message in first.messages:
        message["cache_control"] = {"type": "ephemeral"}
    again = engine.prepare(history, session_id="s")
    assert all("cache_control" not in m for m in again.messages if m not in history)


def test_first_message_turning_from_system_to_user_invalidates(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A changed system prefix drops the summary in the same engine as after a restart."""
    from sessions import build_history

    engine = make_engine(make_settings(context_window_chars=20_000))
    history = [
        {"role": "system", "content": "persona"},
        *build_history(60),
        {"role": "user", "content": "go"},
    ]
    assert engine.prepare(history, session_id="s").report.generation >= 1
    history[0] = {"role": "user", "content": "persona, now said by the user"}
    rows = [r for r in engine.store.compactions("s")]
    engine.prepare(history, session_id="s")
    after = engine.store.compactions("s")[len(rows) :]
    assert "prefix_changed" in [r["reason"] for r in after if r["status"] == "invalidated"]


def test_mutating_prepared_messages_changes_nothing_else(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Every returned dict is the caller's own copy: editing it changes neither the history
    nor the next prepare."""
    engine = make_engine(make_settings(context_window_chars=8_000, summary_enabled=False))
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(6):
        history += _search_turn(i, "x" * 1500)
    history.append({"role": "user", "content": "q"})
    snapshot = copy.deepcopy(history)
    first = engine.prepare(history, session_id="s")
    expected = copy.deepcopy(first.messages)
    for message in first.messages:
        message["content"] = "CLOBBERED"
    assert snapshot == history
    assert expected == engine.prepare(history, session_id="s").messages
