"""Gate 1's kept state (``TrimState``): extended turn by turn it must know exactly what a look
at the whole view would, and the engine must drop it on anything that is not an append."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sessions import SYSTEM, LateSummarizer, tool_loop, user
from strategies import conversations

from ragent_memory import MemoryEngine, Settings, StoreSettings
from ragent_memory.core.chars import chars
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.turn_recall import hidden
from ragent_memory.gates.trim import (
    Eviction,
    Rebuild,
    Shown,
    TrimState,
    evict,
    protected_loops,
)

Message = dict[str, Any]
TOOLS = {"search_knowledge"}


def ref_for(text: str) -> str:
    return f"ref{len(text)}"


def whole_view(
    view: list[Message], sizes: list[int], kinds: dict[int, str]
) -> tuple[dict[int, int], dict[str, int]]:
    """What the candidates free, by view index, and the oddities, from the whole view at once
    (docs/design.md §4 read literally: loops, protection, the whitelist, shorter placeholders)."""
    loops = map_loops(view)
    protected = protected_loops(view, loops.loops)
    free: dict[int, int] = {}
    for loop in loops.loops:
        if loop.call_index in protected:
            continue
        calls = {c["id"]: c for c in view[loop.call_index]["tool_calls"]}
        for index in loop.result_indexes:
            call_id = view[index]["tool_call_id"]
            if kinds.get(index) == "trim" or loop.tool_names[call_id] not in TOOLS:
                continue
            arguments = calls[call_id]["function"]["arguments"]
            found = evict(view[index], index, view[index], arguments, sizes[index], "en", ref_for)
            if found is not None:
                free[index] = sizes[index] - chars(found.replacement)
    return free, loops.irregular


def fed(messages: list[Message], steps: list[int]) -> Iterator[tuple[list[Message], list[int]]]:
    """The view and its sizes after each chunk of ``steps`` messages is appended (the rest
    at the end); the caller may change the two lists between chunks."""
    view: list[Message] = []
    sizes: list[int] = []
    position = 0
    for step in [*steps, len(messages)]:
        added = messages[position : position + step]
        position += len(added)
        view += added
        sizes += [chars(m) for m in added]
        yield view, sizes
        if position >= len(messages):
            return


@given(conversations(max_turns=14), st.lists(st.integers(1, 9), max_size=30), st.data())
def test_extended_state_knows_what_the_whole_view_says(
    messages: list[Message], steps: list[int], data: st.DataObject
) -> None:
    """Fed the conversation a few messages at a time (so loops are cut mid-way, results arrive
    after their call, users slide the protection window), with trims applied in between, the
    kept candidates and oddities always equal those of the whole view looked at afresh."""
    kinds: dict[int, str] = {}
    state = TrimState(TOOLS, "en", ref_for)
    for view, sizes in fed(messages, steps):
        state.extend(Shown(view, sizes, {}, kinds))
        free, irregular = whole_view(view, sizes, kinds)
        assert {e.index for e, _ in state.candidates} == set(free)
        assert state.reclaim == sum(free.values())
        assert state.irregular == irregular
        if free and data.draw(st.booleans()):  # a trim applies every candidate
            for eviction in state.take():
                assert isinstance(eviction, Eviction)
                view[eviction.index] = eviction.replacement
                sizes[eviction.index] = chars(eviction.replacement)
                kinds[eviction.index] = "trim"
            assert not state.candidates and not state.reclaim


def rung_one(
    state: TrimState,
    view: list[Message],
    sizes: list[int],
    kinds: dict[int, str],
    chosen: set[int],
) -> tuple[TrimState, bool]:
    """The ceiling's rung 1 at ``chosen``: placeholders shown and the state told (as
    ``_stick`` tells it)."""
    for index in chosen:
        view[index] = {**view[index], "content": "[omitted]"}
        sizes[index], kinds[index] = chars(view[index]), "trim"
    state.replaced(chosen)
    return state, False


@given(conversations(max_turns=14), st.lists(st.integers(1, 9), max_size=30), st.data())
def test_state_follows_the_ceilings_placeholders_and_left_out_turns(
    messages: list[Message], steps: list[int], data: st.DataObject
) -> None:
    """Between appends the ceiling shows old tool results as placeholders (§4b rung 1) and
    leaves the oldest whole turns out (rung 4): the state, told so (``replaced``, ``shift``;
    rebuilt when it says it cannot follow), still knows what the whole view says."""
    kinds: dict[int, str] = {}
    state = TrimState(TOOLS, "en", ref_for)
    for view, sizes in fed(messages, steps):
        state.extend(Shown(view, sizes, {}, kinds))
        users = [i for i, m in enumerate(view) if m.get("role") == "user"]
        old = [i for i, m in enumerate(view) if m.get("role") == "tool" and users and i < users[-1]]
        if old and data.draw(st.booleans()):  # rung 1: placeholders outside the current turn
            state, _ = rung_one(
                state, view, sizes, kinds, data.draw(st.sets(st.sampled_from(old), min_size=1))
            )
        if len(users) > 1 and data.draw(st.booleans()):  # rung 4: the oldest whole turns out
            stop = data.draw(st.sampled_from(users[1:]))
            start = users[0]
            count = stop - start
            del view[start:stop], sizes[start:stop]
            kinds = {
                i - count if i >= stop else i: k for i, k in kinds.items() if not start <= i < stop
            }
            if not state.shift(start, count):
                state = TrimState(TOOLS, "en", ref_for)
                state.extend(Shown(view, sizes, {}, kinds))
        free, irregular = whole_view(view, sizes, kinds)
        assert {e.index for e, _ in state.candidates} == set(free)
        assert state.reclaim == sum(free.values())
        assert state.irregular == irregular
        assert state.end == len(view)
        users = [i for i, m in enumerate(view) if m.get("role") == "user"]
        assert state.last_user == (users[-1] if users else -1)
        assert state.orphans == set(map_loops(view).orphan_indexes)


def test_a_call_id_appended_twice_asks_for_a_rebuild() -> None:
    """An id appended again makes an earlier loop irregular: the state cannot follow."""
    view = [user("q1"), *tool_loop("a", "A" * 500), user("q2")]
    sizes = [chars(m) for m in view]
    state = TrimState(TOOLS, "en", ref_for)
    state.extend(Shown(view, sizes))
    view += [*tool_loop("a", "again"), user("q3")]
    sizes += [chars(m) for m in view[len(sizes) :]]
    try:
        state.extend(Shown(view, sizes))
    except Rebuild:
        pass
    else:
        raise AssertionError("a duplicate call id went unnoticed")
    fresh = TrimState(TOOLS, "en", ref_for)
    fresh.extend(Shown(view, sizes))
    assert {"duplicate_call_ids": 1, "incomplete_loops": 2} == fresh.irregular
    assert not fresh.candidates


# ------------------------------------------------------------------ the engine, kept vs afresh

REF = re.compile(r"rm-[0-9a-f]{20}")


class Twins:
    """Two engines on the same calls, each over its own append-only copy of the history: one
    keeps gate 1's state from call to call, the other drops it before every call (a look at
    the whole view each time). ``call`` asserts they prepare the same."""

    def __init__(self, tmp_path: Path, summarizer: Any = None, **settings: Any) -> None:
        self.engines = [
            MemoryEngine(
                Settings(
                    context_window_chars=20_000,
                    recall_enabled=False,
                    store=StoreSettings(path=str(tmp_path / f"{name}.db")),
                    **settings,
                ),
                summarizer=summarizer,
            )
            for name in ("kept", "afresh")
        ]
        self.histories: list[list[Message]] = [[SYSTEM], [copy.deepcopy(SYSTEM)]]
        self.trimmed = self.compacted = self.dropped = 0

    def add(self, *messages: Message) -> None:
        for history in self.histories:
            history.extend(copy.deepcopy(list(messages)))

    def replace(self, index: int, message: Message) -> None:
        for history in self.histories:
            history[index] = copy.deepcopy(message)

    def call(self) -> None:
        session = self.engines[1].sessions.get("s")
        if session is not None and session.view is not None:
            session.view.trim_hint = None
        a, b = (
            e.prepare(h, session_id="s") for e, h in zip(self.engines, self.histories, strict=True)
        )
        assert REF.sub("rm-", repr(a.messages)) == REF.sub("rm-", repr(b.messages))
        assert (a.report.trimmed, a.report.chars_out) == (b.report.trimmed, b.report.chars_out)
        kept = self.engines[0].sessions.get("s")
        if kept is not None and kept.view is not None:  # what recall leaves out, kept too
            view = kept.view
            assert frozenset(view.history_indexes(view.kinds)) == hidden(view)[1]
        self.trimmed = max(self.trimmed, a.report.trimmed)
        self.compacted += a.report.compacted
        self.dropped = max(self.dropped, a.report.dropped_turns)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


def result(turn: int, size: int = 1_500) -> str:
    return f"result {turn} " + "x" * size


def rag_turn(twins: Twins, turn: int, name: str = "search_knowledge") -> None:
    twins.add(user(f"q{turn}"))
    twins.call()
    loop = tool_loop(f"c{turn}", result(turn), name=name)
    twins.add(*loop, {"role": "assistant", "content": "ok"})


def test_an_edit_of_an_old_result_between_turns(tmp_path: Path) -> None:
    """The caller replaces an old tool result (kept and evicted ones alike): the view is
    rebuilt and with it gate 1's state, never carried over the edit."""
    twins = Twins(tmp_path, summary_enabled=False)
    for turn in range(24):
        rag_turn(twins, turn)
        if turn in (6, 9):
            index = 3 + 4 * (turn - 5)  # a result a few turns back
            twins.replace(index, {**twins.histories[0][index], "content": "edited " * 300})
    twins.call()
    twins.close()
    assert twins.trimmed


