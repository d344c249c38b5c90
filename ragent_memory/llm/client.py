"""The one retry layer between this library and OpenAI-compatible chat endpoints (docs/design.md §7).
The ``openai`` client has ``max_retries=0``, so stacked retries cannot multiply the wait.
Timeouts, connection errors, HTTP 408/409/429/5xx and bad replies (``_reply_text``, or
``validate`` raising ``SummaryError``) are retried on the same endpoint; any other 4xx or an
unset API-key variable moves on to the next; ``LLMError`` when every one failed. API keys are
read from the environment at call time, sent per request, and scrubbed from all error text."""

from __future__ import annotations

import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Final, Literal, TypeAlias, cast
from urllib.parse import urlsplit, urlunsplit

import attrs
import openai
from openai.types.chat import ChatCompletion

from ragent_memory.core import tracing
from ragent_memory.core.chars import clip
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.errors import LLMError, SummaryError
from ragent_memory.settings import EndpointSettings, LLMSettings

__all__ = ["CircuitBreaker", "Completion", "EventCallback", "LLMClient", "retry_delay_s"]

log = get_logger(__name__)


BACKOFF_BASE_S: Final = 0.5
BACKOFF_CAP_S: Final = 10.0
JITTER_RATIO: Final = 0.25
RETRY_AFTER_CAP_S: Final = 30.0
BREAKER_FAILURES: Final = 5
BREAKER_COOLDOWN_S: Final = 60.0

_RETRYABLE_STATUS: Final = frozenset({408, 409, 429})
# Sent when an endpoint needs no key (local servers): the client insists on some bearer token.
_NO_KEY: Final = "unused"
_DETAIL_MAX_CHARS: Final = 300
_REDACTED: Final = "[redacted]"
_BEARER = re.compile(r"(?i)\bbearer\s+[^\s\"',;}]+")


# Which summarizer an attempt's event comes from: the first endpoint, a later one, or (the
# summary room's) offline summarizer standing in for them all.
Phase: TypeAlias = Literal["primary", "fallback", "offline"]
# Why an endpoint was not asked (``summarizer.endpoint_skipped``).
EndpointSkip: TypeAlias = Literal["circuit_open", "missing_api_key"]


@attrs.frozen
class Completion:
    """A reply that passed every check, and where it came from."""

    text: str
    model: str
    endpoint: str  # base URL without credentials
    attempts: int  # HTTP calls made by this complete(), across endpoints
    phase: Phase  # "primary" or "fallback"


