"""The recall block at the grain of the answer (docs/design.md §9b): a long reply shown by the
part that holds what is asked, the room up to B used and never passed, every excerpt dated,
questions about order answered oldest first, and the latest of several values marked."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from ragent_memory import Settings
from ragent_memory.core.chars import chars
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.recall.excerpts import HEADERS
from ragent_memory.settings import RECALL_TURN_CHARS

pytestmark = pytest.mark.both_backends

FILLER = "We talked about the weather and the traffic on the way to work today. " * 3


def block_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, list) and content[0]["text"].startswith(HEADERS["en"]):
        return str(content[0]["text"])
    return ""


def drive(engine: MemoryEngine, messages: list[dict[str, Any]], session: str) -> None:
    """What an agent does: prepare on each user message, after_turn after each reply."""
    for i, message in enumerate(messages):
        if message["role"] == "user":
            if i:
                engine.after_turn(messages[:i], session_id=session, user_id="u")
            engine.prepare(messages[: i + 1], session_id=session, user_id="u")
    engine.after_turn(messages, session_id=session, user_id="u")
    engine.flush()


def ask(engine: MemoryEngine, question: str) -> tuple[str, Any]:
    """``question`` in a fresh session of the user: the block and the report."""
    prepared = engine.prepare([{"role": "user", "content": question}], session_id="q", user_id="u")
    return block_of(prepared.messages[-1]), prepared


def long_reply() -> str:
    """Eight paragraphs without a sentence end (the reply is one long sentence); the fifth a
    lead-in line and a config block whose value ends it."""
    paragraphs = [
        f"Paragraph {i}: " + "we went on about the weather and traffic " * 6 for i in range(8)
    ]
    config = "\n".join(f"    option_{k} = value_{k}" for k in range(20))
    paragraphs[4] = f"Here is the pgbouncer pool config:\n```ini\n{config}\n    pool_size = 37\n```"
    return "\n\n".join(paragraphs)


def test_a_long_reply_shows_the_part_that_holds_the_answer(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A hit in a reply of eight paragraphs shows its fifth, the code block with its lead-in,
    whole: not the reply's head and tail."""
    engine = make_engine(make_settings(context_window_chars=20_000))
    said = [
        {"role": "user", "content": "How should I set up the pgbouncer pool config?"},
        {"role": "assistant", "content": long_reply()},
    ]
    drive(engine, said, "a")
    block, _ = ask(engine, "What pool_size did we put in the pgbouncer pool config?")
    assert "Here is the pgbouncer pool config" in block
    assert "pool_size = 37" in block
    assert "Paragraph 7" not in block  # the reply's tail, which holds nothing asked


def test_a_paragraph_too_long_for_the_room_shows_its_sentence_that_holds_the_answer(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """A hit whose first paragraph is longer than a hit may show shows that paragraph's
    sentence holding what is asked, not a shorter later part that shares fewer words."""
    engine = make_engine(make_settings(context_window_chars=8_000))
    opening = " ".join(
        [
            "I spent the morning tidying the repository and renaming a few modules.",
            "The login API response time is now 120ms under 20 concurrent requests.",
            *[
                f"Note {i}: the build scripts were reorganised into smaller steps today."
                for i in range(6)
            ],
        ]
    )
    code = "```js\n" + "\n".join(f"const step{k} = run({k});" for k in range(12)) + "\n```"
    said = [
        {"role": "user", "content": f"{opening}\n\n{code}\n\nCan you review my login code?"},
        {"role": "assistant", "content": "Sure."},
    ]
    drive(engine, said, "a")
    block, _ = ask(engine, "What is the login API response time under 20 concurrent requests?")
    assert "120ms under 20 concurrent requests" in block
    assert "Note 5" not in block  # the paragraph's other sentences share nothing asked


@pytest.mark.parametrize(("budget", "cap"), [(12_000, None), (12_000, 1_500), (30_000, None)])
def test_the_block_uses_the_room_and_never_passes_b(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    budget: int,
    cap: int | None,
) -> None:
    """A fresh session leaves most of B free: the block takes more than a fifth of it, and
    what is sent (the memory block aside) is never more than B; ``recall.max_chars`` caps
    the block."""
    said = []
    for k in range(30):
        said += [
            {"role": "user", "content": f"Note {k}: the deploy checklist item {k} for the api."},
            {"role": "assistant", "content": f"Deploy checklist item {k}: {FILLER * 4}"},
        ]
    engine = make_engine(make_settings(context_window_chars=budget, recall={"max_chars": cap}))
    drive(engine, said, "a")
    block, prepared = ask(engine, "What was on the deploy checklist for the api?")
    report = prepared.report  # B holds all but the memory block (outside it)
    sent = sum(chars(m) for m in prepared.messages) - report.memory_chars
    assert sent <= budget and report.recalled_chars == len(block)
    if cap is None:
        assert len(block) > budget // 5
    else:
        assert 0 < len(block) <= cap


QUESTION = "What was on the deploy checklist for the api?"


def checklist_engine(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings], **recall: Any
) -> MemoryEngine:
    """An engine at B = 200,000 whose user said 120 deploy-checklist items in session "a"."""
    said = []
    for k in range(120):
        said += [
            {"role": "user", "content": f"Note {k}: the deploy checklist item {k} for the api."},
            {"role": "assistant", "content": f"Deploy checklist item {k}: {FILLER * 4}"},
        ]
    engine = make_engine(make_settings(context_window_chars=200_000, recall=recall))
    drive(engine, said, "a")
    return engine