def test_trim_right_after_a_compaction(tmp_path: Path) -> None:
    """A compaction rebuilds the view: the next trims start from a new state."""
    twins = Twins(tmp_path, summary_enabled=True)
    for turn in range(40):  # results gate 1 may not evict, too: the view reaches gate 2
        rag_turn(twins, turn, "search_knowledge" if turn % 3 else "read_file")
    twins.close()
    assert twins.trimmed and twins.compacted


def test_the_window_slides_over_an_unanswered_call(tmp_path: Path) -> None:
    """A call never answered stays protected however far the window moves past it, and
    the loops around it are settled as usual."""
    twins = Twins(tmp_path, summary_enabled=False)
    for turn in range(24):
        rag_turn(twins, turn)
        if turn == 3:
            call = tool_loop("lost", "")[0]
            twins.add(call, {"role": "assistant", "content": "it timed out"})
    twins.call()
    twins.close()
    assert twins.trimmed


def test_turns_left_out_while_a_summary_is_late(tmp_path: Path) -> None:
    """While the summary is late the ceiling leaves the oldest turns out (§4b rung 4) every
    turn: the kept state follows the view's shift (a rebuild each turn cost O(view)) and
    prepares exactly what a look at the whole view does."""
    late = LateSummarizer()
    twins = Twins(tmp_path, summarizer=late, compaction_timeout_s=0)
    try:
        for turn in range(60):
            rag_turn(twins, turn)
            twins.add({"role": "assistant", "content": f"note {turn} " + "y" * 900})
        twins.call()
    finally:
        late.landed.set()
        twins.close()
    assert twins.trimmed and twins.dropped and not twins.compacted


