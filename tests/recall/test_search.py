"""Recall (docs/design.md §9b) below the engine: the index, the search, the block and its placement."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from ragent_memory.core.memo import Memo
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall import excerpts, topk
from ragent_memory.recall.excerpts import (
    HEADERS,
    Ask,
    find_block,
    focus,
    place,
)
from ragent_memory.recall.index import Indexer
from ragent_memory.recall.parts import Parts, sentences
from ragent_memory.recall.rank import RecallMirror
from ragent_memory.recall.recaller import (
    OFFLOAD_REFRESH_S,
    SEARCH_TOOL_NAME,
    Offloads,
    search_tool_schema,
)
from ragent_memory.settings import StoreSettings
from ragent_memory.store import Backend, Store, open_store
from ragent_memory.text.terms import date_stamp

# The index and its search on both stores (FTS5 and tsvector).
pytestmark = pytest.mark.both_backends


@pytest.fixture
def store(store_settings: StoreSettings) -> Iterator[Backend]:
    with open_store(store_settings) as opened:
        yield opened


def rows(settings: StoreSettings, sql: str) -> list[tuple[Any, ...]]:
    """What ``sql`` reads, on a connection of its own to either backend."""
    if settings.url is None:
        with contextlib.closing(sqlite3.connect(settings.path)) as db:
            return [tuple(r) for r in db.execute(sql).fetchall()]
    password = os.environ[settings.password_env or ""]
    with psycopg.connect(settings.url, password=password) as pg:
        return [tuple(r) for r in pg.execute(sql).fetchall()]


def chat(*texts: str) -> list[dict[str, Any]]:
    """Alternating user/assistant messages."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)
    ]


def index(store: Store, messages: list[dict[str, Any]], session_id: str, user_id: str | None):
    indexer = Indexer(store)
    indexer.schedule(messages, session_id=session_id, user_id=user_id)
    indexer.flush(10)
    indexer.close()


def find(
    store: Store,
    query: str,
    *,
    mirror: RecallMirror | None = None,
    ref_for: excerpts.RefFor | None = None,
    **kwargs: Any,
) -> str:
    kwargs.setdefault("max_chars", 4_000)
    kwargs.setdefault("user_id", None)
    kwargs["shown"] = frozenset(kwargs.get("shown", ()))
    return find_block(store, Ask(query, **kwargs), mirror=mirror, ref_for=ref_for).text


FILLER = [f"small talk number {i} about the weather" for i in range(20)]


def test_recall_finds_what_left_the_view_and_skips_what_it_shows(store: Store) -> None:
    """A message before ``visible_from`` is recalled with its neighbours; one at or after it
    is in the view and is not, unless the view shows it substituted."""
    messages = chat("My locker code is 4471 at the Lisbon gym.", "Noted!", *FILLER)
    messages.append({"role": "user", "content": "The Porto gym locker code is 9902."})
    index(store, messages, "s1", "u1")
    late = len(messages) - 1
    block = find(store, "what is my gym locker code", session_id="s1", visible_from=late)
    assert block.startswith(HEADERS["en"])
    assert "4471" in block and "Noted!" in block  # the hit and its neighbour
    assert "9902" not in block  # still in the view
    shown = find(
        store, "gym locker code", session_id="s1", visible_from=late, shown=[late]
    )  # shown as a placeholder: its original may come back
    assert "9902" in shown


def test_block_respects_its_budget_and_known_text(store: Store) -> None:
    """The block never exceeds max_chars; a hit already in the prompt is not repeated."""
    messages = chat(*(f"Fact {i}: the vault code for room {i} is {1000 + i}." for i in range(60)))
    index(store, messages, "s1", None)
    for budget in (300, 800, 2_000):
        block = find(store, "vault code room", session_id="s1", max_chars=budget)
        assert len(block) <= budget
    known = "Fact 7: the vault code for room 7 is 1007."
    block = find(store, "vault code room 7", session_id="s1", known_text=known)
    assert "[user] Fact 7:" not in block


def test_date_stamp_carries_to_later_messages(store: Store) -> None:
    """A date near a message's start is the time context of the session's later messages."""
    messages = chat(
        "[1:56 pm on 8 May, 2023] Caroline: Hi Mel!",
        "Hey!",
        "I went to a pottery class yesterday.",
    )
    index(store, messages, "s1", "u1")
    assert "8 May, 2023" in find(store, "pottery class", session_id="s2", user_id="u1")
    late = "The exam season has been long and tiring for all of us, but it will finally be over"
    assert "" == date_stamp(f"{late} on 3 June 2024.")  # a date further in is content
    assert "2023年5月8日" == date_stamp("[2023年5月8日] 你好")


