"""Issue 34: long-term memory learns what people actually say, and only that — the statements
of the issue, the distractor kinds, the labelled corpus's targets, negations that supersede,
near-duplicates, a 120-turn LangChain session and the engine's own messages fed back."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from sessions import chat, query

from benchmarks import facts as bench
from ragent_memory import MemoryEngine, Settings
from ragent_memory.engine.compaction import SUMMARY_HEADERS
from ragent_memory.engine.memory import own_text
from ragent_memory.integrations.langchain import RagentMemoryMiddleware
from ragent_memory.longterm.offline import OfflineExtractor, candidates
from ragent_memory.longterm.vocabulary import HEADERS, Extraction, ExtractionRequest
from ragent_memory.recall.excerpts import HEADERS as RECALL_HEADERS

# Every statement quoted under the issue's *Why*, and the fact each must leave.
WHY = [
    ("Quick note: I work at Globex.", ["Works at Globex"]),
    ("Turn 0: I work at Globex.", ["Works at Globex"]),
    ("Also: I'm vegetarian, so no meat suggestions please.", ["Is vegetarian"]),
    ("Context for you - I'm a nurse working night shifts.", ["Is a nurse working night shifts"]),
    ("Please always answer in Spanish.", ["Standing request: always answer in Spanish"]),
    ("i use vim, not vscode", ["Uses vim, not vscode"]),
    ("We're on Postgres 15 in production.", ["Uses Postgres 15 in production"]),
    ("my timezone is CET", ["Timezone is CET"]),
    ("I don't drink coffee anymore.", ["Does not drink coffee"]),
    ("I'm training for a marathon in April.", ["Is training for a marathon in April"]),
    ("As a teacher, I need lesson plans for 8-year-olds.", ["Is a teacher"]),
    ("Remember that my birthday is on 14 March.", ["Birthday is on 14 March"]),
    ("Hi! I'm Priya and I live in Porto.", ["Is called Priya", "Lives in Porto"]),
]
# The kinds of the issue's *Build* list, each once more in Chinese.
BUILD = [
    ("btw, my name is Ana and I'm a pharmacist.", ["Is called Ana", "Is a pharmacist"]),
    ("FYI our team uses FastAPI.", ["Uses FastAPI"]),
    ("I prefer answers with code first.", ["Prefers answers with code first"]),
    ("I no longer work at Initech.", ["No longer works at Initech"]),
    ("请以后都用中文回答", ["长期要求：以后都用中文回答"]),
    ("另外，我叫王芳，住在成都。", ["名叫王芳", "住在成都"]),
    ("我对花生过敏，而且我是素食者。", ["对花生过敏", "吃素食"]),
    ("我们生产环境用的是PostgreSQL 15。", ["使用PostgreSQL 15"]),
    ("我已经不喝咖啡了。", ["不再喝咖啡"]),
]
DISTRACTORS = [
    "If I lived in Berlin, I'd cycle everywhere.",
    "my colleague said she works at Initech",
    "I'm tired today.",
    "I'm looking at the logs.",
    "Do I need a visa if I work in Canada?",
    "Translate this: 'I work at Globex and live in Porto.'",
    "如果我住在北京，要办暂住证吗？",
    "我同事说她在阿里工作。",
    "我今天有点累。",
]


def facts_of(engine: MemoryEngine, user_id: str = "u1") -> list[str]:
    return [f.content for f in engine.memories(user_id)]


@pytest.mark.parametrize(("statement", "expected"), WHY + BUILD)
def test_each_statement_is_learnt(statement: str, expected: list[str]) -> None:
    """Lead-ins and second clauses hide no fact; both facts of a two-fact sentence count."""
    assert expected == [c.content for c in candidates(statement)]


def test_the_issues_statements_through_the_engine(make_engine: Callable[..., MemoryEngine]) -> None:
    """As the issue tried it: one statement per short session, then
    ``flush(extract_pending=True)`` — every fact learnt (a standing fact or its supersession)."""
    engine = make_engine()
    for n, (statement, _) in enumerate(WHY):
        engine.after_turn(chat(statement), session_id=f"s{n}", user_id="u1")
    assert engine.flush(extract_pending=True)
    learnt = facts_of(engine)
    expected = list(dict.fromkeys(f for _, facts in WHY for f in facts))
    assert sorted(expected) == sorted(learnt)


@pytest.mark.parametrize("text", DISTRACTORS)
def test_named_distractors_teach_nothing(text: str) -> None:
    assert [] == candidates(text)


@pytest.mark.parametrize("language", bench.LANGUAGES)
def test_no_distractor_of_the_corpus_teaches_anything(language: str) -> None:
    """Questions, hypotheticals, reported speech, transient states, one-off requests, small
    talk, pasted text and role play: nothing learnt from any of the corpus's."""
    taught = {
        u.text: [c.content for c in candidates(u.text)]
        for u in bench.load(language)
        if u.distractor is not None
    }
    assert {} == {text: facts for text, facts in taught.items() if facts}