def test_mid_turn_calls_and_no_user_message(tmp_path: Path) -> None:
    """Tool loops with no user message at all (every loop protected), then users; calls made
    between the results of one loop, so its results keep arriving after the state saw it."""
    twins = Twins(tmp_path, summary_enabled=False)
    for turn in range(5):
        twins.add(*tool_loop(f"n{turn}", result(turn)))
        twins.call()
    for turn in range(5, 24):
        twins.add(user(f"q{turn}"))
        call = {"id": f"p{turn}", "type": "function"}
        calls = [
            {
                **call,
                "id": f"p{turn}_{k}",
                "function": {"name": "search_knowledge", "arguments": "{}"},
            }
            for k in range(2)
        ]
        twins.add({"role": "assistant", "content": None, "tool_calls": calls})
        for k in range(2):
            twins.add({"role": "tool", "tool_call_id": f"p{turn}_{k}", "content": result(turn)})
            twins.call()
    twins.close()
    assert twins.trimmed


def test_a_user_message_alone_may_let_a_trim_pass() -> None:
    """A new user message moves the window: an old loop's result becomes a candidate though
    nothing large was appended."""
    view = [user("q1"), *tool_loop("a", "A" * 3_000), user("q2"), *tool_loop("b", "B" * 10)]
    view += [user("q3"), *tool_loop("c", "C" * 10)]
    sizes = [chars(m) for m in view]
    state = TrimState(TOOLS, "en", ref_for)
    state.extend(Shown(view, sizes))
    assert not state.candidates
    view.append(user("q4"))
    sizes.append(2)
    state.extend(Shown(view, sizes))
    assert state.due(total=10_000)
