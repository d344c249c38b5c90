"""The real model path end to end: MemoryEngine → compaction → openai client → local server."""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from fake_openai import CHAT_PATH, Answer, FakeOpenAI, fake_openai  # noqa: F401
from sessions import rows, run_cli, without_recall

from ragent_memory import EndpointSettings, LLMError, LLMSettings, Settings, StoreSettings
from ragent_memory.core.toolloops import map_loops
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.summary.build import build_summarizer
from ragent_memory.summary.offline import NAME as OFFLINE
from ragent_memory.summary.prompt import SECTIONS
from ragent_memory.summary.summarize import SummaryRequest

MODEL = "summary-model"
KEY_ENV = "RAGENT_MODEL_PATH_KEY"
SECRET = "sk-model-path-5ecret-0123456789abcdef"
TASK = "Check every open order and never refund more than 200 euros without my OK."
BODY = "\n".join(f"{title}\n- written by the model" for title in SECTIONS["en"])
ONE_SECTION = "## Done\n- nothing else to say"

Events = list[tuple[str, dict[str, Any]]]


def summary_reply(_body: Any) -> str:
    """The fake model's default answer: the seven en sections."""
    return BODY


def turns(start: int, count: int) -> list[dict[str, Any]]:
    """``count`` order lookups (~1k chars each, not evictable), each ending on a user message."""
    messages: list[dict[str, Any]] = []
    for turn in range(start, start + count):
        order, call_id = 1000 + turn, f"call_{turn}"
        call = {"name": "lookup_order", "arguments": f'{{"order": {order}}}'}
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            },
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"Order {order}: " + "shipped; " * 70,
            },
            {"role": "assistant", "content": f"Order {order} has shipped. " * 10},
            {"role": "user", "content": f"Thanks. Now order {order + 1}."},
        ]
    return messages


def history(count: int = 12) -> list[dict[str, Any]]:
    """System + task + ``count`` turns: over the 80% gate at B=12,000 after the trim gate."""
    return [
        {"role": "system", "content": "You are an order-support agent."},
        {"role": "user", "content": TASK},
        *turns(0, count),
    ]


def llm(base_url: str, **overrides: Any) -> LLMSettings:
    overrides.setdefault("timeout_s", 5.0)
    overrides.setdefault("max_retries", 0)
    return LLMSettings(base_url=base_url, model=MODEL, **overrides)


def fences(content: str) -> tuple[str, dict[str, int]]:
    """The nonce of the prompt's user message and how often each real fence tag occurs."""
    match = re.search(r'<transcript nonce="([^"]*)">', content)
    assert match is not None
    nonce = match.group(1)
    tags = ["transcript", "/transcript", "previous_summary", "/previous_summary"]
    return nonce, {tag: content.count(f'<{tag} nonce="{nonce}">') for tag in tags}


