"""Recall through the engine (docs/design.md §9b): the block in prepare, search_memory, isolation,
cache safety and the settings that switch it."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from sessions import tool_loop, without_recall

from ragent_memory import Settings, StoreSettings
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import StoreError
from ragent_memory.recall.excerpts import HEADERS
from ragent_memory.recall.refs import REF_PATTERN, find_refs
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

# The recall block end to end on both stores (FTS5 and tsvector).
pytestmark = pytest.mark.both_backends


def chat(turns: int, *, seed: int = 1, planted: dict[int, str] | None = None) -> list[dict]:
    """A long chat: user/assistant pairs of filler, with planted user statements."""
    rng = random.Random(seed)
    topics = ["weather", "traffic", "lunch", "the game", "a movie", "the news", "work", "tea"]
    out: list[dict[str, Any]] = []
    for t in range(turns):
        said = (planted or {}).get(t) or f"Turn {t}: some chat about {rng.choice(topics)}. " * 3
        out += [
            {"role": "user", "content": said},
            {"role": "assistant", "content": f"Reply {t}: sure, " + "that sounds fine. " * 4},
        ]
    return out


class ForgetfulSummarizer:
    """A model that keeps nothing: valid sections, no facts (what a weak model does)."""

    name = "forgetful"

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        return SummaryOutcome("## User requests\nnone\n## To-do\nnone\n## Next step\nnone", "f", 1)

    def close(self) -> None:
        return None


def block_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, list) and content[0]["text"].startswith(HEADERS["en"]):
        return str(content[0]["text"])
    return ""


LONG_FACT = "The warehouse inventory audit. " + "Shelf row details follow. " * 60
WAREHOUSE_QUESTION = {"role": "user", "content": "warehouse inventory audit crates count"}


def warehouse(
    make_engine: Callable[..., MemoryEngine], settings: Settings
) -> tuple[MemoryEngine, list[dict[str, Any]]]:
    """An engine on B = 8,000 that forgets everything in its summaries, and a history whose
    long planted fact (message 4, clipped when recalled) its turns have compacted away."""
    engine = make_engine(settings, summarizer=ForgetfulSummarizer())
    history = chat(80, planted={2: LONG_FACT + "Final count: 9137 crates."})
    replay(engine, history)
    return engine, history


def planted_ref(block: str) -> str:
    """The ref named on the line that shows the planted fact (every hit names its own)."""
    (ref,) = find_refs(next(line for line in block.splitlines() if "Final count" in line))
    return ref


def small_blocks(make_settings: Callable[..., Settings]) -> Settings:
    """B = 8,000 with blocks of a fifth of B: the replayed turns' blocks do not show the
    planted fact (as a neighbour of filler hits) before the question does."""
    return make_settings(context_window_chars=8_000, recall={"max_chars": 1_600})


def replay(engine: MemoryEngine, history: list[dict[str, Any]]) -> None:
    """Each user turn of ``history`` prepared in order."""
    for i in range(0, len(history), 2):
        engine.prepare(history[: i + 1], session_id="s")


def test_compacted_fact_comes_back_when_asked(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A fact covered by a compaction is recalled at the end of the final user message, the
    report counts it, and the block stays within recall_max_chars and B (with the view)."""
    settings = make_settings(context_window_chars=8_000)
    engine = make_engine(settings, summarizer=ForgetfulSummarizer())
    # No identifier in the fact (no number, code or name): the retention check (docs/design.md §6)
    # would restore one into the summary, and then it is in view, not recalled.
    history = chat(80, planted={2: "my locker at the gym is the blue one beside the sauna."})
    for i in range(0, len(history), 2):
        engine.prepare(history[: i + 1], session_id="s")
    asked = [*history, {"role": "user", "content": "Which locker at the gym is mine?"}]
    prepared = engine.prepare(asked, session_id="s")
    report = prepared.report
    assert report.generation >= 1
    block = block_of(prepared.messages[-1])
    assert "sauna" in block
    assert (report.recalled_chars, asked[-1]) == (len(block), without_recall(prepared.messages[-1]))
    assert report.recalled >= 1
    assert len(block) <= settings.recall_max_chars
    assert report.chars_out + len(block) <= settings.context_window_chars
    # nowhere else but in recall blocks (an earlier turn's may hold it too)
    shown = "".join(str(without_recall(m)["content"]) for m in prepared.messages[:-1])
    assert "sauna" not in shown


