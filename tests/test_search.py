"""Recall (DESIGN §9b) below the engine: the index, the search, the block and its placement."""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall import search
from ragent_memory.recall.mirror import RecallMirror
from ragent_memory.recall.search import (
    EVERYTHING,
    HEADERS,
    SEARCH_TOOL_NAME,
    ExcerptCache,
    Indexer,
    LineCache,
    Recaller,
    SentenceCache,
    Split,
    focus,
    index_digest,
    place,
    recall,
    search_tool_schema,
    split_sentences,
)
from ragent_memory.settings import Settings, StoreSettings
from ragent_memory.store import Backend, Store, open_store
from ragent_memory.text.terms import STOPWORDS, date_stamp, prefix_positions, term_prefixes

# The index and its search on both stores (FTS5 and tsvector).
pytestmark = pytest.mark.both_backends


@pytest.fixture
def store(store_settings: StoreSettings) -> Iterator[Backend]:
    with open_store(store_settings) as opened:
        yield opened


def rows(store: Backend, sql: str) -> list[tuple[Any, ...]]:
    """What ``sql`` reads, on either backend."""
    with store._locked("read") as db:  # type: ignore[attr-defined]
        return [tuple(r) for r in db.execute(sql).fetchall()]


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


def find(store: Store, query: str, **kwargs: Any) -> str:
    kwargs.setdefault("max_chars", 4_000)
    kwargs.setdefault("language", "en")
    kwargs.setdefault("visible_from", EVERYTHING)
    kwargs.setdefault("user_id", None)
    return recall(store, query, **kwargs).text


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


def test_forget_and_drop_erase_index_rows(store: Store) -> None:
    """forget(user) and drop_session remove what they owned from the index."""
    index(store, chat("Kept zebra fact."), "s1", "u1")
    index(store, chat("Dropped zebra fact."), "s2", "u1")
    index(store, chat("Forgotten zebra fact."), "s3", "u2")
    store.drop_session("s2")
    store.forget("u2")
    assert "Kept zebra" in find(store, "zebra", session_id="s9", user_id="u1")
    assert "Dropped" not in find(store, "zebra", session_id="s2", user_id="u1")
    assert "" == find(store, "zebra", session_id="s3", user_id="u2")
    assert [(1,)] == rows(store, "SELECT COUNT(*) FROM recall_fts")


def test_indexer_resumes_after_restart_without_duplicates(store: Store) -> None:
    """A new indexer on the same store continues after what was indexed, adding no twin rows,
    and an edited message is indexed again."""
    messages = chat("alpha one", "beta two", "gamma three")
    index(store, messages, "s1", "u1")
    index(store, [*messages, *chat("delta four")], "s1", "u1")
    indexed = rows(store, "SELECT position, content FROM recall_messages ORDER BY id")
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
        indexer.submit(lambda _sid: held.wait(10), "s1")  # the worker busy until released
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


def test_indexer_schedules_only_what_is_new(store: Store) -> None:
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
    assert [(51,)] == rows(store, "SELECT COUNT(*) FROM recall_messages")


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


def test_sentence_cache_splits_each_text_once_within_its_char_bound() -> None:
    """A text seen again is not split again; the least recently used texts leave once the
    texts held pass the bound."""
    cache = SentenceCache(max_chars=100)
    texts = [f"Text {i} speaks. It has two sentences about {i}." for i in range(4)]  # 40+ chars
    first = cache(texts[0])
    assert ("Text 0 speaks.", "It has two sentences about 0.") == first.sentences
    assert {"speak"} <= first.stems[0]
    assert first is cache(texts[0])
    for text in texts[1:]:
        cache(text)
    assert first is not cache(texts[0])  # it was the least recently used: split anew
    assert cache(texts[3]) is cache(texts[3])


def test_line_cache_makes_each_line_once_and_never_serves_an_edited_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit seen again for the same query is not focused again; an edited text (a new
    digest), another limit or another query's words make a new line."""
    calls: list[str] = []
    focus_once = search.focus

    def counting(text: str, limit: int, stems: frozenset[str] = frozenset()) -> tuple[str, bool]:
        calls.append(text)
        return focus_once(text, limit, stems)

    monkeypatch.setattr(search, "focus", counting)
    cache = LineCache(remembered=2)
    old = IndexedMessage("s1", 3, "user", "The keeper is Ada. " * 30, digest="d-old")
    edited = IndexedMessage("s1", 3, "user", "The keeper is Bea. " * 30, digest="d-new")
    stems = frozenset({"keepe"})
    first = cache(old, 120, stems)
    assert first is cache(old, 120, stems) and 1 == len(calls)
    assert "Bea" in cache(edited, 120, stems)[0] and 2 == len(calls)
    assert "Ada" in cache(old, 200, stems)[0] and 3 == len(calls)  # another limit
    cache(old, 120, frozenset({"ada"}))  # another query: the oldest entry leaves
    assert first is not cache(old, 120, stems) and first == cache(old, 120, stems)


