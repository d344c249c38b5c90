"""The retry layer, over real HTTP with the real openai client against scripted local servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from fake_openai import (  # noqa: F401
    DEFAULT_TEXT,
    MAX_STALL_S,
    Answer,
    FakeOpenAI,
    fake_openai,
)

from ragent_memory.errors import LLMError, SummaryError
from ragent_memory.llm.client import CircuitBreaker, Completion, LLMClient, retry_delay_s
from ragent_memory.settings import EndpointSettings, LLMSettings

MESSAGES = [
    {"role": "system", "content": "Summarise the transcript."},
    {"role": "user", "content": "Never exceed 4,321 euros."},
]
SECRET = "sk-test-5ecret-d0-not-leak-0123456789"
KEY_ENV = "RAGENT_TEST_API_KEY"

Events = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def primary(fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The first endpoint."""
    return fake_openai


@pytest.fixture
def fallback() -> Iterator[FakeOpenAI]:
    """A second scripted endpoint, used as the first fallback."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def delays() -> list[float]:
    """Every delay the client asked to sleep, in order (no real sleeping)."""
    return []


@pytest.fixture
def events() -> Events:
    """Every on_event call, as (name, payload)."""
    return []


@pytest.fixture
def make_client(delays: list[float], events: Events) -> Iterator[Callable[..., LLMClient]]:
    """Build LLMClients (zero jitter, recorded sleeps and events) closed after the test."""
    made: list[LLMClient] = []

    def make(
        primary: FakeOpenAI,
        *fallbacks: FakeOpenAI,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        base_url: str | None = None,
        **settings: Any,
    ) -> LLMClient:
        endpoints = [
            EndpointSettings(f.base_url, f"fallback-model-{i}", settings.get("api_key_env"))
            for i, f in enumerate(fallbacks, 1)
        ]
        llm = LLMSettings(
            base_url=base_url or primary.base_url,
            model="primary-model",
            fallbacks=endpoints,
            **settings,
        )
        client = LLMClient(
            llm,
            on_event=on_event or (lambda name, payload: events.append((name, payload))),
            clock=clock,
            sleep=delays.append,
            rand=lambda: 0.0,
        )
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def complete(client: LLMClient, **kwargs: Any) -> Completion:
    return client.complete(MESSAGES, temperature=0.3, max_tokens=500, **kwargs)


def errors(events: Events) -> list[str | None]:
    return [payload["error"] for _name, payload in events]


# ---------------------------------------------------------------------------- retry_delay_s


@pytest.mark.parametrize(
    ("retry_index", "retry_after", "jitter", "expected"),
    [
        (0, None, 0.0, 0.5),
        (1, None, 0.0, 1.0),
        (2, None, 0.0, 2.0),
        (4, None, 0.0, 8.0),
        (5, None, 0.0, 10.0),  # capped
        (10**6, None, 0.0, 10.0),  # no overflow
        (-1, None, 0.0, 0.5),
        (0, None, 0.5, 0.5625),  # jitter adds up to 25% of the backoff
        (0, None, 1.0, 0.625),
        (5, None, 1.0, 12.5),
        (0, None, float("nan"), 0.5),
        (0, "1", 0.0, 1.0),  # Retry-After lengthens the wait
        (0, " 1.5 ", 0.0, 1.5),
        (3, "1", 0.0, 4.0),  # ...but never shortens it
        (0, "0", 0.0, 0.5),
        (0, "120", 0.0, 30.0),  # capped at 30 s
        (0, "Wed, 21 Oct 2015 07:28:00 GMT", 0.0, 0.5),  # HTTP-date ignored
        (0, "soon", 0.0, 0.5),
        (0, "", 0.0, 0.5),
        (0, "-3", 0.0, 0.5),
        (0, "nan", 0.0, 0.5),
        (0, "inf", 0.0, 0.5),
    ],
)
def test_retry_delay_s(
    retry_index: int, retry_after: str | None, jitter: float, expected: float
) -> None:
    """Backoff doubles from 0.5 s to a 10 s cap, jitter adds ≤ 25%, Retry-After ≤ 30 s wins."""
    assert expected == retry_delay_s(retry_index, retry_after, jitter)


# ---------------------------------------------------------------------------- CircuitBreaker


@pytest.mark.parametrize(
    ("steps", "expected_open"),
    [
        ("", False),
        ("FFFF", False),
        ("FFFFF", True),
        ("FFFFSFFFF", False),  # a success resets the count
        ("FFFFF W59", True),
        ("FFFFF W60", False),  # cooldown over: half-open
        ("FFFFF W60 F", True),  # one failure while half-open reopens
        ("FFFFF W60 S F", False),  # a success closes it for good
        ("FFFFF W60 S FFFFF", True),
    ],
)
def test_circuit_breaker(steps: str, expected_open: bool) -> None:
    """Five consecutive failures open the breaker for 60 s; a success resets it."""
    now = [0.0]
    breaker = CircuitBreaker(clock=lambda: now[0])
    for step in steps.split():
        if step.startswith("W"):
            now[0] += float(step[1:])
            continue
        for outcome in step:
            (breaker.record_failure if outcome == "F" else breaker.record_success)("a")
    assert expected_open == breaker.is_open("a")
    assert not breaker.is_open("b")


# ---------------------------------------------------------------------------- retries


def test_retry_after_is_honoured(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], delays: list[float]
) -> None:
    """A 429 with Retry-After: 3 waits 3 s (not the 0.5 s backoff) before the retry succeeds."""
    primary.status(429, headers={"Retry-After": "3"})
    result = complete(make_client(primary))
    assert [3.0] == delays
    assert Completion(DEFAULT_TEXT, "primary-model", primary.base_url, 2, "primary") == result
    assert 2 == len(primary.requests)


def test_server_errors_are_retried_with_backoff(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], delays: list[float]
) -> None:
    """500, 500, 200 succeeds on the third call after waits of 0.5 s and 1 s."""
    primary.status(500, times=2)
    result = complete(make_client(primary))
    assert (3, "primary") == (result.attempts, result.phase)
    assert [0.5, 1.0] == delays


@pytest.mark.parametrize("code", [408, 409, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(
    code: int, primary: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """408, 409, 429 and 5xx are retried on the same endpoint."""
    primary.status(code)
    result = complete(make_client(primary))
    assert (2, "primary", 2) == (result.attempts, result.phase, len(primary.requests))


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
def test_client_errors_go_straight_to_the_fallback(
    code: int,
    primary: FakeOpenAI,
    fallback: FakeOpenAI,
    make_client: Callable[..., LLMClient],
    delays: list[float],
    events: Events,
) -> None:
    """Other 4xx are not retried: the next endpoint answers, in phase "fallback"."""
    primary.status(code)
    result = complete(make_client(primary, fallback))
    assert Completion(DEFAULT_TEXT, "fallback-model-1", fallback.base_url, 2, "fallback") == result
    assert (1, 1) == (len(primary.requests), len(fallback.requests))
    assert [] == delays
    assert ["primary", "fallback"] == [payload["phase"] for _name, payload in events]


def test_stalled_primary_is_abandoned_after_the_timeout(
    primary: FakeOpenAI,
    fallback: FakeOpenAI,
    make_client: Callable[..., LLMClient],
    events: Events,
) -> None:
    """A primary that stalls past timeout_s is given up on, and the fallback answers.

    The stall outlasts the timeout twentyfold: had the client waited it out, the primary's
    answer would have won. Only a lower bound on the wait, which load cannot break.
    """
    primary.stall(MAX_STALL_S)
    client = make_client(primary, fallback, timeout_s=0.5, max_retries=0)
    started = time.monotonic()
    result = complete(client)
    assert time.monotonic() - started >= 0.4
    assert "fallback" == result.phase
    assert ["APITimeoutError", None] == errors(events)


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(lambda s: s.reply("## Done\nhalf a summ", "length"), id="length"),
        pytest.param(lambda s: s.reply("## Done\nnone", "content_filter"), id="content-filter"),
        pytest.param(lambda s: s.tool_call(), id="tool-call"),
        pytest.param(lambda s: s.invalid_json(), id="invalid-json"),
        pytest.param(lambda s: s.reply(""), id="empty"),
        pytest.param(lambda s: s.reply("  \n "), id="blank"),
        pytest.param(lambda s: s.reply(None), id="null-content"),
        pytest.param(lambda s: s.enqueue(Answer(payload={"choices": []})), id="no-choices"),
        pytest.param(
            lambda s: s.enqueue(Answer(raw=b"hello", headers={"Content-Type": "text/plain"})),
            id="not-json",
        ),
    ],
)
def test_bad_replies_are_retried(
    script: Callable[[FakeOpenAI], None],
    primary: FakeOpenAI,
    make_client: Callable[..., LLMClient],
    delays: list[float],
    events: Events,
) -> None:
    """A 200 that is not a finished, tool-free, non-empty text reply is retried."""
    script(primary)
    result = complete(make_client(primary))
    assert (2, DEFAULT_TEXT) == (result.attempts, result.text)
    assert [0.5] == delays
    assert ["BadReply", None] == errors(events)


def test_validate_rejection_is_retried_and_its_cleaned_text_returned(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], events: Events
) -> None:
    """validate() raising SummaryError is a bad reply; its return value becomes the text."""
    primary.reply("no sections at all")
    seen: list[str] = []

    def validate(text: str) -> str:
        seen.append(text)
        if not text.startswith("## "):
            raise SummaryError("fewer than 3 sections")
        return text.upper()

    result = complete(make_client(primary), validate=validate)
    assert ["no sections at all", DEFAULT_TEXT] == seen
    assert (2, DEFAULT_TEXT.upper()) == (result.attempts, result.text)
    assert ["SummaryError", None] == errors(events)


# ---------------------------------------------------------------------------- breaker, failure


def test_five_failures_open_the_breaker(
    primary: FakeOpenAI, fallback: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """After five failed calls the endpoint is skipped without a request until 60 s pass."""
    primary.default = lambda _body: Answer.error(500)
    now = [1000.0]
    client = make_client(primary, fallback, max_retries=10, clock=lambda: now[0])
    first = complete(client)
    assert (6, "fallback", 5) == (first.attempts, first.phase, len(primary.requests))
    with structlog.testing.capture_logs() as logs:
        second = complete(client)
    assert (1, "fallback", 5) == (second.attempts, second.phase, len(primary.requests))
    assert ["circuit_open"] == [
        e["reason"] for e in logs if e["event"] == "summarizer.endpoint_skipped"
    ]
    now[0] += 60.0
    primary.default = lambda _body: DEFAULT_TEXT
    third = complete(client)
    assert (1, "primary", 6) == (third.attempts, third.phase, len(primary.requests))


def test_all_endpoints_down_raise_llm_error(
    primary: FakeOpenAI, fallback: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """When every endpoint fails, LLMError names each one's last error and counts the calls."""
    for server in (primary, fallback):
        server.default = lambda _body: Answer.error(503)
    with pytest.raises(LLMError) as caught:
        complete(make_client(primary, fallback, max_retries=1))
    assert 4 == caught.value.attempts
    text = str(caught.value)
    assert primary.base_url in text
    assert fallback.base_url in text
    assert 2 == text.count("InternalServerError")