def test_a_when_question_prefers_the_hit_that_holds_the_event(store: Store) -> None:
    """BM25 ranks a short reply first; asked *when* with room for one excerpt, the message
    stating the whole event is the one shown, tagged with its session's date. Asked
    otherwise, rank order stands."""
    index(store, chat(*[f"Caroline said hi {i}." for i in range(6)]), "s0", "u1")
    index(store, chat("Pottery class, pottery class!", "Ha."), "s1", "u1")
    event = "Caroline went to a pottery class on Sunday with her sister and two friends."
    index(store, chat("[9 May, 2023] Hi!", "Hello.", event), "s2", "u1")
    ask = {"mirror": RecallMirror(store), "session_id": "q", "user_id": "u1"}  # BM25 on both
    what = find(store, "What about Caroline's pottery class?", max_chars=340, **ask)
    assert "Pottery class, pottery" in what and "pottery class on Sunday" not in what
    when = find(store, "When was Caroline at the pottery class?", max_chars=340, **ask)
    assert "pottery class on Sunday" in when and "Pottery class, pottery" not in when
    assert "9 May, 2023" in when.split("\n")[1]  # the excerpt's tag
    assert excerpts.asks_when("什么时候去的北京？") and not excerpts.asks_when("Whence?")


def test_a_second_hop_finds_what_the_best_hits_name(store: Store) -> None:
    """The best hit's own rare word (the dog's name) finds a message that shares no word
    with the question, shown after the first hop's hits; the store's search has no hop."""
    index(store, chat("Dana adopted a greyhound named Zorro last spring.", "Lovely!"), "s1", "u1")
    index(store, chat(*FILLER[:6]), "s2", "u1")
    index(store, chat("Zorro loves the beach at Vlieland every summer.", "Nice."), "s3", "u1")
    index(store, chat("Zorro got a new red collar today.", "Cute."), "s4", "u1")
    question = "What did Dana adopt?"
    mirror = RecallMirror(store, hop=excerpts.HOP_HITS)
    text = find(store, question, mirror=mirror, session_id="q", user_id="u1")
    assert text.index("greyhound") < text.index("Vlieland") and "red collar" in text
    assert "greyhound" in find(store, question, session_id="q", user_id="u1")
    assert "Vlieland" not in find(store, question, session_id="q", user_id="u1")


def test_an_excerpt_says_when_its_relative_time_was(store: Store) -> None:
    """A recalled "yesterday" or "last week" is anchored to its session's date: read months
    later, the excerpt still says when; a session without a date stamp anchors nothing."""
    dated = chat("[1:56 pm on 8 May, 2023] Hi Mel!", "Hey!", "I went to a support group yesterday.")
    index(store, dated, "s1", "u1")
    index(store, chat("Hello.", "We hiked the Alps last week."), "s2", "u1")
    block = find(store, "When did I go to the support group?", session_id="q", user_id="u1")
    assert "support group yesterday [7 May 2023]." in block
    block = find(store, "Where did we hike?", session_id="q", user_id="u1")
    assert "the Alps last week." in block and "[the week" not in block


def test_a_chinese_excerpt_says_when_in_chinese(store: Store) -> None:
    """A Chinese session's date stamp anchors its "昨天" in Chinese."""
    dated = chat("[2023年5月8日 下午1:56] 你好！", "你好！", "我昨天去了互助小组。")
    index(store, dated, "s1", "u1")
    block = find(store, "我什么时候去的互助小组？", session_id="q", user_id="u1")
    assert "昨天 [2023年5月7日]去了互助小组" in block and "2023年5月8日" in block


def test_the_answer_to_a_question_after_a_hit_is_shown(store: Store) -> None:
    """When the message after a hit asks a question, the one after that (its answer) is
    part of the excerpt; after a message that asks nothing, it is not."""
    said = "My daughter's birthday had a live concert in the garden."
    index(
        store,
        chat("Hi!", said, "Wow! Who performed?", "It was Matt Patterson.", *FILLER[:4]),
        "s1",
        "u1",
    )
    told = "Our town fair had a live concert by the river."
    index(
        store, chat("Hello!", told, "Sounds fun.", "It was Nina Simmons.", *FILLER[4:8]), "s2", "u1"
    )
    block = find(store, "daughter birthday live concert garden", session_id="q", user_id="u1")
    assert "Matt Patterson" in block
    block = find(store, "town fair live concert river", session_id="q", user_id="u1")
    assert "Sounds fun." in block and "Nina Simmons" not in block