_LOOK_BEHIND = re.compile(r"(?<=[.!?。！？])\s+")  # how sentences were cut before


@given(st.text(alphabet="ab .!?。！？\n\t\u3000\u00a0x.", max_size=80))
def test_sentences_are_cut_where_a_look_behind_cuts_them(text: str) -> None:
    """The one-char search cuts folded text exactly where ``(?<=[.!?。！？])\\s+`` did."""
    folded = " ".join(text.split())
    assert tuple(_LOOK_BEHIND.split(folded)) == split_sentences(folded)


# Every white space ``str.split`` knows of a kind (ASCII, separators, NEL, NBSP, ideographic).
_RAW = "ab .!?。！？\n\t\x1c\x85\u3000\u00a0\u2028x."


@given(st.text(alphabet=_RAW, max_size=80))
def test_a_break_is_found_in_raw_text_where_folding_leaves_one(text: str) -> None:
    """``has_break`` says, without folding, whether the folded text is cut in two or more."""
    assert (len(split_sentences(" ".join(text.split()))) > 1) == search.has_break(text)


# One sentence (an end char followed by text is no break), white space of every kind.
_ONE_SENTENCE = ("ab", "x", "a.b", "x!y", "。z", " ", "  ", "\n", "\t", "\x1c", "\x85", "\u3000")


@given(
    st.lists(st.sampled_from((*_ONE_SENTENCE, "\u00a0", "\u2028")), min_size=60).map("".join),
    st.sampled_from([30, 60, 120]),
    st.frozensets(st.sampled_from(["ab", "x", "abx"]), max_size=2),
)
def test_a_long_text_of_one_sentence_is_cut_as_when_folded_whole(
    text: str, limit: int, stems: frozenset[str]
) -> None:
    """Folding only a one-sentence text's two ends gives the head + tail folding it whole
    gave (the same ``focus`` whatever the white space)."""
    fast = focus(text, limit, stems)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "has_break", lambda _text: True)  # the fold of the whole text
        assert focus(text, limit, stems) == fast


_WORDS = ("passport", "filler", "keeper", "refund", "ticket", "order", "x1234", "nothing")


@given(
    st.lists(
        st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8).map(" ".join),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([". ", "! ", " ", ", "]),
    st.lists(st.frozensets(st.sampled_from([w[:5] for w in _WORDS]), max_size=3), max_size=6),
)
def test_a_cached_line_is_what_focus_makes_for_each_query(
    sentences: list[str], end: str, queries: list[frozenset[str]]
) -> None:
    """Whatever queries come in whatever order, the line cache serves what ``focus`` makes
    for that query: its key holds every query stem that can change the line (none for a
    text of one sentence)."""
    text = end.join(sentences) + "."
    message = IndexedMessage("s1", 3, "tool", text, digest=index_digest("tool", text))
    cache = LineCache(remembered=64)
    for stems in [*queries, *queries]:
        for limit in (20, 60):
            assert focus(text, limit, stems) == cache(message, limit, stems)


_TOKENS = (
    *_WORDS,
    *("there", "therefore", "the", "an", "which", "whichever", "ok", "x", "ab_cd", "12", "7"),
    *("Straße", "STRASSE", "ΣΟΦΙΑ", "σοφία", "İstanbul", "ﬁne", "naïve", "中文", "東京タワー"),
)