def retry_delay_s(retry_index: int, retry_after: str | None, jitter: float) -> float:
    """Seconds before retry ``retry_index`` (0 = the first) on one endpoint: 0.5 s·2ⁿ capped at
    10 s, plus up to 25% scaled by ``jitter`` (in [0, 1), drawn by the caller so this stays
    pure). A ``Retry-After`` in seconds can lengthen it, to at most 30 s; dates are ignored."""
    exponent = min(max(retry_index, 0), 32)  # 2**n beyond the cap is pointless and can overflow
    backoff = min(BACKOFF_BASE_S * 2.0**exponent, BACKOFF_CAP_S)
    unit = min(max(jitter, 0.0), 1.0) if math.isfinite(jitter) else 0.0
    delay = backoff * (1.0 + JITTER_RATIO * unit)
    hinted = _seconds(retry_after)
    if hinted is not None:
        delay = max(delay, min(hinted, RETRY_AFTER_CAP_S))
    return delay


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class CircuitBreaker:
    """Skips an endpoint for ``cooldown_s`` after ``failures`` consecutive failed requests; then
    half-open: a success closes it, one more failure opens it again. Thread-safe."""

    def __init__(
        self,
        *,
        failures: int = BREAKER_FAILURES,
        cooldown_s: float = BREAKER_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[Hashable, int] = {}
        self._opened_at: dict[Hashable, float] = {}

    def is_open(self, key: Hashable) -> bool:
        """Whether requests to ``key`` should be skipped right now."""
        with self._lock:
            opened_at = self._opened_at.get(key)
            return opened_at is not None and self._clock() - opened_at < self._cooldown_s

    def open_for_s(self, key: Hashable) -> float:
        """Seconds ``key`` stays skipped (0.0: it may be asked now)."""
        with self._lock:
            opened_at = self._opened_at.get(key)
            if opened_at is None:
                return 0.0
            return max(self._cooldown_s - (self._clock() - opened_at), 0.0)

    def record_success(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)
            self._opened_at.pop(key, None)

    def record_failure(self, key: Hashable) -> bool:
        """Count a failed request; whether the breaker is open now."""
        with self._lock:
            count = self._failures.get(key, 0) + 1
            self._failures[key] = count
            if count >= self._threshold:
                self._opened_at[key] = self._clock()
            return count >= self._threshold


class _BadReply(Exception):
    """The endpoint answered 200 with something that is not a usable text reply."""


@attrs.frozen
class _Failure:
    error: str  # an exception class name, for events
    detail: str  # scrubbed and clipped
    is_retryable: bool
    status_code: int | None = None
    retry_after: str | None = None


@attrs.frozen
class _Request:
    """One ``complete`` call: what to send, how to check the reply, what to hide."""

    messages: list[dict[str, str]]
    temperature: float
    max_tokens: int
    validate: Callable[[str], str] | None
    purpose: str
    secrets: tuple[str, ...]  # every configured key that is set, scrubbed from all error text
    # A reply cut by the token limit (finish reason ``length``) goes to ``partial``, which
    # returns what of it stands or raises ``SummaryError``; None: such a reply is a bad one.
    partial: Callable[[str], str] | None = None
    stop: tuple[str, ...] = ()  # stop sequences sent (an endpoint returns the text before one)


@attrs.frozen
class _GaveUp:
    """An endpoint that gave no usable reply."""

    attempts: int  # HTTP calls made by this complete() so far, this endpoint's included
    reason: str  # scrubbed, for the LLMError


class LLMClient:
    """Chat completions over ``settings.endpoints`` in order, with retries and a breaker; shared
    by threads. :meth:`close` (or ``with``) releases the HTTP connection pools."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        on_event: EventCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._settings = settings
        self._on_event = on_event
        self._sleep = sleep
        self._rand = rand
        self._breaker = CircuitBreaker(clock=clock)
        self._lock = threading.Lock()
        self._clients: dict[str, openai.OpenAI] = {}
        self._is_closed = False

    def __repr__(self) -> str:
        endpoints = ", ".join(
            f"{e.model}@{_public_url(e.base_url)}" for e in self._settings.endpoints
        )
        return f"LLMClient(endpoints=[{endpoints}])"

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every HTTP connection pool. Idempotent; ``complete`` fails afterwards."""
        with self._lock:
            self._is_closed = True
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def cooling_down(self) -> float | None:
        """Seconds until the first endpoint may be asked again when every one is skipped by
        its breaker now, else None (some endpoint would be asked)."""
        waits = [
            self._breaker.open_for_s((endpoint.base_url, endpoint.model))
            for endpoint in self._settings.endpoints
        ]
        return min(waits) if all(waits) else None

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        validate: Callable[[str], str] | None = None,
        purpose: str = "summary",
        partial: Callable[[str], str] | None = None,
        stop: tuple[str, ...] = (),
    ) -> Completion:
        """The first reply that passes the checks and ``validate``; ``LLMError`` when none does.
        ``validate`` returns the (cleaned) text or raises ``SummaryError``, a bad reply;
        ``partial`` does the same for a reply cut by ``max_tokens`` (else one is bad)."""
        if self._is_closed:
            raise RuntimeError("LLMClient is closed")
        endpoints = self._settings.endpoints
        keys = [_api_key(endpoint) for endpoint in endpoints]
        secrets = tuple(key for key in keys if key is not None and key != _NO_KEY)
        request = _Request(
            messages, temperature, max_tokens, validate, purpose, secrets, partial, tuple(stop)
        )
        attempts = 0
        reasons: list[str] = []
        for index, (endpoint, api_key) in enumerate(zip(endpoints, keys, strict=True)):
            phase: Phase = "primary" if index == 0 else "fallback"
            outcome = self._ask(endpoint, api_key, phase, request, attempts)
            if isinstance(outcome, Completion):
                return outcome
            attempts = outcome.attempts
            reasons.append(outcome.reason)
        # Not chained: the underlying error holds the request (with its Authorization header)
        # and may quote a server that echoed the key; the scrubbed reasons are the record.
        raise LLMError(
            f"every LLM endpoint failed after {attempts} attempt(s): " + "; ".join(reasons),
            attempts=attempts,
        ) from None

    def _ask(
        self,
        endpoint: EndpointSettings,
        api_key: str | None,
        phase: Phase,
        request: _Request,
        attempts: int,
    ) -> Completion | _GaveUp:
        """One endpoint, retried while its failures are transient and its breaker closed."""
        url = _public_url(endpoint.base_url)
        where = f"{url} ({endpoint.model})"
        breaker_key = (endpoint.base_url, endpoint.model)
        if self._breaker.is_open(breaker_key):
            self._log_skip(endpoint, request.purpose, "circuit_open")
            return _GaveUp(attempts, f"{where}: skipped, circuit open")
        if api_key is None:
            self._log_skip(endpoint, request.purpose, "missing_api_key")
            reason = f"environment variable {endpoint.api_key_env} is not set or empty"
            return _GaveUp(attempts, f"{where}: {reason}")
        retry_index = 0
        while True:
            attempts += 1
            outcome = self._call(endpoint, api_key, request)
            if isinstance(outcome, str):
                self._breaker.record_success(breaker_key)
                self._report(attempts, phase, endpoint, request.purpose, None, None)
                return Completion(outcome, endpoint.model, url, attempts, phase)
            is_open = self._breaker.record_failure(breaker_key)
            is_retried = outcome.is_retryable and retry_index < self._settings.max_retries
            delay_s = (
                retry_delay_s(retry_index, outcome.retry_after, self._rand())
                if is_retried and not is_open
                else None
            )
            self._report(attempts, phase, endpoint, request.purpose, outcome, delay_s)
            if delay_s is None:
                return _GaveUp(attempts, f"{where}: {outcome.error}: {outcome.detail}")
            self._sleep(delay_s)
            retry_index += 1

    def _client(self, base_url: str) -> openai.OpenAI:
        with self._lock:
            if self._is_closed:
                raise RuntimeError("LLMClient is closed")
            client = self._clients.get(base_url)
            if client is None:
                client = openai.OpenAI(
                    base_url=base_url,
                    api_key=_NO_KEY,  # the real key goes in a per-request header
                    max_retries=0,  # this module is the only retry layer
                    timeout=self._settings.timeout_s,
                )
                self._clients[base_url] = client
            return client

    def _call(self, endpoint: EndpointSettings, api_key: str, request: _Request) -> str | _Failure:
        """One HTTP call, in a span when the app traces (the ``gen_ai.*`` conventions)."""
        parts = urlsplit(endpoint.base_url)
        values = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": endpoint.model,
            "gen_ai.request.temperature": request.temperature,
            "gen_ai.request.max_tokens": request.max_tokens,
            "server.address": parts.hostname,
            "server.port": parts.port,
            "ragent_memory.purpose": request.purpose,
        }
        with tracing.span(f"chat {endpoint.model}", values, client=True) as span:
            outcome = self._send(endpoint, api_key, request, span)
            if isinstance(outcome, _Failure):
                tracing.failed(span, outcome.error, outcome.detail)
            return outcome

    def _send(
        self, endpoint: EndpointSettings, api_key: str, request: _Request, span: Any
    ) -> str | _Failure:
        """One HTTP call: the accepted text, or what went wrong."""
        optional: dict[str, Any] = {"stop": list(request.stop)} if request.stop else {}
        try:
            reply = self._client(endpoint.base_url).chat.completions.create(
                model=endpoint.model,
                messages=cast(Any, request.messages),  # plain dicts, not the SDK's TypedDicts
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                extra_headers={"Authorization": f"Bearer {api_key}"},
                **optional,
            )
        except openai.APIStatusError as err:
            status, retry_after = err.status_code, err.response.headers.get("retry-after")
            is_retryable = status in _RETRYABLE_STATUS or status >= 500
            detail = _detail(str(err), request.secrets)
            return _Failure(type(err).__name__, detail, is_retryable, status, retry_after)
        except openai.OpenAIError as err:  # timeouts, connection errors, anything else
            return _Failure(type(err).__name__, _detail(str(err), request.secrets), True)
        except ValueError as err:  # a 200 whose JSON body does not parse
            return _Failure("BadReply", f"unparseable body ({type(err).__name__})", True)
        tracing.annotate(span, _reply_attributes(reply))
        try:
            # A server may echo the key inside a valid reply: scrub it before anything keeps
            # the text (summaries, facts, the audit, logs).
            text, finish_reason = _reply_text(reply, is_partial_ok=request.partial is not None)
            text = _scrub(text, request.secrets)
            check = request.partial if finish_reason == "length" else request.validate
            return check(text) if check is not None else text
        except _BadReply as err:
            return _Failure("BadReply", str(err), True)
        except SummaryError as err:
            return _Failure(type(err).__name__, _detail(err.reason, request.secrets), True)

    def _report(
        self,
        attempt: int,
        phase: Phase,
        endpoint: EndpointSettings,
        purpose: str,
        failure: _Failure | None,
        retry_in_s: float | None,
    ) -> None:
        fields: dict[str, Any] = {
            "attempt": attempt,
            "phase": phase,
            "endpoint": _public_url(endpoint.base_url),
            "model": endpoint.model,
            "error": None if failure is None else failure.error,
            "purpose": purpose,
        }
        if failure is None:
            log.info("summarizer.attempt", **fields)
        else:
            extra = {"status_code": failure.status_code, "detail": failure.detail}
            log.warning("summarizer.attempt", **fields, **extra, retry_in_s=retry_in_s)
        self._emit("summary_attempt", fields)

    def _log_skip(self, endpoint: EndpointSettings, purpose: str, reason: EndpointSkip) -> None:
        log.warning(
            "summarizer.endpoint_skipped",
            endpoint=_public_url(endpoint.base_url),
            model=endpoint.model,
            reason=reason,
            api_key_env=endpoint.api_key_env,
            purpose=purpose,
        )

    def _emit(self, name: str, payload: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(name, dict(payload))
        except Exception as err:  # an observer's bug must not fail the summary it observes
            log.warning("summarizer.event_callback_failed", callback_event=name, error=repr(err))


def _api_key(endpoint: EndpointSettings) -> str | None:
    """The key to send, ``None`` when its variable is unset or empty."""
    if endpoint.api_key_env is None:
        return _NO_KEY
    return os.environ.get(endpoint.api_key_env) or None


def _reply_attributes(reply: object) -> dict[str, Any]:
    """The ``gen_ai.*`` attributes of a reply: its model, id, finish reasons, token usage
    (when the endpoint returns it), each read warily (a body may be anything)."""
    usage = getattr(reply, "usage", None)
    choices = getattr(reply, "choices", None)
    reasons = [
        str(r)
        for r in (getattr(c, "finish_reason", None) for c in (choices or ()))
        if r is not None
    ]
    values = {
        "gen_ai.response.model": getattr(reply, "model", None),
        "gen_ai.response.id": getattr(reply, "id", None),
        "gen_ai.response.finish_reasons": reasons or None,
        "gen_ai.usage.input_tokens": getattr(usage, "prompt_tokens", None),
        "gen_ai.usage.output_tokens": getattr(usage, "completion_tokens", None),
    }
    return {k: v for k, v in values.items() if isinstance(v, str | int | list)}


def _reply_text(reply: object, *, is_partial_ok: bool = False) -> tuple[str, str]:
    """The text and finish reason of the first choice, or ``_BadReply`` saying why there is
    none (finish reason ``length`` passes when ``is_partial_ok``). The SDK does not validate
    responses (a non-JSON body comes back as a ``str``): every field is read warily."""
    if not isinstance(reply, ChatCompletion):
        raise _BadReply("the body is not a chat completion")
    choices = getattr(reply, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise _BadReply("the reply has no choices")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if getattr(message, "tool_calls", None) or getattr(message, "function_call", None):
        raise _BadReply("the reply calls tools")
    finish_reason = getattr(choice, "finish_reason", None)
    if finish_reason != "stop" and not (is_partial_ok and finish_reason == "length"):
        raise _BadReply(f"finish reason is {finish_reason!r}, not 'stop'")
    content = getattr(message, "content", None)
    if not isinstance(content, str) or not content.strip():
        raise _BadReply("the reply is empty")
    return content, finish_reason


def _public_url(url: str) -> str:
    """``url`` without user info, query or fragment: nothing that can carry a credential."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid url>"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _detail(text: str, secrets: tuple[str, ...]) -> str:
    """An error text fit for logs and ``LLMError``: no key, at most 300 chars."""
    return clip(_scrub(text, secrets), _DETAIL_MAX_CHARS)


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return _BEARER.sub(f"Bearer {_REDACTED}", text)