def test_block_room_runs_to_b_not_to_the_compaction_trigger(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """The block is not part of the view: with the view near the compaction trigger it still
    gets min(recall_max_chars, B − view) — past the trigger, never past B."""
    settings = make_settings(context_window_chars=8_000)
    engine = make_engine(settings, summarizer=ForgetfulSummarizer())
    # Different sentences (the verbatim user requests in the summary hold some word for word).
    colours = ["blue", "red", "green", "grey", "white", "black", "pink", "brown", "gold", "tan"]
    said = "I keep a towel in the {} locker beside the sauna at the gym."
    history = chat(90, planted={3 + 3 * k: said.format(c) for k, c in enumerate(colours)})
    sent: list[tuple[int, int]] = []
    for i in range(0, len(history), 2):
        engine.prepare(history[: i + 1], session_id="s")
        asked = [*history[:i], {"role": "user", "content": "Where is my towel at the gym?"}]
        report = engine.prepare(asked, session_id="s").report
        sent.append((report.chars_out, report.recalled_chars))
    budget, trigger = settings.context_window_chars, settings.compact_trigger_chars
    assert all(
        view + block <= budget and block <= settings.recall_max_chars for view, block in sent
    )
    assert any(view + block > trigger for view, block in sent)


def test_clipped_excerpt_ref_reads_back_the_whole_message(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """An excerpt clipped to fit names a recall ref that reads back the full message."""
    engine, history = warehouse(make_engine, make_settings(context_window_chars=8_000))
    asked = [*history, WAREHOUSE_QUESTION]
    block = block_of(engine.prepare(asked, session_id="s").messages[-1])
    ref = planted_ref(block)
    assert history[4]["content"] == engine.recall("s", ref, limit=100_000).split("\n[recall: ")[0]


def test_a_ref_resolves_from_another_engine_as_soon_as_prepare_returns(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Every ref a prepared message shows is readable when ``prepare`` returns: a second
    engine on the same store (another process, or host) reads it back at once, with no
    flush, no ``after_turn`` and nothing asked of the first engine."""
    settings = make_settings(context_window_chars=8_000)
    engine, history = warehouse(make_engine, settings)
    other = make_engine(settings)
    prepared = engine.prepare([*history, WAREHOUSE_QUESTION], session_id="s")
    ref = planted_ref(block_of(prepared.messages[-1]))
    whole = other.recall("s", ref, limit=100_000).split("\n[recall: ")[0]
    assert history[4]["content"] == whole


def test_a_ref_shown_again_resolves_after_the_session_is_dropped_and_replayed(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """The same excerpt shown turn after turn is stored once, yet its ref resolves in every
    block: also after drop_session erased it and the same history was replayed."""
    engine, history = warehouse(make_engine, make_settings(context_window_chars=8_000))
    asked = [*history, WAREHOUSE_QUESTION]
    for life in range(2):
        if life:
            replay(engine, history)
        for _turn in range(2):
            ref = planted_ref(block_of(engine.prepare(asked, session_id="s").messages[-1]))
            whole = engine.recall("s", ref, limit=100_000).split("\n[recall: ")[0]
            assert history[4]["content"] == whole
        engine.drop_session("s")


def test_an_excerpt_shown_again_once_its_offload_aged_is_written_again(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """An excerpt shown again keeps its full text stored: written with the block that first
    showed it, and not again while that is recent (the same question sent again shows the
    block kept on it, searching nothing)."""
    engine, history = warehouse(make_engine, small_blocks(make_settings))
    written: list[list[str]] = []
    real = engine.store.offload_all

    def counting(session_id: str, contents: Sequence[str], *, ttl_days: float) -> None:
        written.append(list(contents))
        real(session_id, contents, ttl_days=ttl_days)

    engine.store.offload_all = counting  # type: ignore[method-assign]
    asked = [*history, WAREHOUSE_QUESTION]
    first = block_of(engine.prepare(asked, session_id="s").messages[-1])
    assert [[history[4]["content"]]] == written
    assert first == block_of(engine.prepare(asked, session_id="s").messages[-1])
    again = [*asked, {"role": "assistant", "content": "Let me look."}, WAREHOUSE_QUESTION]
    lead = first.split("\n— session")[1]  # the planted fact's excerpt (the room is less now)
    assert lead in block_of(engine.prepare(again, session_id="s").messages[-1])
    assert 1 == len(written)  # written a moment ago: nothing to do


def test_no_block_when_disabled(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """recall_enabled: false shows nothing, at the user's call or in the turn's tool loop."""
    history = chat(80, planted={2: "My locker code at the gym is heron."})
    asked = [*history, {"role": "user", "content": "What is my gym locker code?"}]
    off = make_engine(make_settings(context_window_chars=8_000, recall_enabled=False))
    for messages in (asked, [*asked, *tool_loop("c1", "Gym opening hours: 7 to 22.")]):
        prepared = off.prepare(messages, session_id="s")
        assert (0, 0) == (prepared.report.recalled, prepared.report.recalled_chars)
        assert not any(block_of(m) for m in prepared.messages)


def test_a_turns_block_stays_on_its_message(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """The block found for a turn's user message stays on that message, byte for byte, in
    the turn's tool-loop calls and in later turns (the prefix a provider caches stays), for
    another engine on the same store too; it searches nothing again. When the loop's results
    leave too little room, the ceiling takes the blocks off first and the call stays within
    B. The next user turn gets a block of its own."""
    budget = 8_000
    # blocks of a fifth of B: the first two turns' blocks leave the third its room (blocks
    # taking the whole room would be taken off for it: an event this test does not pin)
    settings = small_blocks(make_settings)
    engine = make_engine(settings)
    # no identifier in the planted line (a number or a place name), so the summary's retention
    # check does not keep it and only recall can bring it back
    planted = {2: "My locker code at the gym is heron.", 9: "The gym locker room is blue."}
    history = chat(80, planted=planted)
    asked = [*history, {"role": "user", "content": "What is my gym locker code?"}]
    first = engine.prepare(asked, session_id="s")
    block = block_of(first.messages[-1])
    assert "heron" in block and first.report.recalled >= 2
    assert first.report.recalled_chars == len(block)
    at = len(first.messages) - 1
    looped = [*asked, *tool_loop("c1", "Gym opening hours: 7 to 22.", name="lookup")]
    second = engine.prepare(looped, session_id="s")
    assert (0, False) == (second.report.trimmed, second.report.compacted)  # no gate moved it
    assert encoded(first.messages) == encoded(second.messages[: at + 1])
    assert looped[-2:] == second.messages[at + 1 :]
    assert (0, 0) == (second.report.recalled, second.report.recalled_chars)  # nothing searched
    elsewhere = make_engine(settings).prepare(looped, session_id="s")  # another host
    assert encoded(second.messages) == encoded(elsewhere.messages)
    # the next turn: the last one's block stays where it was, the new one rides on its question
    nxt = [*looped, {"role": "assistant", "content": "Open 7 to 22."}]
    nxt.append({"role": "user", "content": "And what is my gym locker code again?"})
    third = engine.prepare(nxt, session_id="s")
    assert encoded(second.messages) == encoded(third.messages[: len(second.messages)])
    assert third.report.recalled > 0 and block_of(third.messages[-1])
    # loop results that leave less room than the blocks take: they leave, B holds
    size = budget - third.report.chars_out + 200  # in loops under the oversized limit
    parts = -(-size // (settings.oversized_tool_result_chars - 100))
    grown_loops = [
        m
        for i in range(parts)
        for m in tool_loop(
            f"g{i}", "Gym rules, item by item. " * (size // parts // 25), name="lookup"
        )
    ]
    grown = engine.prepare([*nxt, *grown_loops], session_id="s")
    assert grown.report.chars_out <= budget
    assert not any(block_of(m) for m in grown.messages)
    assert without_recall(first.messages[at]) == grown.messages[at] == asked[-1]


def encoded(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


def test_caller_messages_never_mutated(make_engine: Callable[..., MemoryEngine]) -> None:
    """The block goes into a new dict; the caller's history is unchanged."""
    engine = make_engine(Settings(context_window_chars=8_000, store=make_engine().settings.store))
    history = chat(60, planted={1: "The vault code is 8812."})
    history.append({"role": "user", "content": "vault code?"})
    before = copy.deepcopy(history)
    prepared = engine.prepare(history, session_id="s")
    assert before == history
    assert "8812" in block_of(prepared.messages[-1])


def test_prefix_byte_identical_between_turns_without_gates(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """On every turn without a trim or compaction, the previous call's messages, its final
    user message with its block, are byte-identical at the head of this call's: recall never
    breaks a provider's prompt cache."""
    engine = make_engine(make_settings(context_window_chars=8_000))
    history: list[dict[str, Any]] = []
    previous: list[dict[str, Any]] | None = None
    previous_generation = previous_trimmed = -1
    checked = recalled = 0
    for message in chat(120, seed=5):
        history.append(message)
        if message["role"] != "user":
            continue
        engine.after_turn(history[:-1], session_id="s")
        prepared = engine.prepare(history, session_id="s")
        report = prepared.report
        recalled += report.recalled > 0
        is_quiet = (report.generation, report.trimmed) == (previous_generation, previous_trimmed)
        is_quiet = is_quiet and not report.recall_evicted
        if previous is not None and is_quiet and not report.compacted:
            assert previous == prepared.messages[: len(previous)]  # its block too
            checked += 1
        previous = prepared.messages
        previous_generation, previous_trimmed = report.generation, report.trimmed
    assert checked > 30 and recalled > 30


def test_chinese_fact_recalled_in_another_session(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A fact said in Chinese in session A is recalled by a Chinese question in session B."""
    engine = make_engine(make_settings(context_window_chars=8_000, language="zh"))
    first = [
        {"role": "user", "content": "我对花生过敏，吃了会很严重。"},
        {"role": "assistant", "content": "好的，我记住了。"},
    ]
    engine.after_turn(first, session_id="A", user_id="u1")
    engine.flush()
    asked = [{"role": "user", "content": "我对什么东西过敏？"}]
    prepared = engine.prepare(asked, session_id="B", user_id="u1")
    assert "花生" in block_of_zh(prepared.messages[-1])
    assert "花生" in engine.search("B", "过敏", user_id="u1")


def block_of_zh(message: dict[str, Any]) -> str:
    content = message["content"]
    return str(content[0]["text"]) if isinstance(content, list) else ""


def test_search_is_bound_to_the_user(make_engine: Callable[..., MemoryEngine]) -> None:
    """search() sees the caller's sessions, never another user's; bad input gets a refusal."""
    engine = make_engine()
    engine.after_turn(
        [{"role": "user", "content": "My passport number is P-1111."}], session_id="a", user_id="u1"
    )
    engine.after_turn(
        [{"role": "user", "content": "My passport number is P-2222."}], session_id="b", user_id="u2"
    )
    engine.flush()
    mine = engine.search("c", "passport number", user_id="u1")
    assert "P-1111" in mine and "P-2222" not in mine
    assert "P-2222" not in engine.search("c", "passport number")
    assert engine.search("c", "  ", user_id="u1").startswith("[search_memory:")
    assert engine.search("c", "passport", user_id="u1", limit=0).startswith("[search_memory:")
    assert "search_memory" == engine.search_tool()["function"]["name"]


def test_drop_session_and_forget_erase_recall(make_engine: Callable[..., MemoryEngine]) -> None:
    """A dropped session and a forgotten user are gone from search."""
    engine = make_engine()
    engine.after_turn(
        [{"role": "user", "content": "Zebra code Z-1."}], session_id="a", user_id="u1"
    )
    engine.after_turn(
        [{"role": "user", "content": "Zebra code Z-2."}], session_id="b", user_id="u1"
    )
    engine.flush()
    engine.drop_session("a")
    found = engine.search("c", "zebra code", user_id="u1")
    assert "Z-2" in found and "Z-1" not in found
    engine.forget("u1")
    assert "Z-2" not in engine.search("c", "zebra code", user_id="u1")


def test_a_block_whose_full_texts_cannot_be_stored_is_not_shown(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """The full texts a block's refs name are written in one store call before it is shown;
    when that fails the turn shows no block (no ref that would not resolve) and logs it, and
    the next turn writes them and shows it."""
    engine, history = warehouse(make_engine, small_blocks(make_settings))
    calls: list[list[str]] = []
    real = engine.store.offload_all

    def first_fails(session_id: str, contents: Sequence[str], *, ttl_days: float) -> None:
        calls.append(list(contents))
        if len(calls) == 1:
            raise StoreError("disk full")
        real(session_id, contents, ttl_days=ttl_days)

    engine.store.offload_all = first_fails  # type: ignore[method-assign]
    asked = [*history, WAREHOUSE_QUESTION]
    with structlog.testing.capture_logs() as logs:
        assert "" == block_of(engine.prepare(asked, session_id="s").messages[-1])
    assert "recall.failed" in [e["event"] for e in logs]
    ref = planted_ref(block_of(engine.prepare(asked, session_id="s").messages[-1]))
    assert 2 == len(calls) and all(history[4]["content"] in texts for texts in calls)
    assert history[4]["content"] == engine.store.read_offload("s", ref)


def test_a_kept_block_answers_only_its_user_and_nothing_forgotten(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A kept block is shown only to the user it was searched for, and only while nothing
    was forgotten or dropped since: otherwise it leaves its message."""
    settings = make_settings(context_window_chars=8_000)
    engine = make_engine(settings)
    history = chat(80, planted={2: "My locker code at the gym is heron."})
    asked = [*history, {"role": "user", "content": "What is my gym locker code?"}]
    looped = [*asked, *tool_loop("c1", "Gym opening hours: 7 to 22.", name="lookup")]
    at = len(engine.prepare(asked, session_id="s", user_id="u1").messages) - 1
    kept = engine.prepare(looped, session_id="s", user_id="u1")
    assert "heron" in block_of(kept.messages[at])
    other = engine.prepare(looped, session_id="s", user_id="u2")
    assert not any(block_of(m) for m in other.messages)
    again = engine.prepare(asked, session_id="s", user_id="u1")
    assert "heron" in block_of(again.messages[at])
    engine.forget("u1")
    forgotten = engine.prepare(looped, session_id="s", user_id="u1")
    assert not any("heron" in block_of(m) for m in forgotten.messages)


def test_the_block_is_the_same_whether_after_turn_indexed_the_view_or_not(
    tmp_path: Path,
) -> None:
    """Two engines given the same turns, one told each reply by ``after_turn`` (which indexes
    the messages the view still shows, as the proxy does off the request path), show the same
    blocks: what the view shows counts for nothing in what recall searches."""
    told, untold = (
        MemoryEngine(Settings(context_window_chars=20_000, store=StoreSettings(path=str(path))))
        for path in (tmp_path / "told.db", tmp_path / "untold.db")
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    with told, untold:
        for turn in range(80):
            ask = f"Question {turn}: " + "tell me more, " * 14 + "please."
            history.append({"role": "user", "content": ask})
            sent = unref(told.prepare(history, session_id="s").messages)
            assert sent == unref(untold.prepare(history, session_id="s").messages), turn
            points = " ".join(f"point {turn + 1}.{k} holds." for k in range(22))
            history.append({"role": "assistant", "content": f"Answer {turn + 1}: {points}"})
            told.after_turn(history, session_id="s")
            assert told.flush(timeout_s=30)


def unref(messages: Sequence[dict[str, Any]]) -> str:
    """Messages as JSON with recall refs blanked (refs are unguessable per store)."""
    return REF_PATTERN.sub("rm-…", json.dumps(messages, sort_keys=True))