def test_missing_key_variable_fails_fast(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset api_key_env makes no request and the error names the variable."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(LLMError) as caught:
        complete(make_client(primary, api_key_env=KEY_ENV))
    assert 0 == caught.value.attempts
    assert KEY_ENV in str(caught.value)
    assert [] == primary.requests


# ---------------------------------------------------------------------------- requests, secrets


def test_requests_carry_no_tools_and_the_sampling_limits(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """The request names the endpoint's model, passes temperature and max_tokens, no tools."""
    make_client(primary).complete(MESSAGES, temperature=0.2, max_tokens=777, purpose="memory")
    (request,) = primary.requests
    assert "/v1/chat/completions" == request.path
    assert {
        "model": "primary-model",
        "messages": MESSAGES,
        "temperature": 0.2,
        "max_tokens": 777,
    } == request.body
    assert "Bearer unused" == request.headers["authorization"]


def test_secret_never_leaks(
    primary: FakeOpenAI,
    fallback: FakeOpenAI,
    make_client: Callable[..., LLMClient],
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key reaches the server but no log, event, repr or error, even when a 401 echoes it."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET} (Bearer {SECRET})"}}
    primary.status(401, body=echo)
    fallback.status(500, body=echo)
    fallback.status(401, body=echo)
    client = make_client(primary, fallback, api_key_env=KEY_ENV, max_retries=1)
    with structlog.testing.capture_logs() as logs, pytest.raises(LLMError) as caught:
        complete(client)
    assert [f"Bearer {SECRET}"] * 3 == [
        r.headers["authorization"] for r in primary.requests + fallback.requests
    ]
    assert 3 == caught.value.attempts
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert "[redacted]" in str(caught.value)
    assert 3 == len([e for e in logs if e["event"] == "summarizer.attempt"])
    for text in (str(caught.value), repr(caught.value), repr(logs), repr(events), repr(client)):
        assert SECRET not in text


def test_credentials_in_the_base_url_are_not_shown(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], events: Events
) -> None:
    """User info and query in base_url never reach Completion.endpoint, events or repr."""
    url = primary.base_url.replace("http://", "http://user:pa55word@")
    client = make_client(primary, base_url=url)
    result = complete(client)
    assert primary.base_url == result.endpoint
    assert primary.base_url == events[0][1]["endpoint"]
    assert "pa55word" not in repr(client)


