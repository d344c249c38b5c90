"""A summarizer model that answers with the previous summary unchanged: every compaction still
applies and moves the summary on with the new material's facts, over the real ``openai`` SDK
against a scripted server on 127.0.0.1."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fake_openai import DEFAULT_TEXT, Answer, FakeOpenAI, fake_openai  # noqa: F401

from ragent_memory import LLMSettings, Settings, StoreSettings
from ragent_memory.core.identifiers import kept_in
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.summary.build import build_summarizer
from ragent_memory.summary.prompt import NEW_NOTE

B = 12_000
SESSION, USER = "refunds", "u"
PEOPLE = ("Maria Lopez", "Dana Reyes", "Omar Haddad", "Lena Fox", "Ivo Petrov", "Sara Kim")
POLICY = "Refunds follow the 30-day window; partial refunds need a reason code. "
_PREVIOUS = re.compile(r'<previous_summary nonce="\w+">\n(.*?)\n</previous_summary', re.S)


def echo_previous(body: Any) -> str:
    """The scripted model: the previous summary, byte for byte (seven empty sections first)."""
    found = _PREVIOUS.search(body["messages"][-1]["content"])
    previous = found.group(1) if found else "none"
    return DEFAULT_TEXT if previous == "none" else previous


def orders(turn: int) -> list[tuple[str, str, str]]:
    """Turn ``turn``'s looked-up orders: (order id, amount, customer), all new each turn."""
    return [
        (f"ORD-{70_000 + turn * 10 + k}", f"€{100 + turn * 7 + k}", PEOPLE[(turn + k) % 6])
        for k in range(4)
    ]


def turn_messages(turn: int) -> list[dict[str, Any]]:
    """A refunds agent's turn: the user's ask, a lookup whose result plants four order ids
    between policy text, the assistant's short answer."""
    call_id = f"call_{turn}"
    lines = [f"Order {o} for {n}: returned damaged, refund due {a}." for o, a, n in orders(turn)]
    result = POLICY * 3 + " ".join(lines) + " " + POLICY * 3
    arguments = json.dumps({"batch": turn})
    return [
        {"role": "user", "content": f"Check refund batch {turn}, please."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "lookup_orders", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": f"Batch {turn} checked; the refunds are listed."},
    ]


def drive(engine: MemoryEngine, generations: int) -> list[dict[str, Any]]:
    """Turn by turn until ``generations`` compactions are audited; every audit row."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a refunds agent."}]
    for turn in range(200):
        messages += turn_messages(turn)
        engine.prepare(messages, session_id=SESSION, user_id=USER)
        rows = engine.store.compactions(SESSION)
        if len(rows) >= generations:
            return [dict(r) for r in rows]
    raise AssertionError("fewer compactions than expected in 200 turns")


def covered_ids(row: dict[str, Any]) -> list[str]:
    """The order ids planted in the raw messages a compaction covered (after the system
    message, four messages a turn)."""
    turns = range((row["covered_from"] - 1) // 4, (row["covered_to"] - 2) // 4 + 1)
    return [o for t in turns for o, _, _ in orders(t)]


def engine_for(
    server: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db: str
) -> MemoryEngine:
    """An engine summarizing through ``server`` only: no retries, no offline fallback."""
    llm = LLMSettings(
        base_url=server.base_url,
        model="m",
        timeout_s=10.0,
        max_retries=0,
        offline_fallback=False,
    )
    settings = Settings(
        context_window_chars=B, store=StoreSettings(path=db), llm=llm, long_term_enabled=False
    )
    return make_engine(settings, summarizer=build_summarizer(settings, sleep=lambda _s: None))


def assert_moved_on(rows: list[dict[str, Any]]) -> None:
    """Every row applied, each generation holding order ids of its material that the
    previous generation lacked."""
    assert ["applied"] * len(rows) == [r["status"] for r in rows], [r["error"] for r in rows]
    assert [1, 2, 3, 4] == [r["generation"] for r in rows][:4]
    previous = ""
    for row in rows:
        summary = str(row["summary"])
        moved = [i for i in covered_ids(row) if kept_in(i, summary) and not kept_in(i, previous)]
        assert moved, f"generation {row['generation']} kept no new order id:\n{summary}"
        assert ("m", "model") == (row["model"], row["written_by"])
        previous = summary


def test_a_model_that_echoes_the_previous_summary_still_moves_it_on(
    fake_openai: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """Every generation applies (none fails for the repeat) and holds order ids of the
    material it covered that the previous generation lacked; the one retry names them."""
    fake_openai.default = echo_previous
    rows = drive(engine_for(fake_openai, make_engine, db_path), 4)

    assert_moved_on(rows)
    notes = [
        r.body["messages"][-1]["content"]
        for r in fake_openai.requests
        if NEW_NOTE["en"].strip() in r.body["messages"][-1]["content"]
    ]
    assert len(notes) >= 3  # generations 2–4 each asked once more, naming what was new
    assert all(r["attempts"] == 2 for r in rows[1:4])
    assert any("ORD-70" in note.split(NEW_NOTE["en"].strip())[1] for note in notes)


def test_a_repeat_whose_retry_fails_is_kept_and_moved_on(
    fake_openai: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """When the one retry after a repeat fails (the endpoint answers 500), the repeat is
    kept and the new material's facts restored into it: the compaction still applies."""

    def echo_or_fail(body: Any) -> str | Answer:
        if NEW_NOTE["en"].strip() in body["messages"][-1]["content"]:
            return Answer.error(500)
        return echo_previous(body)

    fake_openai.default = echo_or_fail
    rows = drive(engine_for(fake_openai, make_engine, db_path), 4)

    assert_moved_on(rows)
    assert all(r["attempts"] >= 2 for r in rows[1:4])
