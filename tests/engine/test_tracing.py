"""OpenTelemetry spans: with the SDK's in-memory exporter behind the app's tracer provider,
`prepare`, each compaction, each model call (the gen_ai.* conventions) and recall searches
are spans with the right names, parents and attributes; the proxy joins the caller's trace;
without OpenTelemetry loaded, nothing is imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import Answer, FakeOpenAI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sessions import ROOT
from starlette.testclient import TestClient

from ragent_memory import LLMSettings, MemoryEngine, Settings, StoreSettings
from ragent_memory.settings import ServeSettings
from ragent_memory.summary.prompt import SECTIONS

MODEL = "summary-model"
KEY_ENV = "RAGENT_TRACING_TEST_KEY"
BODY = "\n".join(f"{title}\n- written by the model" for title in SECTIONS["en"])
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The app's tracer provider, set once for this module (the API allows one per process)
    and shut down after it, so later tests export nothing."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    yield memory
    provider.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


def _model_answer(_body: Any) -> Answer:
    """A summary with the token usage an endpoint reports."""
    answer = Answer.reply(BODY)
    usage = {"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366}
    return Answer(payload={**answer.payload, "usage": usage})


def _turns(count: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for n in range(count):
        history += [
            {"role": "user", "content": f"Look up order ORD-{1000 + n} for the harbour office."},
            {"role": "assistant", "content": f"Order ORD-{1000 + n} shipped. " * 40},
        ]
    history.append({"role": "user", "content": "Which orders shipped?"})
    return history


def _named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_prepare_is_a_span_with_the_turn_report(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """Each prepare is one span carrying the TurnReport's fields and B."""
    settings = Settings(
        context_window_chars=60_000, store=StoreSettings(path=str(tmp_path / "t.db"))
    )
    with MemoryEngine(settings) as engine:
        report = engine.prepare(_turns(2), session_id="s1", user_id="u1").report
    (span,) = _named(spans, "ragent_memory.prepare")
    attributes = dict(span.attributes or {})
    assert "s1" == attributes["ragent_memory.session_id"]
    assert 60_000 == attributes["ragent_memory.budget_chars"]
    assert report.chars_out == attributes["ragent_memory.chars_out"]
    assert report.chars_raw == attributes["ragent_memory.chars_raw"]
    assert report.compacted is attributes["ragent_memory.compacted"]
    assert "ragent_memory.skipped_reason" not in attributes  # None is left out


