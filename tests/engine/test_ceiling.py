"""The ceiling (docs/design.md §4b): the ladder's rungs as pure functions, then the engine keeping
every prompt inside B — mid-turn tool loops, skipped and slow compactions — stickily."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from sessions import tool_loop, without_recall

from ragent_memory import Settings
from ragent_memory.core.chars import Message, chars
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.compaction import summary_message
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.gates import ceiling
from ragent_memory.gates.ceiling import (
    MIN_PREVIEW_CHARS,
    Forms,
    current_turn_start,
    preview_turn,
    trim_all,
    turns_to_leave_out,
)
from ragent_memory.gates.reduce import Preview
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest


def ref_for(text: str) -> str:
    return f"rm-{len(text)}"


def turn(n: int, *results: int, name: str = "run_sql") -> list[Message]:
    """A user message and one tool loop per result size."""
    out: list[Message] = [{"role": "user", "content": f"question {n}"}]
    for k, size in enumerate(results):
        out += tool_loop(f"c{n}_{k}", "r" * size, name=name, arguments='{"q": "x"}')
    return out


def sizes_of(view: list[Message]) -> list[int]:
    return [chars(m) for m in view]


def evictions(view: list[Message], *, excess: int, evicted: set[int]) -> list[int]:
    """Step 1 over ``view`` (turn 4 current): the view indexes it evicts."""
    found, _ = trim_all(
        view,
        sizes_of(view),
        head=0,
        turn_start=9,
        excess=excess,
        forms=Forms("en", ref_for, {}, evicted),
    )
    assert all(e.replacement["content"].startswith("[Earlier tool result omitted") for e in found)
    return [e.index for e in found]


def previews(view: list[Message], *, excess: int) -> list[Preview]:
    """Step 3 over ``view`` (all of it the current turn), from the 50,000 oversized limit."""
    return preview_turn(
        view,
        sizes_of(view),
        turn_start=0,
        excess=excess,
        limit_chars=50_000,
        forms=Forms("en", ref_for, {}, set()),
    )


# ---------------------------------------------------------------------------- pure rungs


def test_current_turn_starts_at_the_last_user_message() -> None:
    """The current turn is the last user message on; none after the head → the head."""
    view = [{"role": "system", "content": "s"}, *turn(1, 10), *turn(2, 10)]
    assert 4 == current_turn_start(view, 1)
    assert 1 == current_turn_start([{"role": "system", "content": "s"}, *tool_loop("c", "r")], 1)


def test_trim_all_evicts_any_tool_oldest_first_until_it_fits() -> None:
    """Step 1 ignores the tool name and the 2-loop protection, starts with the oldest result
    and stops once the excess is freed; the current turn is never touched."""
    view = [*turn(1, 3_000), *turn(2, 3_000), *turn(3, 3_000), *turn(4, 3_000)]
    assert [2, 5] == evictions(view, excess=4_000, evicted=set())
    assert [2, 8] == evictions(view, excess=10**9, evicted={5})


def test_preview_turn_lowers_the_limit_just_enough() -> None:
    """Step 3 previews the current turn's results with the highest limit that fits, built
    from the originals; the floor is MIN_PREVIEW_CHARS."""
    view = turn(1, 20_000, 20_000)
    sizes = sizes_of(view)
    fitted = previews(view, excess=30_000)
    freed = sum(sizes[t.index] - chars(t.replacement) for t in fitted)
    assert freed >= 30_000
    assert [2, 4] == [t.index for t in fitted]
    # Just enough: a limit a little higher would not have fitted.
    assert freed - 30_000 < 2_000
    shown = [len(t.replacement["content"]) for t in previews(view, excess=10**9)]
    assert all(int(MIN_PREVIEW_CHARS * 0.3) <= n < MIN_PREVIEW_CHARS for n in shown)


def test_preview_turn_previews_tool_call_inputs_too() -> None:
    """A huge tool-call input of the current turn is previewed, its call id kept."""
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "a" * 9_000}}
    view: list[Message] = [
        {"role": "user", "content": "write"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    found = previews(view, excess=5_000)
    assert [1] == [t.index for t in found]
    assert "c1" == found[0].replacement["tool_calls"][0]["id"]


def test_turns_are_left_out_whole_and_never_the_current_one() -> None:
    """Step 4 cuts only at user messages, oldest first, never into the current turn."""
    view = [{"role": "system", "content": "s"}, *turn(1, 500), *turn(2, 500), *turn(3, 500)]
    assert (3, 1) == turns_to_leave_out(view, sizes_of(view), head=1, turn_start=7, excess=100)
    assert (6, 2) == turns_to_leave_out(view, sizes_of(view), head=1, turn_start=7, excess=600)
    assert (6, 2) == turns_to_leave_out(view, sizes_of(view), head=1, turn_start=7, excess=10**9)
    kept = view[:1] + view[7:]
    assert not map_loops(kept).orphan_indexes


# ---------------------------------------------------------------------------- the engine


def assert_regular(messages: list[Message]) -> None:
    loops = map_loops(messages)
    assert not loops.orphan_indexes
    assert all(loop.is_complete for loop in loops.loops)


def long_tool_loop(results: int, size: int) -> list[Message]:
    """One turn that keeps calling a non-evictable tool (the last message a tool result)."""
    history: list[Message] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "audit every table"},
    ]
    for k in range(results):
        history += tool_loop(f"c{k}", f"{k} " + "row " * (size // 4), name="run_sql")
    return history


def test_a_long_tool_loop_in_one_turn_stays_inside_b(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Mid-turn, compaction must wait for the user — the ceiling does not: every call ≤ B,
    the system prompt and the current request stay, no loop is broken."""
    engine = make_engine(make_settings(context_window_chars=20_000))
    history = long_tool_loop(36, 1_500)  # at their floors the 36 previews fit B
    for end in range(4, len(history) + 1, 2):
        prepared = engine.prepare(history[:end], session_id="s1")
        assert prepared.report.chars_out <= 20_000, end
        assert not prepared.report.over_budget
        assert history[0] == prepared.messages[0]
        assert any(m.get("content") == "audit every table" for m in prepared.messages)
        assert_regular(prepared.messages)


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_ceiling_placeholders_are_sticky(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """What the ceiling rewrote stays rewritten: the next call's view starts with this
    call's view, byte for byte, up to the messages it adds."""
    engine = make_engine(make_settings(context_window_chars=20_000, summary_enabled=False))
    history = [{"role": "system", "content": "s"}]
    for n in range(12):
        history += turn(n, 1_800)
        history.append({"role": "assistant", "content": f"answer {n}"})
    history.append({"role": "user", "content": "next"})
    first = engine.prepare(history, session_id="s1")
    assert first.report.chars_out <= 20_000
    history += tool_loop("late", "z" * 1_000, name="run_sql")
    second = engine.prepare(history, session_id="s1")
    assert second.report.chars_out <= 20_000
    assert first.messages == second.messages[: len(first.messages)]


def test_irreducible_turn_is_sent_with_over_budget(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """System prompt + a current request alone over B: sent as is, over_budget, a warning."""
    engine = make_engine(make_settings(context_window_chars=8_000))
    history = [
        {"role": "system", "content": "s" * 3_000},
        *turn(1, 5_000),
        {"role": "user", "content": "u" * 6_000},
    ]
    with structlog.testing.capture_logs() as logs:
        prepared = engine.prepare(history, session_id="s1")
    assert prepared.report.over_budget
    assert [history[0], history[-1]] == prepared.messages
    assert ["ceiling.over_budget"] == [e["event"] for e in logs if e["log_level"] == "warning"]


def test_turns_left_out_are_handed_to_the_leave_hook_once(
    make_settings: Callable[..., Settings],
) -> None:
    """Messages the ceiling leaves out reach on_leave, each raw index once."""
    left: list[int] = []

    def on_leave(session_id: str, user_id: str | None, items: list[tuple[int, Message]]) -> None:
        left.extend(i for i, _ in items)

    settings = make_settings(context_window_chars=8_000, summary_enabled=False)
    with MemoryEngine(settings, on_leave=on_leave) as engine:
        history: list[Message] = [{"role": "system", "content": "s"}]
        dropped = 0
        for n in range(10):
            history += [
                {"role": "user", "content": f"q{n} " + "u" * 1_500},
                {"role": "assistant", "content": "a" * 1_000},
            ]
            report = engine.prepare(history, session_id="s1").report
            assert report.chars_out <= 8_000
            dropped = max(dropped, report.dropped_turns)
    assert dropped >= 1
    assert len(left) == len(set(left))
    assert {1, 2} <= set(left)


class Slow:
    """The offline summarizer behind a gate the test opens."""

    name = "slow"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.offline = OfflineSummarizer()

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        assert self.gate.wait(timeout=60)
        return self.offline.summarize(request)

    def close(self) -> None:
        self.gate.set()


@pytest.mark.both_backends  # reliability on PostgreSQL too
def test_a_summarizer_slower_than_the_timeout_never_lets_a_turn_over_b(
    make_settings: Callable[..., Settings],
) -> None:
    """While a summary is late every turn stays ≤ B (the ladder's other rungs), and the late
    summary is adopted once it arrives."""
    summarizer = Slow()
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0.05)
    reports: list[Any] = []
    with MemoryEngine(settings, summarizer=summarizer) as engine:
        history: list[Message] = [{"role": "system", "content": "s"}]
        for n in range(40):
            history += [
                {"role": "user", "content": f"q{n} " + "u" * 400},
                *tool_loop(f"c{n}", "r" * 600, name="run_sql"),
                {"role": "assistant", "content": "a" * 400},
            ]
            history.append({"role": "user", "content": "go on"})
            reports.append(engine.prepare(history, session_id="s1").report)
            history.pop()
        assert all(r.chars_out <= 20_000 for r in reports)
        assert {"timeout", "in_progress"} <= {r.skipped_reason for r in reports}
        assert all(r.generation == 0 for r in reports)
        summarizer.gate.set()
        assert engine.flush(timeout_s=60)
        history.append({"role": "user", "content": "go on"})
        late = engine.prepare(history, session_id="s1").report
        applied = [
            r["generation"] for r in engine.store.compactions("s1") if r["status"] == "applied"
        ]
    assert late.compacted
    assert late.generation >= 1
    assert 1 == applied[0]  # the late summary, adopted (a next one may follow at once)
    assert late.chars_out <= 20_000


@pytest.mark.parametrize("budget", [8_000, 20_000])
def test_skipped_compactions_still_fit(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], budget: int
) -> None:
    """A compaction skipped as not worth it (a huge current request) cannot push a turn
    over B: the mid-turn rungs fit it."""
    engine = make_engine(make_settings(context_window_chars=budget))
    history: list[Message] = [{"role": "system", "content": "s"}]
    for n in range(6):
        history += [
            {"role": "user", "content": f"q{n}"},
            {"role": "assistant", "content": "a" * 600},
        ]
    history += turn(99, budget // 2, budget // 2)
    prepared = engine.prepare(history, session_id="s1")
    assert prepared.report.chars_out <= budget
    assert_regular(prepared.messages)


# ------------------------------------------------ rung 4 sticky while a summary is out (§4b)


@pytest.fixture
def make_slow() -> Iterator[Callable[[], Slow]]:
    """Gated summarizers, every gate opened at teardown: a failing test's engines close
    at once instead of waiting for a summary nobody releases (request it after
    ``make_engine``, so it is torn down first)."""
    made: list[Slow] = []

    def make() -> Slow:
        made.append(Slow())
        return made[-1]

    yield make
    for summarizer in made:
        summarizer.gate.set()


def chat_turn(n: int) -> list[Message]:
    """A 2,000-char turn: the user's question and the answer."""
    return [
        {"role": "user", "content": f"q{n} " + "u" * (995 - len(str(n)))},
        {"role": "assistant", "content": f"a{n} " + "a" * (995 - len(str(n)))},
    ]


def tail_start(history: list[Message], out: list[Message], head: int) -> int:
    """Where in ``history`` the messages after ``out[:head]`` begin (they are its end, as
    written: these sessions have no tool results)."""
    start = len(history) - (len(out) - head)
    assert [without_recall(m) for m in out[head:]] == history[start:]
    return start


def users(messages: list[Message]) -> int:
    return sum(m["role"] == "user" for m in messages)


def test_turns_left_out_stay_out_while_a_summary_is_late(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    make_slow: Callable[[], Slow],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the summary is out, rung 4 leaves out what a turn's growth needs and the
    ceiling's headroom, and the turns left out before stay out (rung 4 is sticky): the next
    turn appends without another rung. Every message left out is handed to recall once, and
    the summary is adopted when it lands."""
    counts: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        found = turns_to_leave_out(*args, **kwargs)
        counts.append(found[0])
        return found

    monkeypatch.setattr(ceiling, "turns_to_leave_out", counted)
    left: list[int] = []
    summarizer = make_slow()
    engine = make_engine(
        make_settings(context_window_chars=20_000, compaction_timeout_s=0),
        summarizer=summarizer,
        on_leave=lambda s, u, items: left.extend(i for i, _ in items),
    )
    history: list[Message] = [{"role": "system", "content": "s"}]
    for n in range(60):
        history += chat_turn(n)[:1]
        prepared = engine.prepare(history, session_id="s1")
        report = prepared.report
        assert report.chars_out <= 20_000
        assert 0 == report.generation
        start = tail_start(history, prepared.messages, 1)
        assert history[start]["role"] == "user"
        assert report.dropped_turns == users(history[1:start])
        history += chat_turn(n)[1:]
    assert report.dropped_turns >= 45
    # An event leaves out its turn's growth and B's headroom (10%: one more 2,000-char turn),
    # so the prefix changes every other turn, not every turn, while the summary is out.
    assert counts and max(counts) <= 4, counts
    assert len(counts) <= 30, counts
    assert sorted(left) == list(range(1, start))  # each message left out indexed, once
    summarizer.gate.set()
    assert engine.flush(timeout_s=60)
    state = engine.store.load_session("s1")  # before the next compaction may land
    history.append({"role": "user", "content": "and now?"})
    adopted = engine.prepare(history, session_id="s1")
    assert state is not None and 1 == state.generation == adopted.report.generation
    assert summary_message(state.summary, "en") == adopted.messages[1]
    start = tail_start(history, adopted.messages, 2)
    assert start >= state.covered
    assert adopted.report.dropped_turns == users(history[state.covered : start])
    assert adopted.report.chars_out <= 20_000
    assert len(left) == len(set(left))


def test_turns_left_out_come_back_when_the_summary_does_not_cover_them(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    make_slow: Callable[[], Slow],
) -> None:
    """Turns left out past what the late summary covers are shown again once it is adopted
    and there is room; until then they stay out, even when room opens up."""
    summarizer = make_slow()
    engine = make_engine(
        make_settings(context_window_chars=20_000, compaction_timeout_s=0),
        summarizer=summarizer,
    )
    history: list[Message] = [{"role": "system", "content": "s"}]
    for n in range(9):  # the compaction starts on q8's turn and waits for the gate
        history += chat_turn(n)[:1]
        engine.prepare(history, session_id="s1")
        history += chat_turn(n)[1:]
    history += turn(9)
    for k in range(60):  # the current turn's previews push out the oldest turns, one by one
        history += tool_loop(f"c9_{k}", f"{k} " + "r" * 1_500, name="search_knowledge")
        report = engine.prepare(history, session_id="s1").report
        assert report.chars_out <= 20_000
        if report.dropped_turns == 8:
            break
    assert 8 == report.dropped_turns  # past the 6 turns the summary will cover
    history += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "q10"}]
    waiting = engine.prepare(history, session_id="s1")  # turn 9's results are trimmed now
    assert waiting.report.chars_out < 12_000
    assert 8 == waiting.report.dropped_turns  # sticky: room, but no summary yet
    summarizer.gate.set()
    assert engine.flush(timeout_s=60)
    state = engine.store.load_session("s1")
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "q11"}]
    adopted = engine.prepare(history, session_id="s1")
    assert state is not None and 1 == adopted.report.generation == state.generation
    assert 0 == adopted.report.dropped_turns
    shown = [m.get("content") for m in adopted.messages]
    uncovered = [m["content"] for m in history[state.covered : 19] if m["role"] == "user"]
    assert uncovered  # the summary covers turns 0-5: 6-8 were left out, not covered
    assert all(text in shown for text in uncovered)  # back in view
    assert adopted.messages[2] == history[state.covered]


def test_a_restart_while_turns_are_left_out_adopts_the_right_view(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    make_slow: Callable[[], Slow],
) -> None:
    """A new engine on the same store picks up the summary that landed after the old one
    stopped, keeps leaving out turns while its own summary is late, and adopts it: the
    system prompt, the summary, then the history from where the ceiling needs it on."""
    settings = make_settings(context_window_chars=20_000, compaction_timeout_s=0)
    history: list[Message] = [{"role": "system", "content": "s"}]

    def run(engine: MemoryEngine, turns: range) -> list[Any]:
        reports = []
        for n in turns:
            history.extend(chat_turn(n)[:1])
            reports.append(engine.prepare(history, session_id="s1").report)
            history.extend(chat_turn(n)[1:])
        assert all(r.chars_out <= 20_000 for r in reports)
        assert max(r.dropped_turns for r in reports) >= 10
        return reports

    first = make_slow()
    engine = make_engine(settings, summarizer=first)
    assert all(0 == r.generation for r in run(engine, range(30)))
    first.gate.set()  # the summary lands after this engine's last turn
    assert engine.flush(timeout_s=60)
    engine.close()
    second = make_slow()
    left: list[int] = []
    engine = make_engine(
        settings, summarizer=second, on_leave=lambda s, u, items: left.extend(i for i, _ in items)
    )
    # The first engine's summary is picked up; this engine's own one is late.
    assert {1} == {r.generation for r in run(engine, range(30, 60))}
    second.gate.set()
    assert engine.flush(timeout_s=60)
    state = engine.store.load_session("s1")  # before a next compaction may land
    history.append({"role": "user", "content": "and now?"})
    adopted = engine.prepare(history, session_id="s1")
    assert len(left) == len(set(left))
    assert state is not None and 2 == state.generation == adopted.report.generation
    assert [history[0], summary_message(state.summary, "en")] == adopted.messages[:2]
    start = tail_start(history, adopted.messages, 2)
    assert start >= state.covered
    assert adopted.report.dropped_turns == users(history[state.covered : start])
    assert adopted.report.chars_out <= 20_000


class Forgetful:
    """A summarizer that keeps nothing, so what the summary covers is only recalled."""

    name = "forgetful"

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        return SummaryOutcome("## User requests\nnone\n## To-do\nnone\n## Next step\nnone", "f", 1)

    def close(self) -> None:
        return None


def joined_chars(messages: list[Message]) -> int:
    """The prompt as a consumer that joins a message's text parts with a newline reads it
    (LangChain's ``convert_to_openai_messages``, many providers)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": "\n".join(p["text"] for p in content)}
        total += chars(message)
    return total


def test_a_block_shown_again_in_a_tool_loop_leaves_room_for_the_part_separator(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """The turn's recall block, shown again on the tool loop's next call, fits B with the
    newline a consumer puts between it and the question: a tool result that leaves exactly
    the block's length free does not make the prompt B + 1 (the LangChain 200-turn run's
    call at 20,001 chars)."""
    budget = 8_000
    settings = make_settings(context_window_chars=budget)
    engine = make_engine(settings, summarizer=Forgetful())
    history = [{"role": "system", "content": "persona"}]
    for t in range(40):
        said = "my locker at the gym is the blue one beside the sauna." if t == 1 else f"chat {t}"
        history += [
            {"role": "user", "content": said + " filler words here." * 12},
            {"role": "assistant", "content": f"Reply {t}: " + "that sounds fine. " * 8},
        ]
        engine.prepare(history, session_id="s")
    history.append({"role": "user", "content": "Which locker at the gym is mine?"})
    asked = engine.prepare(history, session_id="s").report
    assert asked.recalled >= 1
    call = tool_loop("c1", "", name="lookup")
    free = budget - asked.chars_out - asked.recalled_chars - chars(call[0])
    call[1]["content"] = "r" * (free - chars({**call[1], "content": ""}))
    prepared = engine.prepare([*history, *call], session_id="s")
    assert joined_chars(prepared.messages) <= budget