# ---------------------------------------------------------------------------- events, threads


def test_events_describe_each_attempt(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient], events: Events
) -> None:
    """Each call emits summarizer.attempt and on_event("summary_attempt", …) with its error."""
    primary.status(502)
    with structlog.testing.capture_logs() as logs:
        complete(make_client(primary), purpose="memory")
    common = {
        "phase": "primary",
        "endpoint": primary.base_url,
        "model": "primary-model",
        "purpose": "memory",
    }
    assert [
        ("summary_attempt", {"attempt": 1, **common, "error": "InternalServerError"}),
        ("summary_attempt", {"attempt": 2, **common, "error": None}),
    ] == events
    attempts = [e for e in logs if e["event"] == "summarizer.attempt"]
    assert [("warning", 502, 0.5), ("info", None, None)] == [
        (e["log_level"], e.get("status_code"), e.get("retry_in_s")) for e in attempts
    ]


def test_a_raising_callback_does_not_break_the_call(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """An on_event callback that raises is logged and otherwise ignored."""

    def explode(name: str, payload: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    with structlog.testing.capture_logs() as logs:
        result = complete(make_client(primary, on_event=explode))
    assert DEFAULT_TEXT == result.text
    assert ["summary_attempt"] == [
        e["callback_event"] for e in logs if e["event"] == "summarizer.event_callback_failed"
    ]


def test_one_client_serves_many_threads(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """Concurrent complete() calls on one shared client all succeed."""
    primary.default = lambda body: body["messages"][-1]["content"]
    client = make_client(primary)
    results: dict[int, str] = {}

    def work(n: int) -> None:
        reply = client.complete(
            [{"role": "user", "content": f"thread {n}"}], temperature=0.3, max_tokens=50
        )
        results[n] = reply.text

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {n: f"thread {n}" for n in range(8)} == results
    assert 8 == len(primary.requests)


def test_complete_after_close_fails(
    primary: FakeOpenAI, make_client: Callable[..., LLMClient]
) -> None:
    """close() is idempotent and a closed client refuses new calls."""
    client = make_client(primary)
    complete(client)
    client.close()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        complete(client)