def test_an_excerpt_that_does_not_fit_whole_shows_its_hit_alone(store: Store) -> None:
    """Once the room runs short, a lower hit still shows without its neighbours."""
    for sid, code in (("s1", "zebra code one is 111"), ("s2", "zebra code two is 222 zebra")):
        before, after = f"{sid} went on about lunch. " * 12, f"{sid} talked of rain. " * 14
        index(store, chat(before, code, after), sid, "u1")
    block = find(store, "zebra code", session_id="q", user_id="u1", max_chars=1_100)
    assert "222 zebra" in block and "s2 went on" in block  # the best hit, whole
    assert "one is 111" in block and "s1 went on" not in block  # the next, its hit alone
    assert len(block) <= 1_100


def test_a_second_hop_reads_no_long_postings(store: Store) -> None:
    """A word of the best hit that is in more than ``LONG`` rows is no second-hop term (the
    hop's reading stays bounded as the history grows): with the dog's name everywhere, the
    hop finds neither the beach nor the many rows that name him."""
    index(store, chat("Dana adopted a greyhound named Zorro last spring.", "Lovely!"), "s1", "u1")
    index(store, chat("Zorro loves the beach at Vlieland every summer.", "Nice."), "s3", "u1")
    many = [f"Zorro barked at the mailman again, time {i}." for i in range(topk.LONG + 1)]
    index(store, chat(*many), "s5", "u1")
    mirror = RecallMirror(store, hop=excerpts.HOP_HITS)
    text = find(store, "What did Dana adopt?", mirror=mirror, session_id="q", user_id="u1")
    assert "greyhound" in text and "Vlieland" not in text and "mailman" not in text


def test_chinese_fact_from_another_session_matches_a_chinese_question(store: Store) -> None:
    """Session A in Chinese, a question in session B of the same user finds it."""
    index(store, chat("我对花生过敏，吃了会很严重。", "好的，记住了。"), "A", "u1")
    index(store, chat("Unrelated English talk.", "ok"), "C", "u1")
    block = find(store, "我对什么过敏？", session_id="B", user_id="u1")
    assert "花生" in block and "session A" in block


def test_without_user_only_this_session(store: Store) -> None:
    """No user_id: this session only, never another session of anyone."""
    index(store, chat("The launch code is ALPHA-7."), "mine", None)
    index(store, chat("The launch code is BRAVO-9."), "other", "u2")
    block = find(store, "launch code", session_id="mine")
    assert "ALPHA-7" in block and "BRAVO-9" not in block


@given(
    st.lists(
        st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.sampled_from(["a", "b", "c", "d"])),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["u1", "u2", "u3", None]),
    st.sampled_from(["a", "b", "c", "d", "e"]),
)
def test_another_users_sessions_never_appear(
    tmp_path_factory: pytest.TempPathFactory,
    owners: list[tuple[str, str]],
    asker: str | None,
    session_id: str,
) -> None:
    """Whatever was indexed for whom, a search shows only the asker's own sessions (and, without
    a user, only the asking session)."""
    with Store(tmp_path_factory.mktemp("p") / "p.db") as store:
        for n, (user, session) in enumerate(owners):
            sid = f"{user}-{session}"
            index(store, chat(f"secret marker {sid} number {n}"), sid, user)
        block = find(
            store, "secret marker number", session_id=f"{asker}-{session_id}", user_id=asker
        )
    allowed = {f"{u}-{s}" for u, s in owners if u == asker}
    allowed.add(f"{asker}-{session_id}")
    for user, session in owners:
        sid = f"{user}-{session}"
        if sid not in allowed:
            assert f"marker {sid} " not in block


def test_forget_and_drop_erase_index_rows(store: Store, store_settings: StoreSettings) -> None:
    """forget(user) and drop_session remove what they owned from the index."""
    index(store, chat("Kept zebra fact."), "s1", "u1")
    index(store, chat("Dropped zebra fact."), "s2", "u1")
    index(store, chat("Forgotten zebra fact."), "s3", "u2")
    store.drop_session("s2")
    store.forget("u2")
    assert "Kept zebra" in find(store, "zebra", session_id="s9", user_id="u1")
    assert "Dropped" not in find(store, "zebra", session_id="s2", user_id="u1")
    assert "" == find(store, "zebra", session_id="s3", user_id="u2")
    assert [(1,)] == rows(store_settings, "SELECT COUNT(*) FROM recall_fts")