@given(
    st.lists(
        st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=6).map(" ".join),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([". ", "! ", "?\n", "。 ", " - ", ", "]),
    st.lists(
        st.frozensets(
            st.sampled_from(
                [*(t.casefold()[:5] for t in _TOKENS), "x", "there", "an", "ab", "ab_c"]
            ),
            max_size=6,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_the_stems_a_sentence_holds_are_its_words_prefixes(
    sentences: list[str], end: str, queries: list[frozenset[str]]
) -> None:
    """Which query stems each sentence holds, found per stem over the whole text, is what
    stemming each sentence gives (``term_prefixes``), for any text: CJK, casefolding that
    changes length, stopwords, underscores, one-char words; and so for each later query
    of the same text, whose stems an earlier query found the sentences of (kept per stem).
    The query's stems the text holds (what its cached line is keyed by) are those too,
    searched for one by one or read from a warmed text's stems; and so are both when the
    sentences of every stem were found at once (``invert``, as the indexer's thread does)."""
    text = end.join(sentences)
    split = Split(text)
    inverted = Split(text)
    inverted.invert()
    each = [term_prefixes(s, 5, limit=1_000) for s in split.sentences]
    held = frozenset().union(*each) if len(each) > 1 else frozenset()
    message = IndexedMessage("s1", 0, "tool", text, "", index_digest("tool", text))
    lines = LineCache(remembered=8)  # nothing warmed: each query's stems searched for
    for stems in (*queries, *queries):
        assert [len(held & stems) for held in each] == split.shared(stems)
        assert stems & held == split.holds(stems) == lines.holds(message, stems)
        assert split.shared(stems) == inverted.shared(stems)
        assert split.holds(stems) == inverted.holds(stems)
    assert held == split.held()
    assert held == lines.held(message)  # as warming keeps it: then read from that
    assert all(stems & held == lines.holds(message, stems) for stems in queries)


def test_a_sentence_too_long_for_a_set_of_words_is_stemmed_as_before() -> None:
    """A sentence long enough to hold more than 1,000 words is stemmed in full (its first
    1,000 terms), as ``term_prefixes`` does."""
    many = " ".join(f"w{i:04d}" for i in range(1_200))
    split = Split(f"Short one. {many}. Last.")
    stems = frozenset({"w0001", "w1100", "short", "last"})
    each = [term_prefixes(s, 5, limit=1_000) for s in split.sentences]
    assert [len(held & stems) for held in each] == split.shared(stems) == [1, 1, 1]


def test_a_long_text_of_one_sentence_is_never_stemmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An export of rows without a sentence end is cut to head + tail whatever the query: it
    is never stemmed, nor even folded whole (only its two ends), for its line."""
    rows = "\n".join(f"row {i}: refund record {10_000 + i}" for i in range(2_000))
    message = IndexedMessage("s1", 3, "tool", rows, digest=index_digest("tool", rows))
    calls: list[str] = []
    real = search.term_prefixes
    monkeypatch.setattr(
        search, "term_prefixes", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )
    real_split = search.Split
    monkeypatch.setattr(search, "Split", lambda text: calls.append(text) or real_split(text))
    cache = LineCache(remembered=8)
    for stems in (frozenset({"refun"}), frozenset({"recor", "row"}), frozenset()):
        assert focus(rows, 240, stems) == cache(message, 240, stems)
    assert [] == calls


def test_a_long_message_is_split_and_stemmed_as_it_is_indexed(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The indexer's thread splits and stems each long message that leaves the view, and
    finds which sentences hold each stem: the turn that first recalls it only looks its
    query up (nothing split nor searched for on the caller's thread)."""
    monkeypatch.setattr(search, "_lines", LineCache(remembered=256))
    monkeypatch.setattr(search, "_sentences", SentenceCache(max_chars=1_000_000))
    long = " ".join(f"The refund for order {i} was approved by the keeper." for i in range(60))
    recaller = Recaller(store, Settings(context_window_chars=200_000), engine_headers=())
    try:
        history = chat("Who approves refunds?", long)
        recaller.on_leave("s1", None, list(enumerate(history)))
        recaller.flush(10)
        split: list[str] = []
        real = search.Split
        monkeypatch.setattr(search, "Split", lambda text: split.append(text) or real(text))
        searched = search.prefix_positions
        monkeypatch.setattr(
            search, "prefix_positions", lambda *a: split.append(a[1]) or searched(*a)
        )
        found = recaller.block(
            "s1",
            None,
            "refund keeper order",
            visible_from=EVERYTHING,
            shown=(),
            max_chars=4_000,
            known_text="",
        )
        assert "was approved by the keeper" in found.text and [] == split
    finally:
        recaller.close()


def test_search_tool_schema() -> None:
    """search_memory(query, limit=5) as an OpenAI tool."""
    function = search_tool_schema()["function"]
    assert SEARCH_TOOL_NAME == function["name"] == "search_memory"
    assert ["query"] == function["parameters"]["required"]
    assert 5 == function["parameters"]["properties"]["limit"]["default"]


def test_a_hit_the_known_text_holds_follows_the_known_text(store: Store) -> None:
    """Whether a hit is in the prompt already is answered once per known text (the summary)
    and hit: a new summary asks again, in both directions."""
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


_LINE_WORDS = ("keeper", "refund", "ticket", "order", "passport", "filler", "x1234")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["user", "assistant", "tool"]),
            st.lists(
                st.lists(st.sampled_from(_LINE_WORDS), min_size=1, max_size=12).map(" ".join),
                min_size=1,
                max_size=40,
            ).map(". \n".join),
        ),
        min_size=1,
        max_size=3,
    ),
    st.integers(min_value=0, max_value=2),
    st.frozensets(st.sampled_from([w[:5] for w in _LINE_WORDS]), max_size=3),
    st.sampled_from(["", "2023-05-08"]),
    st.booleans(),
)
def test_least_chars_never_exceeds_what_an_excerpt_renders_to(
    texts: list[tuple[str, str]], hit: int, stems: frozenset[str], dated: str, refs: bool
) -> None:
    """The bound the recall loop rules excerpts out by is a lower bound for any query and
    any refs: an excerpt it rules out could never have fitted."""
    messages = tuple(
        IndexedMessage("s1", 10 + i, role, text, dated, index_digest(role, text))
        for i, (role, text) in enumerate(texts)
    )
    excerpt = search.Excerpt("s1", dated, messages, frozenset({10 + min(hit, len(texts) - 1)}))
    ref_for = (lambda m: "ref" + m.digest[:8]) if refs else None
    rendered = search.render_excerpt(excerpt, ref_for, stems)
    assert search.least_chars(excerpt) <= len(rendered)
    if all(len(m.content) <= search.NEIGHBOUR_CHARS for m in messages):
        assert search.least_chars(excerpt) == len(rendered)  # exact when nothing is clipped