@pytest.mark.parametrize("language", bench.LANGUAGES)
def test_the_corpus_meets_the_targets(language: str) -> None:
    """The committed corpus (the facts benchmark): ≥ 300 utterances in all, a third or more
    distractors, every *Why* statement in it, and offline recall ≥ 0.80 at precision ≥ 0.95."""
    rows = {lang: bench.load(lang) for lang in bench.LANGUAGES}
    every = [u for lang_rows in rows.values() for u in lang_rows]
    assert len(every) >= 300
    assert 3 * sum(u.distractor is not None for u in every) >= len(every)
    assert {s for s, _ in WHY} <= {u.text for u in every}
    figures = bench.report(bench.run(rows[language], bench.offline_extract, 1))["overall"]
    assert figures["precision"] >= bench.TARGET_PRECISION, figures
    assert figures["recall"] >= bench.TARGET_RECALL, figures


def test_a_negation_supersedes_and_is_not_repeated(
    make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """ "I don't drink coffee anymore" supersedes "Likes coffee" (kept, marked superseded);
    said again, it changes nothing."""
    engine = make_engine()
    engine.after_turn(chat("I like coffee.", "I work at Globex."), session_id="s1", user_id="u1")
    engine.flush(extract_pending=True)
    said = chat("I don't drink coffee anymore.", "I no longer work at Globex.")
    for session in ("s2", "s3"):
        engine.after_turn(said, session_id=session, user_id="u1")
        engine.flush(extract_pending=True)
    assert ["Does not drink coffee", "No longer works at Globex"] == facts_of(engine)
    rows = query(db_path, "SELECT content, status FROM memories ORDER BY id")
    assert [
        ("Likes coffee", "superseded"),
        ("Works at Globex", "superseded"),
        ("Does not drink coffee", "active"),
        ("No longer works at Globex", "active"),
    ] == rows


def test_near_duplicates_merge(make_engine: Callable[..., MemoryEngine]) -> None:
    """The same fact in other words is one fact: the fuller wording stays."""
    engine = make_engine()
    said = [
        "I'm vegetarian.",
        "i use vim",
        "I'm a vegetarian.",
        "I use vim, not vscode.",
        "我住在成都。",
        "我住在成都",
    ]
    engine.after_turn(chat(*said), session_id="s1", user_id="u1")
    engine.flush(extract_pending=True)
    assert ["Is a vegetarian", "Uses vim, not vscode", "住在成都"] == facts_of(engine)


def test_nothing_from_the_assistant_or_tool_results(
    make_engine: Callable[..., MemoryEngine],
) -> None:
    engine = make_engine()
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Look me up."},
        {"role": "assistant", "content": "I live in Paris and I work at Initech.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "I'm a nurse. My name is Bob."},
        {"role": "assistant", "content": "My name is Claude."},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "I live in Rome."},
            {"type": "text", "text": "I live in Oslo."},
        ]},
    ]  # fmt: skip
    engine.after_turn(history, session_id="s1", user_id="u1")
    engine.flush(extract_pending=True)
    assert ["Lives in Oslo"] == facts_of(engine)


def test_a_recall_block_is_left_out_and_the_users_words_kept() -> None:
    block = f"{RECALL_HEADERS['en']}\n- [s1 #3] user: I live in Porto."
    message = {"role": "user", "content": [{"type": "text", "text": block}, {"type": "text", "text": "I live in Oslo."}]}  # fmt: skip
    assert "I live in Oslo." == own_text(message)
    assert "" == own_text({"role": "user", "content": f"{HEADERS['en']}\n- Lives in Porto"})