def second_turn_block(engine: MemoryEngine) -> str:
    """The block on the question asked as the second turn of a new session."""
    messages = [
        {"role": "system", "content": "You help with deploys."},
        {"role": "user", "content": "Hello again."},
        {"role": "assistant", "content": "Hi! What do you need?"},
        {"role": "user", "content": QUESTION},
    ]
    prepared = engine.prepare(messages, session_id="second", user_id="u")
    return block_of(prepared.messages[-1])


@pytest.mark.parametrize(
    ("recall", "first_cap", "later_cap"),
    [
        ({}, None, RECALL_TURN_CHARS),  # the default: the first turn takes the room
        ({"turn_chars": None}, None, None),
        ({"max_chars": 6_000}, 6_000, 6_000),
    ],
)
def test_a_later_turns_block_is_bounded_in_chars_a_first_turns_takes_the_room(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    recall: dict[str, Any],
    first_cap: int | None,
    later_cap: int | None,
) -> None:
    """At a large B the view leaves far more room than one question needs: past a session's
    first turn a block stops at ``recall.turn_chars`` (``RECALL_TURN_CHARS`` by default; null:
    the room); the first turn's takes the room; ``recall.max_chars`` caps every turn's."""
    engine = checklist_engine(make_engine, make_settings, **recall)
    first, _ = ask(engine, QUESTION)
    later = second_turn_block(engine)
    for block, cap in ((first, first_cap), (later, later_cap)):
        if cap is None:
            assert len(block) > 2 * RECALL_TURN_CHARS
        else:
            assert 0.75 * cap < len(block) <= cap


def dated_sessions(engine: MemoryEngine) -> None:
    """Three sessions, each stamped with its date, said out of date order (March before
    February), each naming the database then in use."""
    for session, day, db in (
        ("s1", "January 10, 2024", "MySQL"),
        ("s2", "March 2, 2024", "CockroachDB"),
        ("s3", "February 5, 2024", "PostgreSQL"),
    ):
        said = [
            {"role": "user", "content": f"[{day}] We switched the orders database to {db}."},
            {"role": "assistant", "content": f"Noted: the orders database is {db} now."},
        ]
        drive(engine, said, session)


def tags(block: str) -> list[str]:
    return [line for line in block.split("\n") if line.startswith("— session")]


def test_every_excerpt_is_dated_and_order_questions_read_oldest_first(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Each excerpt's tag carries the date it was said; asked about order, the excerpts
    follow the dates (January, February, March) whatever their rank."""
    engine = make_engine(make_settings(context_window_chars=20_000))
    dated_sessions(engine)
    block, _ = ask(engine, "In what order did we switch the orders database?")
    found = tags(block)
    assert len(found) == 3
    assert all(re.search(r"\w+ \d+, 2024", tag) for tag in found)
    months = [re.search(r"(January|February|March)", tag).group(0) for tag in found]  # type: ignore[union-attr]
    assert months == ["January", "February", "March"]


def test_the_latest_of_several_values_is_marked(
    make_engine: Callable[..., MemoryEngine], make_settings: Callable[..., Settings]
) -> None:
    """Of three statements of the database in use, the one said last (by date) is marked the
    latest, and only it."""
    engine = make_engine(make_settings(context_window_chars=20_000))
    dated_sessions(engine)
    block, _ = ask(engine, "Which orders database did we switch to?")
    marked = [tag for tag in tags(block) if tag.endswith("· latest")]
    assert len(marked) == 1 and "March 2, 2024" in marked[0]