def test_compaction_and_model_call_nest_under_prepare(
    spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction a turn waits for is a child of its prepare span, and the summarizer's
    model call a child of the compaction with the gen_ai.* attributes the reply gives."""
    monkeypatch.setenv(KEY_ENV, "sk-tracing")
    with FakeOpenAI(_model_answer) as model:
        settings = Settings(
            context_window_chars=12_000,
            store=StoreSettings(path=str(tmp_path / "t.db")),
            llm=LLMSettings(base_url=model.base_url, model=MODEL, api_key_env=KEY_ENV),
        )
        with MemoryEngine(settings) as engine:
            report = engine.prepare(_turns(14), session_id="s1", user_id="u1").report
    assert report.compacted
    (prepare,) = _named(spans, "ragent_memory.prepare")
    (compaction,) = _named(spans, "ragent_memory.compaction")
    calls = _named(spans, f"chat {MODEL}")
    assert calls
    assert compaction.parent is not None and prepare.context is not None
    assert prepare.context.span_id == compaction.parent.span_id
    assert prepare.context.trace_id == compaction.context.trace_id
    call = calls[0]
    assert call.parent is not None and compaction.context is not None
    assert compaction.context.span_id == call.parent.span_id
    assert trace.SpanKind.CLIENT == call.kind
    attributes = dict(call.attributes or {})
    assert "chat" == attributes["gen_ai.operation.name"]
    assert MODEL == attributes["gen_ai.request.model"]
    assert 321 == attributes["gen_ai.usage.input_tokens"]
    assert 45 == attributes["gen_ai.usage.output_tokens"]
    assert ("stop",) == tuple(attributes["gen_ai.response.finish_reasons"])
    assert "summary" == attributes["ragent_memory.purpose"]
    generation = dict(compaction.attributes or {})
    assert 1 == generation["ragent_memory.generation"]
    assert generation["ragent_memory.covered_to"] > generation["ragent_memory.covered_from"]
    assert "model" == generation["ragent_memory.written_by"]


def test_a_failed_model_call_is_an_error_span(
    spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply the client refuses marks its span an error with error.type."""
    monkeypatch.setenv(KEY_ENV, "sk-tracing")
    with FakeOpenAI(lambda _body: Answer.error(400)) as model:
        settings = Settings(
            context_window_chars=12_000,
            store=StoreSettings(path=str(tmp_path / "t.db")),
            llm=LLMSettings(
                base_url=model.base_url, model=MODEL, api_key_env=KEY_ENV, max_retries=0
            ),
        )
        with MemoryEngine(settings) as engine:
            engine.prepare(_turns(14), session_id="s1", user_id="u1")
    call = _named(spans, f"chat {MODEL}")[0]
    assert trace.StatusCode.ERROR == call.status.status_code
    assert "BadRequestError" == dict(call.attributes or {})["error.type"]


def test_a_search_is_a_span(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """search_memory is a span with its size and what it found, not the user's words."""
    settings = Settings(
        context_window_chars=60_000, store=StoreSettings(path=str(tmp_path / "t.db"))
    )
    with MemoryEngine(settings) as engine:
        history = _turns(3)
        engine.prepare(history, session_id="s1", user_id="u1")
        engine.after_turn(history, session_id="s1", user_id="u1")
        assert engine.flush(timeout_s=60)
        engine.search("s1", "harbour office order", user_id="u1")
    (span,) = _named(spans, "ragent_memory.search")
    attributes = dict(span.attributes or {})
    assert len("harbour office order") == attributes["ragent_memory.query_chars"]
    assert attributes["ragent_memory.excerpts"] >= 1
    assert "harbour" not in str(attributes)


def test_the_proxy_joins_the_callers_trace(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    """A request with a traceparent header: the proxy's prepare span is in that trace, a child
    of the caller's span."""
    with FakeOpenAI() as upstream:
        from ragent_memory.serve.app import create_app

        settings = Settings(
            context_window_chars=60_000,
            store=StoreSettings(path=str(tmp_path / "t.db")),
            serve=ServeSettings(upstream=upstream.base_url),
        )
        headers = {
            "Authorization": "Bearer sk-caller",
            "X-Session-Id": "s1",
            "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
        }
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        with TestClient(create_app(settings)) as client:
            reply = client.post("/v1/chat/completions", json=body, headers=headers)
        assert 200 == reply.status_code, reply.text
    (prepare,) = _named(spans, "ragent_memory.prepare")
    assert prepare.context is not None and prepare.parent is not None
    assert int(TRACE_ID, 16) == prepare.context.trace_id
    assert int(PARENT_ID, 16) == prepare.parent.span_id


def test_nothing_is_imported_without_opentelemetry_loaded(tmp_path: Path) -> None:
    """An app that does not use OpenTelemetry never loads it: importing the package and
    running a turn leave it out of sys.modules."""
    script = (
        "import sys\n"
        "from ragent_memory import MemoryEngine, Settings, StoreSettings\n"
        f"s = Settings(context_window_chars=60_000, store=StoreSettings(path={str(tmp_path / 'x.db')!r}))\n"
        "with MemoryEngine(s) as e:\n"
        "    e.prepare([{'role': 'user', 'content': 'hi'}], session_id='s')\n"
        "    e.search('s', 'hi')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == result.returncode, result.stderr
    assert "[]" == result.stdout.strip()