def long_chat(turns: int, planted: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in range(turns):
        said = planted.get(t) or f"Turn {t}: some chat about the weather and the traffic. " * 3
        out += [
            {"role": "user", "content": said},
            {"role": "assistant", "content": f"Reply {t}: sure, " + "that sounds fine. " * 4},
        ]
    return out


class RecordingExtractor(OfflineExtractor):
    """The offline extractor, keeping every message it was asked to learn from."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def extract(self, request: ExtractionRequest) -> Extraction:
        self.seen += request.messages
        return super().extract(request)


def test_the_engines_prepared_messages_fed_back_teach_nothing_new(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """An app that keeps what ``prepare`` handed out as its history — the memory block, a
    summary and a recall block, both quoting the home the user has since left: none of the
    engine's blocks reaches the extractor, the move stands and no memory is added."""
    extractor = RecordingExtractor()
    settings = make_settings(context_window_chars=8_000)
    engine = make_engine(settings, extractor=extractor)
    engine.after_turn(chat("I live in Porto, by the river Douro."), session_id="old", user_id="u1")
    planted = {2: "I live in Porto.", 30: "I moved to Lisbon.", 31: "I work at Globex."}
    history = long_chat(60, planted)
    for i in range(0, len(history), 2):
        engine.prepare(history[: i + 1], session_id="s", user_id="u1")
        engine.after_turn(history[: i + 2], session_id="s", user_id="u1")
    assert engine.flush(extract_pending=True)
    assert ["Lives in Lisbon", "Works at Globex"] == facts_of(engine)
    memories = query(settings.store.path, "SELECT id, content, status FROM memories")
    asked = [
        *history,
        {"role": "user", "content": "Remind me: I live in Porto by the river, right?"},
    ]
    prepared = engine.prepare(asked, session_id="s", user_id="u1")
    texts = [json.dumps(m["content"], ensure_ascii=False) for m in prepared.messages]
    assert any(t.startswith(f'"{HEADERS["en"][:40]}') for t in texts)
    summary = next(t for t in texts if t.startswith(f'"{SUMMARY_HEADERS["en"][:40]}'))
    assert "I live in Porto" in summary
    assert prepared.report.recalled >= 1
    assert "river Douro" in texts[-1].split("Remind me")[0]
    extractor.seen.clear()
    fed_back = [*prepared.messages, {"role": "assistant", "content": "You live in Lisbon."}]
    for session in ("s", "app-copy"):
        engine.after_turn(fed_back, session_id=session, user_id="u1")
        assert engine.flush(extract_pending=True)
    headers = (HEADERS["en"][:30], SUMMARY_HEADERS["en"][:30], RECALL_HEADERS["en"][:30])
    assert extractor.seen and not [m for m in extractor.seen if any(h in m for h in headers)]
    assert memories == query(settings.store.path, "SELECT id, content, status FROM memories")


class NotedModel(BaseChatModel):
    """Answers every turn with "Noted."."""

    @property
    def _llm_type(self) -> str:
        return "noted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> NotedModel:
        return self

    def _generate(self, messages: Sequence[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("Noted."))])


def test_120_turns_through_langchain_learn_one_fact(
    make_settings: Callable[..., Settings], db_path: str
) -> None:
    """Every user message starts "Turn N: I work at Globex.": one fact, stored once."""
    with MemoryEngine(make_settings()) as engine:
        agent = create_agent(NotedModel(), tools=[], middleware=[RagentMemoryMiddleware(engine)])
        config = {"configurable": {"thread_id": "t1", "user_id": "u1"}}
        history: list[Any] = []
        for turn in range(120):
            message = HumanMessage(f"Turn {turn}: I work at Globex. What should I read next?")
            history = agent.invoke({"messages": [*history, message]}, config)["messages"]
        assert engine.flush(extract_pending=True)
        assert ["Works at Globex"] == facts_of(engine)
    assert [("Works at Globex", "active")] == query(db_path, "SELECT content, status FROM memories")