def assert_valid_context(prepared: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
    assert messages[-1] == without_recall(prepared[-1])
    loops = map_loops(prepared)
    assert not loops.orphan_indexes
    assert all(loop.is_complete for loop in loops.loops)


@pytest.fixture
def settings(db_path: str) -> Callable[..., Settings]:
    """Settings at B=12,000 on the test's SQLite file, with the given ``llm``."""

    def make(llm_settings: LLMSettings) -> Settings:
        return Settings(
            context_window_chars=12_000, store=StoreSettings(path=db_path), llm=llm_settings
        )

    return make


@pytest.fixture
def server(fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The fake endpoint, answering with a valid seven-section summary by default."""
    fake_openai.default = summary_reply
    return fake_openai


@pytest.fixture
def events() -> Events:
    """Every on_event call, as (name, payload)."""
    return []


@pytest.fixture
def delays() -> list[float]:
    """Every retry wait the client asked for (nothing really sleeps)."""
    return []


@pytest.fixture
def engine_for(
    make_engine: Callable[..., MemoryEngine], events: Events, delays: list[float]
) -> Callable[..., MemoryEngine]:
    """An engine whose retries record their waits instead of sleeping."""

    def on_event(name: str, payload: dict[str, Any]) -> None:
        events.append((name, payload))

    def make(settings: Settings) -> MemoryEngine:
        summarizer = build_summarizer(settings, on_event=on_event, sleep=delays.append)
        return make_engine(settings, on_event=on_event, summarizer=summarizer)

    return make


@pytest.fixture
def down(request: pytest.FixtureRequest, closed_url: str) -> Iterator[str]:
    """An endpoint that never answers usefully: 500 forever, or a closed port."""
    if request.param == "closed":
        yield closed_url
        return
    with FakeOpenAI(default=lambda _body: Answer.error(500)) as failing:
        yield failing.base_url


# ---------------------------------------------------------------------------- the happy path


def test_compaction_through_the_model_applies(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    make_engine: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """A compaction goes to the model over HTTP and is applied and audited with its name."""
    messages = history()
    engine = make_engine(settings(llm(server.base_url)))
    prepared = engine.prepare(messages, session_id="s1", user_id="u1")

    assert (True, 1) == (prepared.report.compacted, prepared.report.generation)
    [row] = rows(db_path)
    assert ("applied", MODEL, 1) == (row["status"], row["model"], row["attempts"])
    assert "- written by the model" in row["summary"]
    assert f"> {TASK}" in row["summary"]
    assert any(row["summary"] in str(m["content"]) for m in prepared.messages[1:-1])
    assert messages[0] == prepared.messages[0]
    assert_valid_context(prepared.messages, messages)

    [request] = server.requests
    body = request.body
    assert CHAT_PATH == request.path
    assert (MODEL, 0.3) == (body["model"], body["temperature"])
    assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
    assert "tools" not in body and "tool_choice" not in body
    assert ["system", "user"] == [m["role"] for m in body["messages"]]
    nonce, counts = fences(body["messages"][1]["content"])
    assert re.fullmatch(r"[0-9a-f]{12,}", nonce)
    assert {"transcript": 1, "/transcript": 1, "previous_summary": 1, "/previous_summary": 1} == (
        counts
    )
    everything = "\n".join(m["content"] for m in body["messages"])
    assert 1 == everything.count(f'<transcript nonce="{nonce}">')  # one fence pair in all
    assert nonce in body["messages"][0]["content"]


def test_each_call_gets_a_fresh_nonce(
    server: FakeOpenAI, settings: Callable[..., Settings], make_engine: Callable[..., MemoryEngine]
) -> None:
    """Two compactions of one session send two different nonces; the second rewrites the first."""
    messages = history()
    engine = make_engine(settings(llm(server.base_url)))
    engine.prepare(messages, session_id="s1")
    messages = messages + turns(12, 10)
    prepared = engine.prepare(messages, session_id="s1")

    assert 2 == prepared.report.generation
    first, second = (fences(r.body["messages"][1]["content"])[0] for r in server.requests)
    assert first != second
    assert "- written by the model" in server.requests[1].body["messages"][1]["content"]


def test_long_material_folds_in_chunks(
    fake_openai: FakeOpenAI, make_engine: Callable[..., MemoryEngine], db_path: str
) -> None:
    """Material over max_input_chars is summarised in chunks, each rewriting the last reply."""
    fake_openai.default = lambda _body: BODY.replace("model", f"call {len(fake_openai.requests)}")
    settings = Settings(
        context_window_chars=30_000,
        store=StoreSettings(path=db_path),
        llm=llm(fake_openai.base_url, max_input_chars=12_000),
    )
    engine = make_engine(settings)
    prepared = engine.prepare(history(30), session_id="s1")

    calls = len(fake_openai.requests)
    assert prepared.report.compacted
    assert calls >= 2
    assert [("applied", calls)] == [(r["status"], r["attempts"]) for r in rows(db_path)]
    for index in range(1, calls):
        prompt = fake_openai.requests[index].body["messages"][1]["content"]
        assert f"- written by the call {index}" in prompt.split("</previous_summary")[0]
    assert f"- written by the call {calls}" in rows(db_path)[0]["summary"]


# ---------------------------------------------------------------------------- retries


def test_retry_after_then_success_applies(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    delays: list[float],
    db_path: str,
) -> None:
    """A 429 with Retry-After: 3 is waited out (3 s, recorded), then the 200 applies."""
    server.status(429, headers={"Retry-After": "3"})
    engine = engine_for(settings(llm(server.base_url, max_retries=1)))
    prepared = engine.prepare(history(), session_id="s1")

    assert prepared.report.compacted
    [row] = rows(db_path)
    assert ("applied", MODEL, 2) == (row["status"], row["model"], row["attempts"])
    assert [3.0] == delays
    assert 2 == len(server.requests)


@pytest.mark.parametrize("down", ["status_500", "closed"], indirect=True)
def test_all_endpoints_down_falls_back_to_offline(
    down: str,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    delays: list[float],
    db_path: str,
) -> None:
    """With every endpoint down and offline_fallback on, the offline summarizer applies."""
    engine = engine_for(settings(llm(down, max_retries=1)))
    prepared = engine.prepare(history(), session_id="s1")

    assert prepared.report.compacted
    [row] = rows(db_path)
    assert ("applied", OFFLINE, 2) == (row["status"], row["model"], row["attempts"])
    assert "offline_fallback" == row["written_by"]  # not the model's work, and the audit says so
    assert 1 == len(delays) and 0.5 <= delays[0] <= 0.625


@pytest.mark.parametrize("down", ["status_500", "closed"], indirect=True)
def test_all_endpoints_down_without_fallback_fails_safely(
    down: str,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """With offline_fallback off, the row is failed with an error and the view is intact."""
    messages = history()
    engine = engine_for(settings(llm(down, max_retries=1, offline_fallback=False)))
    prepared = engine.prepare(messages, session_id="s1")

    assert (False, "failed", 0) == (
        prepared.report.compacted,
        prepared.report.skipped_reason,
        prepared.report.generation,
    )
    [row] = rows(db_path)
    assert ("failed", "LLMError", MODEL, 2) == (
        row["status"],
        row["reason"],
        row["model"],
        row["attempts"],
    )
    assert "every LLM endpoint failed" in row["error"]
    assert messages == prepared.messages
    assert_valid_context(prepared.messages, messages)


@pytest.mark.parametrize(
    ("offline_fallback", "status", "model"), [(True, "applied", OFFLINE), (False, "failed", MODEL)]
)
def test_summary_missing_sections_is_retried(
    offline_fallback: bool,
    status: str,
    model: str,
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    events: Events,
    db_path: str,
) -> None:
    """A one-section reply is rejected and retried, then falls back or fails as configured."""
    server.default = lambda _body: ONE_SECTION
    engine = engine_for(
        settings(llm(server.base_url, max_retries=1, offline_fallback=offline_fallback))
    )
    engine.prepare(history(), session_id="s1")

    [row] = rows(db_path)
    assert (status, model, 2) == (row["status"], row["model"], row["attempts"])
    assert 2 == len(server.requests)
    model_errors = [
        p["error"] for n, p in events if n == "summary_attempt" and p["phase"] != "offline"
    ]
    assert ["SummaryError", "SummaryError"] == model_errors
    if not offline_fallback:
        assert "sections" in row["error"]


# ---------------------------------------------------------------------------- events


def test_events_through_a_fallback_endpoint(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    events: Events,
    closed_url: str,
    db_path: str,
) -> None:
    """on_event sees before_summarize, each attempt with its phase and error, after_summarize."""
    fallback = EndpointSettings(server.base_url, "fallback-model")
    engine = engine_for(settings(llm(closed_url, fallbacks=[fallback])))
    engine.prepare(history(), session_id="s1", user_id="u1")

    assert [
        ("before_summarize", None, None, None),
        ("summary_attempt", 1, "primary", "APIConnectionError"),
        ("summary_attempt", 2, "fallback", None),
        ("after_summarize", None, None, None),
    ] == [(n, p.get("attempt"), p.get("phase"), p.get("error")) for n, p in events]
    before, after = events[0][1], events[-1][1]
    assert ("s1", "u1", 1) == (before["session_id"], before["user_id"], before["generation"])
    assert "applied" == after["status"]
    assert [("applied", "fallback-model", 2)] == [
        (r["status"], r["model"], r["attempts"]) for r in rows(db_path)
    ]


def test_events_when_falling_back_offline(
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    events: Events,
    closed_url: str,
) -> None:
    """The offline fallback is reported as one more attempt, in phase offline."""
    engine = engine_for(settings(llm(closed_url)))
    engine.prepare(history(), session_id="s1")

    assert [
        ("before_summarize", None, None, None),
        ("summary_attempt", 1, "primary", "APIConnectionError"),
        ("summary_attempt", 2, "offline", None),
        ("after_summarize", None, None, None),
    ] == [(n, p.get("attempt"), p.get("phase"), p.get("error")) for n, p in events]


# ---------------------------------------------------------------------------- the API key


def test_api_key_reaches_the_server_and_nowhere_else(
    monkeypatch: pytest.MonkeyPatch,
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    events: Events,
    db_path: str,
) -> None:
    """The key goes out as a bearer token; logs, events, errors, the DB and repr never hold it."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    echo = {"error": {"message": f"bad request from Bearer {SECRET} (key {SECRET})"}}
    with FakeOpenAI(default=lambda _body: Answer.error(400, body=echo)) as echoing:
        config = settings(
            llm(
                echoing.base_url,
                api_key_env=KEY_ENV,
                offline_fallback=False,
                fallbacks=[EndpointSettings(server.base_url, "fallback-model", KEY_ENV)],
            )
        )
        engine = engine_for(config)
        with structlog.testing.capture_logs() as logs:
            applied = engine.prepare(history(), session_id="ok")
            server.default = lambda _body: Answer.error(401, body=echo)
            failed = engine.prepare(history(), session_id="down")
            with pytest.raises(LLMError) as caught:
                engine.summarizer.summarize(SummaryRequest(tuple(history(1)), "", "en", 1_000))
        sent = [r.headers.get("authorization") for r in [*echoing.requests, *server.requests]]

    assert (True, False) == (applied.report.compacted, failed.report.compacted)
    assert ["applied", "failed"] == [r["status"] for r in rows(db_path)]
    assert {f"Bearer {SECRET}"} == set(sent)
    assert logs and events
    error_text = "".join(traceback.format_exception(caught.value))
    db_bytes = b"".join(p.read_bytes() for p in Path(db_path).parent.glob("memory.db*"))
    places = {
        "logs": repr(logs),
        "events": repr(events),
        "exception": error_text,
        "rows": json.dumps(rows(db_path)),
        "db file": db_bytes.decode("utf-8", "replace"),
        "settings": repr(config),
        "summarizer": repr(engine.summarizer) + repr(getattr(engine.summarizer, "client", None)),
        "messages": repr(applied.messages) + repr(failed.messages),
    }
    assert {} == {where: True for where, text in places.items() if SECRET in text}
    assert "[redacted]" in rows(db_path)[1]["error"]


def test_an_api_key_echoed_inside_a_valid_reply_is_never_kept(
    monkeypatch: pytest.MonkeyPatch,
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """A server that echoes the key in a summary the validator accepts: the key is scrubbed
    from the reply before the summary, the audit row, the summary memory or a log keeps it."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    echoed = BODY.replace("- written by the model", f"- the key is {SECRET}", 2)
    server.default = lambda _body: echoed
    engine = engine_for(settings(llm(server.base_url, api_key_env=KEY_ENV)))
    with structlog.testing.capture_logs() as logs:
        prepared = engine.prepare(history(), session_id="s1", user_id="u1")
        engine.flush()
    assert prepared.report.compacted
    db_bytes = b"".join(p.read_bytes() for p in Path(db_path).parent.glob("memory.db*"))
    assert SECRET.encode() not in db_bytes
    assert SECRET not in repr(logs) + repr(prepared.messages)
    assert "[redacted]" in rows(db_path)[0]["summary"]


# ---------------------------------------------------------------------------- small models


def long_section(title: str, lines: int) -> str:
    return "\n".join(
        [title, *(f"- {title[3:]} fact {i}: checked and noted for later" for i in range(lines))]
    )


def test_an_over_long_seven_section_reply_is_fitted_inside_its_sections(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    make_engine: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """A small model's reply three times the target, its first section the longest: applied
    with one call, every section kept (a cut at a section boundary would keep one), the
    body within what the request asked for."""
    reply = "\n\n".join(long_section(t, 40 if i == 0 else 8) for i, t in enumerate(SECTIONS["en"]))
    server.default = lambda _body: reply
    config = settings(llm(server.base_url, offline_fallback=False))
    engine = make_engine(config)
    prepared = engine.prepare(history(), session_id="s1")

    assert prepared.report.compacted
    [row] = rows(db_path)
    assert ("applied", "model", 1) == (row["status"], row["written_by"], row["attempts"])
    assert len(reply) > 3 * config.summary_max_chars >= row["summary_chars"]
    summary = row["summary"]
    assert all(title in summary.splitlines() for title in SECTIONS["en"])
    assert "- Done fact 0: checked" in summary
    assert "- User requests fact 39:" not in summary
    [request] = server.requests
    system = request.body["messages"][0]["content"]
    asked = int(re.search(r"at most (\d+) characters in all", system).group(1))  # type: ignore[union-attr]
    assert asked < config.summary_max_chars
    assert request.body["max_tokens"] >= asked  # room to finish a reply longer than asked
    assert "</transcript" in request.body["stop"]


def test_a_length_cut_reply_keeps_its_four_complete_sections(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    make_engine: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """Cut off by max_tokens inside its fifth section: the four complete ones are applied."""
    complete = "\n\n".join(long_section(t, 2) for t in SECTIONS["en"][:4])
    server.reply(complete + "\n\n## Tools and findings\n- ORD-1 is in the wareh", "length")
    engine = make_engine(settings(llm(server.base_url, offline_fallback=False)))
    assert engine.prepare(history(), session_id="s1").report.compacted

    [row] = rows(db_path)
    assert ("applied", 1) == (row["status"], row["attempts"])
    summary = row["summary"]
    assert all(t in summary for t in SECTIONS["en"][:4])
    assert "## Tools and findings" not in summary and "wareh" not in summary
    assert 1 == len(server.requests)


def test_a_two_section_reply_is_still_rejected(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """Two sections are no summary, long or short, stopped or cut: rejected, never applied."""
    two = "\n\n".join(long_section(t, 40) for t in SECTIONS["en"][:2])
    server.reply(two + "\n\n## To-do\n- half", "length")
    server.default = lambda _body: two
    with structlog.testing.capture_logs() as logs:
        engine = engine_for(settings(llm(server.base_url, max_retries=1, offline_fallback=False)))
        assert not engine.prepare(history(), session_id="s1").report.compacted

    [row] = rows(db_path)
    assert ("failed", "LLMError", 2) == (row["status"], row["reason"], row["attempts"])
    details = [e["detail"] for e in logs if e["event"] == "summarizer.attempt"]
    assert "2 complete '## ' sections" in details[0] and "only 2" in details[1]


# ---------------------------------------------------------------------------- a dead model


@pytest.mark.parametrize("down", ["status_500", "closed"], indirect=True)
def test_an_open_breaker_adds_at_most_two_audit_rows_in_fifty_turns(
    down: str,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """Five failed requests open the breaker: the compaction that made them is audited
    failed, the next says every endpoint is cooling down, then 50 turns over the trigger add
    nothing (each is skipped as cooling_down, and logged) until a retry is due."""
    messages = history()
    engine = engine_for(settings(llm(down, max_retries=4, offline_fallback=False)))
    reports = [engine.prepare(messages, session_id="s1").report]
    for turn in range(12, 62):
        messages = messages + turns(turn, 1)
        reports.append(engine.prepare(messages, session_id="s1").report)

    found = rows(db_path)
    assert 2 >= len(found)
    assert [("failed", "LLMError", 5), ("failed", "cooling_down", 0)] == [
        (r["status"], r["reason"], r["attempts"]) for r in found
    ]
    assert "cooling down" in found[1]["error"]
    assert all(r.skipped_reason == "cooling_down" for r in reports[1:])
    assert all(r.generation == 0 for r in reports)


def test_audit_shows_per_session_what_the_model_wrote_and_what_fell_back(
    server: FakeOpenAI,
    settings: Callable[..., Settings],
    engine_for: Callable[..., MemoryEngine],
    db_path: str,
) -> None:
    """`ragent-memory audit` (a real subprocess) counts, per session, the compactions the
    model wrote, those the offline summarizer wrote in its place, and the failed ones."""
    with_fallback = engine_for(settings(llm(server.base_url)))
    with_fallback.prepare(history(), session_id="s1")
    server.default = lambda _body: Answer.error(500)
    with_fallback.prepare(history() + turns(12, 10), session_id="s1")
    with_fallback.close()
    without = engine_for(settings(llm(server.base_url, offline_fallback=False)))
    without.prepare(history(), session_id="s2")
    without.close()

    assert [("model", 1), ("offline_fallback", 1), ("", 1)] == [
        (r["written_by"], r["attempts"]) for r in rows(db_path)
    ]
    done = run_cli("audit", "--db", db_path)
    assert 0 == done.returncode, done.stderr
    assert "s1: 2 applied (1 written by the model, 1 fell back to offline)" in done.stdout
    assert "s2: 0 applied, 1 failed" in done.stdout
    assert "written_by" in done.stdout.splitlines()[0]