def test_indexer_resumes_after_restart_without_duplicates(
    store: Store, store_settings: StoreSettings
) -> None:
    """A new indexer on the same store continues after what was indexed, adding no twin rows,
    and an edited message is indexed again."""
    messages = chat("alpha one", "beta two", "gamma three")
    index(store, messages, "s1", "u1")
    index(store, [*messages, *chat("delta four")], "s1", "u1")
    indexed = rows(store_settings, "SELECT position, content FROM recall_messages ORDER BY id")
    assert [(0, "alpha one"), (1, "beta two"), (2, "gamma three"), (3, "delta four")] == indexed
    edited = [*messages[:2], {"role": "user", "content": "gamma edited"}]
    index(store, edited, "s1", "u1")
    assert "gamma edited" in find(store, "gamma", session_id="s1")


def counting_dict(reads: list[str]) -> type[dict[str, Any]]:
    """A message dict that notes the content of every ``get`` (what the indexer read)."""

    class Counting(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            reads.append(str(super().get("content")))
            return super().get(key, default)

    return Counting


def test_a_turn_that_never_waits_searches_without_a_warning(store: Store) -> None:
    """With ``timeout_s`` 0 (``compaction_timeout_s: 0``) a search does not wait for what is
    still being indexed, as configured, and says nothing; a wait that runs out warns."""
    indexer = Indexer(store)
    held = threading.Event()
    try:
        indexer._pool.submit(held.wait, 10)  # the worker busy until released
        indexer.add("s1", None, [(0, {"role": "user", "content": "the keeper is Ada"})])
        with structlog.testing.capture_logs() as logs:
            indexer.wait_for("s1", 5, 0)
        assert [] == logs
        with structlog.testing.capture_logs() as logs:
            indexer.wait_for("s1", 5, 0.01)
        assert ["recall.index_wait_timeout"] == [e["event"] for e in logs]
    finally:
        held.set()
        indexer.close()


def test_indexer_schedules_only_what_is_new(store: Store, store_settings: StoreSettings) -> None:
    """The caller's thread reads only the messages after its cursor."""
    reads: list[str] = []
    Counting = counting_dict(reads)

    indexer = Indexer(store)
    messages: list[dict[str, Any]] = [Counting(m) for m in chat(*(f"l{i}" for i in range(50)))]
    indexer.schedule(messages, session_id="s", user_id=None)
    reads.clear()
    indexer.schedule(
        [*messages, Counting(role="user", content="new")], session_id="s", user_id=None
    )
    indexer.flush(10)
    indexer.close()
    assert {"new"} == set(reads)
    assert [(51,)] == rows(store_settings, "SELECT COUNT(*) FROM recall_messages")


def test_indexer_continues_over_a_history_rebuilt_as_equal_dicts(store: Store) -> None:
    """A caller that hands over new but equal dicts each turn (an adapter converting SDK
    objects) is read from the cursor on, not from the start; a changed message at the cursor
    still re-reads the session."""
    reads: list[str] = []
    Counting = counting_dict(reads)

    indexer = Indexer(store)
    texts = [f"l{i}" for i in range(50)]
    indexer.schedule([Counting(m) for m in chat(*texts)], session_id="s", user_id=None)
    reads.clear()
    rebuilt = [Counting(m) for m in chat(*texts, "new")]
    indexer.schedule(rebuilt, session_id="s", user_id=None)
    assert {"new"} == set(reads)
    reads.clear()
    changed = [Counting(m) for m in chat(*texts, "new, edited", "newer")]
    indexer.schedule(changed, session_id="s", user_id=None)
    assert {*texts, "new, edited", "newer"} <= set(reads)
    indexer.flush(10)
    indexer.close()


def test_place_puts_the_block_first_and_mutates_nothing() -> None:
    """The block is a leading text part of a new dict; the user's own content follows
    unchanged and the caller's dict is untouched."""
    message = {"role": "user", "content": "question?"}
    before = copy.deepcopy(message)
    placed = place(message, "BLOCK")
    assert before == message
    assert [{"type": "text", "text": "BLOCK"}, {"type": "text", "text": "question?"}] == placed[
        "content"
    ]
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert [{"type": "text", "text": "B"}, *parts] == place(
        {"role": "user", "content": parts}, "B"
    )["content"]
    assert message is place(message, "")


def test_focus_keeps_sentences_sharing_query_words() -> None:
    """A long message is cut to the sentences that share words with the query."""
    text = " ".join(f"Sentence {i} is filler about nothing." for i in range(30))
    text += " The passport number is X1234567. " + text
    kept, clipped = focus(text, 120, frozenset({"passp"}))
    assert clipped and "X1234567" in kept and len(kept) <= 120
    assert ("short", False) == focus("short", 120)


def test_a_cut_is_kept_for_the_query_words_a_text_holds() -> None:
    """A long hit is cut once for the query words it holds: a query that differs only in
    words it does not hold reuses the cut, and the kept cut is what a plain cut gives."""
    text = " ".join(f"Sentence {i} is filler about nothing." for i in range(30))
    text += " The passport number is X1234567. " + text
    cuts: list[tuple[str, int, frozenset[str]]] = []
    split = Memo(Parts.of, 1_000_000, len)
    cut = Memo(lambda key: cuts.append(key) or split(key[0]).cut(*key[1:]), 10_000, len)
    first = focus(text, 120, frozenset({"passp", "turn"}), split, cut)
    again = focus(text, 120, frozenset({"passp", "week"}), split, cut)
    assert first == again == focus(text, 120, frozenset({"passp"}))
    assert [(text, 120, frozenset({"passp"}))] == cuts


def test_a_long_text_of_one_sentence_is_cut_to_head_and_tail() -> None:
    """An export of rows without a sentence end is cut to head + tail whatever the query,
    its white space folded."""
    rows = "\n".join(f"row {i}: refund record {10_000 + i}" for i in range(2_000))
    folded = " ".join(rows.split())
    for stems in (frozenset({"refun"}), frozenset()):
        line, clipped = focus(rows, 240, stems)
        assert clipped and line == f"{folded[:160]} … {folded[-60:]}"


_LOOK_BEHIND = re.compile(r"(?<=[.!?。！？])\s+")  # how sentences were cut before


@given(st.text(alphabet="ab .!?。！？\n\t\u3000\u00a0x.", max_size=80))
def test_sentences_are_cut_where_a_look_behind_cuts_them(text: str) -> None:
    """The one-char search cuts folded text exactly where ``(?<=[.!?。！？])\\s+`` did."""
    folded = " ".join(text.split())
    assert _LOOK_BEHIND.split(folded) == sentences(folded)


def test_search_tool_schema() -> None:
    """search_memory(query, limit=5) as an OpenAI tool."""
    function = search_tool_schema()["function"]
    assert SEARCH_TOOL_NAME == function["name"] == "search_memory"
    assert ["query"] == function["parameters"]["required"]
    assert 5 == function["parameters"]["properties"]["limit"]["default"]


def test_a_hit_the_known_text_holds_follows_the_known_text(store: Store) -> None:
    """A hit the prompt holds already (the summary) is not recalled; a new summary that no
    longer holds it lets it come back, and the other way round."""
    texts = [f"Fact {i}: the vault code for room {i} is {1000 + i}." for i in range(30)]
    messages = chat(*(text if i % 3 == 0 else "ok" for i, text in enumerate(texts)))
    index(store, messages, "s1", None)
    mirror = RecallMirror(store)
    known = "Summary. Fact 6:   the vault code for room 6 is 1006. More."
    for known_text, shown in [(known, False), ("Nothing of room 6 here.", True), (known, False)]:
        block = find(
            store, "vault code room 6", session_id="s1", known_text=known_text, mirror=mirror
        )
        assert "Fact 9:" in block
        assert ("Fact 6:" in block) is shown, known_text


def test_a_stored_excerpt_text_is_written_again_only_once_it_needs_refreshing(
    store: Store,
) -> None:
    """``Offloads`` writes a clipped excerpt's full text once, not again within the refresh
    interval (whatever the turn), and again once that has passed: its TTL is renewed while it
    is still shown, and most turns write nothing."""
    now = [1_000.0]
    written: list[list[str]] = []
    real = store.offload_all

    def counting(session_id: str, contents: Any, *, ttl_days: float) -> None:
        written.append(list(contents))
        real(session_id, contents, ttl_days=ttl_days)

    store.offload_all = counting  # type: ignore[method-assign]
    offloads = Offloads(store, ttl_days=30, clock=lambda: now[0])
    text = "the archived figure is 4,242 " * 40
    message = IndexedMessage("s1", 3, "tool", text, digest="d-4242")
    offloads.write("s1", [message])
    now[0] += OFFLOAD_REFRESH_S / 2
    offloads.write("s1", [message])
    assert [[text]] == written
    ref = offloads.ref("s1", message)
    now[0] += OFFLOAD_REFRESH_S
    offloads.write("s1", [message])
    assert [[text], [text]] == written
    assert text == store.read_offload("s1", ref)