def test_a_small_block_renders_no_excerpt_that_cannot_fit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With little room (a view near B), excerpts whose tag and short lines alone overflow it
    are ruled out unrendered (no long hit is focused), and every block is the one rendering
    each excerpt would give."""
    long = " ".join(f"The refund for order {i} was approved by the keeper." for i in range(60))
    short = "Which refund did the keeper approve for my order?"
    index(store, chat(*[m for _ in range(6) for m in (short, long, *FILLER[:2])]), "s1", None)
    monkeypatch.setattr(search, "_lines", LineCache(remembered=256))  # no line made before
    focused: list[str] = []
    real_focus, real_least = search.focus, search.least_chars
    monkeypatch.setattr(search, "focus", lambda t, *a: focused.append(t) or real_focus(t, *a))
    bounds: list[int] = []
    monkeypatch.setattr(search, "least_chars", lambda e: bounds.append(real_least(e)) or bounds[-1])
    query = "refund keeper order"
    sizes = range(150, 2_400, 50)
    blocks = {n: find(store, query, session_id="s1", max_chars=n) for n in sizes}
    assert "" == blocks[150] and "" != blocks[2_350]
    assert len(focused) > 0 and len(set(bounds)) > 1
    monkeypatch.setattr(search, "_lines", LineCache(remembered=256))
    focused.clear()
    # Room for none of them (the header, its newline and one char short of the least bound).
    assert "" == find(store, query, session_id="s1", max_chars=len(HEADERS["en"]) + min(bounds))
    assert [] == focused  # nothing could fit: no long text was split and matched
    monkeypatch.setattr(search, "least_chars", lambda excerpt: 0)  # render every excerpt
    assert blocks == {n: find(store, query, session_id="s1", max_chars=n) for n in sizes}


def test_once_an_excerpt_does_not_fit_the_rest_are_weighed_before_they_are_keyed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an ``ExcerptCache`` (a recaller's), an excerpt ``least_chars`` rules out once the
    room has run short is not keyed either: a key matches each long neighbour's text against
    the query. The blocks are the ones keying and rendering every excerpt gives, cached or
    not."""
    asks = [f"Which {w} did the keeper approve for order {i}? " * 4 for i, w in enumerate(_W)]
    long = [" ".join(f"Line {j} of batch {i} was checked." for j in range(60)) for i in range(5)]
    turns = [
        (*FILLER[3 * i : 3 * i + 3], ask, text)
        for i, (ask, text) in enumerate(zip(asks, long, strict=True))
    ]
    index(store, chat(*[m for turn in turns for m in turn]), "s1", None)
    keyed: list[search.Excerpt] = []
    real_key = ExcerptCache.key
    monkeypatch.setattr(
        ExcerptCache, "key", lambda self, *a: keyed.append(a[1]) or real_key(self, *a)
    )
    query = "which keeper approve order refund ticket parcel voucher permit"
    whole = find(store, query, session_id="s1", max_chars=8_000)
    assert whole.count("— session") == 5
    header, first, *_ = whole.split("\n— session")
    room = len(header + "\n— session" + first) + 60  # the first excerpt and a little
    keyed.clear()
    one = find(store, query, session_id="s1", max_chars=room, rendered=ExcerptCache(256))
    # the first shown, the second keyed then ruled out, the other three weighed only
    assert one.count("— session") == 1 and len(keyed) == 2
    sizes = range(200, 6_000, 150)
    cache = ExcerptCache(remembered=256)
    blocks = {n: find(store, query, session_id="s1", max_chars=n, rendered=cache) for n in sizes}
    monkeypatch.setattr(search, "least_chars", lambda excerpt: 0)  # key and render every one
    for rendered in (ExcerptCache(remembered=256), None):
        assert blocks == {
            n: find(store, query, session_id="s1", max_chars=n, rendered=rendered) for n in sizes
        }


