"""OpenTelemetry spans, for an app that uses OpenTelemetry.

The library never imports OpenTelemetry: an app that configures a tracer provider has imported
``opentelemetry.trace`` already, so a span is made only when that module is loaded, through the
global provider the app set (the API's own no-op provider when it set none). Without it each
call below is one dictionary look-up and emits nothing.

Span names: ``ragent_memory.prepare``, ``ragent_memory.compaction``, ``ragent_memory.recall``
(a turn's recall block) and ``ragent_memory.search`` (``search_memory``); a model call is
``{gen_ai.operation.name} {gen_ai.request.model}`` with the ``gen_ai.*`` attributes of the
OpenTelemetry semantic conventions for generative AI.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

TRACER_NAME: Final = "ragent_memory"
PREFIX: Final = "ragent_memory."

T = TypeVar("T")


def _trace() -> Any:
    """The OpenTelemetry trace API when the app has loaded it, else None."""
    return sys.modules.get("opentelemetry.trace")


def is_tracing() -> bool:
    return _trace() is not None


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as span attributes: None dropped, tuples as lists, anything else not a
    bool, int, float or str as its text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, list | tuple):
            out[key] = [v if isinstance(v, bool | int | float | str) else str(v) for v in value]
        elif isinstance(value, bool | int | float | str):
            out[key] = value
        else:
            out[key] = str(value)
    return out


@contextmanager
def span(
    name: str, values: Mapping[str, Any] | None = None, *, client: bool = False
) -> Iterator[Any]:
    """A span named ``name`` around the block, current inside it (None when not tracing); an
    exception leaving the block is recorded on it and marks it an error."""
    trace = _trace()
    if trace is None:
        yield None
        return
    kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes(values or {})) as s:
        yield s


def annotate(current: Any, values: Mapping[str, Any]) -> None:
    """Add ``values`` to the span ``span`` yielded (nothing when it yielded None)."""
    if current is not None:
        current.set_attributes(attributes(values))


def failed(current: Any, error_type: str, description: str = "") -> None:
    """Mark the span an error without an exception (a model call that got a bad reply)."""
    trace = _trace()
    if current is None or trace is None:
        return
    current.set_attribute("error.type", error_type)
    current.set_status(trace.Status(trace.StatusCode.ERROR, description[:200]))


def carried(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` run, on whatever thread, inside the span context current here: work an
    engine hands to a pool (a compaction) joins the turn that started it."""
    if _trace() is None:
        return function
    return functools.partial(contextvars.copy_context().run, function)


@contextmanager
def joined(headers: Mapping[str, str]) -> Iterator[None]:
    """The block inside the caller's trace, as its ``traceparent`` header names it (W3C
    trace context, through the app's configured propagator)."""
    if _trace() is None or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)