_W = ("refund", "ticket", "parcel", "voucher", "permit")


def test_an_excerpt_shown_before_is_served_as_rendered_with_its_refs_asked_again(
    store: Store,
) -> None:
    """With an ``ExcerptCache``, every block is the one rendering each excerpt gives: for a
    query that comes back, one that differs in a word (a long hit's line follows the
    query), another session of the same user (its own refs) and a smaller room; and each
    ref a block shows was asked for in that call (its full text is stored again)."""
    names = ("Alvarez", "Brandt", "Chen", "Dimitrov", "Evans", "Fujita", "Gomez", "Haddad")
    long = [
        " ".join(
            f"The {word} for order {i} was approved by keeper {n}." for i, n in enumerate(names)
        )
        for word in ("refund", "ticket", "passport")
    ]
    texts = [m for k in range(3) for m in ("Which one did the keeper approve?", long[k])]
    index(store, chat(*texts, *FILLER[:4]), "s1", "u1")
    cache = ExcerptCache(remembered=64)
    queries = ["refund keeper Chen", "ticket Gomez", "refund keeper Haddad", "ticket Brandt"]
    shown_refs = 0
    for session_id, query, max_chars in [
        *(("s1", q, 4_000) for q in [*queries, *queries]),
        ("s2", "refund keeper Chen", 4_000),
        ("s1", "refund keeper Chen", 900),
    ]:
        asked: dict[str, list[str]] = {"plain": [], "cached": []}

        def ref_for(log: list[str], sid: str = session_id) -> search.RefFor:
            return lambda m: log.append(f"rm-{sid}-{m.digest[:8]}") or log[-1]

        kwargs = dict(session_id=session_id, user_id="u1", max_chars=max_chars)
        plain = find(store, query, ref_for=ref_for(asked["plain"]), **kwargs)
        cached = find(store, query, ref_for=ref_for(asked["cached"]), rendered=cache, **kwargs)
        assert plain == cached, (session_id, query, max_chars)
        refs = re.findall(r"recall (rm-\S+)\]", cached)
        assert set(refs) <= set(asked["cached"])
        shown_refs += len(refs)
    assert shown_refs > 0


def _each_word_read_whole(low: str, prefix: str, chars: int) -> list[int]:
    """The reference ``prefix_positions`` once was: every word found read whole."""
    if not 2 <= len(prefix) <= chars or not prefix.isalnum():
        return []
    out, size = [], len(prefix)
    at = low.find(prefix)
    while at >= 0:
        end = at + size
        if at == 0 or not low[at - 1].isalnum():
            if size == chars:
                word = low[at : re.compile(r"[^\W_]*").match(low, end).end()]  # type: ignore[union-attr]
            elif end == len(low) or not low[end].isalnum():
                word = prefix
            else:
                word = ""
            if word and word not in STOPWORDS:
                out.append(at)
        at = low.find(prefix, end)
    return out


_PREFIX_WORDS = (
    *("there", "therefore", "which", "whichever", "about", "abouts", "the", "them", "an"),
    *("and", "ab", "abc", "x", "ab_cd", "refund", "refunds", "polic", "ü", "é", "12"),
)


@given(
    st.lists(
        st.sampled_from(_PREFIX_WORDS),
        max_size=12,
    ).map(" ".join),
    st.sampled_from(["there", "which", "about", "refun", "the", "them", "an", "and", "ab"]),
    st.sampled_from([3, 5]),
)
def test_a_words_start_is_found_as_when_each_word_was_read_whole(
    text: str, prefix: str, chars: int
) -> None:
    """``prefix_positions`` reads a found word whole only when the prefix begins a
    stopword, and answers a shorter prefix that is a stopword at once: the same places."""
    assert _each_word_read_whole(text, prefix, chars) == prefix_positions(text, prefix, chars)
