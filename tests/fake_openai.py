"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

    with FakeOpenAI() as server:
        server.status(429, headers={"Retry-After": "1"})
        server.reply("## Done\\nnone")
        ...  # point a client at server.base_url

Each ``POST /v1/chat/completions`` is recorded in ``server.requests`` and answered by the next
scripted :class:`Answer`; when the script is empty, by ``server.default(body)``, a callable
returning the reply text or an ``Answer`` (so a test can echo a valid summary). Tests use the
``fake_openai`` fixture or the context manager; closing interrupts stalls and joins every thread.

``Answer.stream(events, hold=…, finished=…)`` answers with an SSE stream written event by event;
it can wait for a ``threading.Event`` after the first events (bounded, cut short by close), so a
test can prove that a client saw them before the stream finished. ``GET /v1/models`` answers a
fixed model list.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

import pytest

CHAT_PATH = "/v1/chat/completions"
# Answered from the script too: the Anthropic Messages and OpenAI Responses routes.
# Their answers are sent as scripted (only a chat completion gets id/object/model filled in).
PATHS = frozenset({CHAT_PATH, "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"})
MAX_STALL_S = 10.0

DEFAULT_TEXT = "\n".join(
    f"## {title}\nnone"
    for title in (
        "User requests",
        "To-do",
        "Next step",
        "Current progress",
        "Tools and findings",
        "Dead ends",
        "Done",
    )
)


@dataclass(frozen=True)
class Answer:
    """One scripted HTTP answer. Build with the class methods."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    payload: Any = None  # JSON-encoded unless ``raw`` is set
    raw: bytes | None = None
    stall_s: float = 0.0
    then: Answer | None = None  # what a stall answers with; None = the default answer
    events: tuple[bytes, ...] = ()  # an SSE stream, written event by event
    hold: threading.Event | None = None  # the stream waits for it after ``hold_after`` events
    hold_after: int = 1
    finished: threading.Event | None = None  # set once the whole stream is written

    @classmethod
    def stream(
        cls,
        events: Sequence[bytes],
        *,
        hold: threading.Event | None = None,
        hold_after: int = 1,
        finished: threading.Event | None = None,
    ) -> Answer:
        return cls(events=tuple(events), hold=hold, hold_after=hold_after, finished=finished)

    @classmethod
    def reply(
        cls,
        text: str | None,
        finish_reason: str = "stop",
        *,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> Answer:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls is not None:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "finish_reason": finish_reason}
        return cls(payload={"choices": [choice]})

    @classmethod
    def error(
        cls, code: int, *, headers: Mapping[str, str] | None = None, body: Any = None
    ) -> Answer:
        if body is None:
            body = {"error": {"message": f"scripted {code}", "type": "fake", "code": code}}
        return cls(status=code, headers=dict(headers or {}), payload=body)

    @classmethod
    def tool_call(cls, name: str = "search_knowledge", arguments: str = "{}") -> Answer:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return cls.reply(None, "tool_calls", tool_calls=[call])

    @classmethod
    def invalid_json(cls) -> Answer:
        return cls(raw=b'{"choices": [', headers={"Content-Type": "application/json"})


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None when the body is not JSON


class LoopbackServer:
    """An HTTP server on 127.0.0.1 (a free port) serving ``handler`` on its own thread until
    ``close``; a context manager. ``_closing`` is set first, so slow answers can stop early."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()  # joins the handler threads
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class FakeOpenAI(LoopbackServer):
    """A local chat-completions endpoint answering from a script. See the module docstring."""

    def __init__(self, default: Callable[[Any], str | Answer] | None = None) -> None:
        self.default: Callable[[Any], str | Answer] = default or (lambda _body: DEFAULT_TEXT)
        self.requests: list[RecordedRequest] = []
        self._script: collections.deque[Answer] = collections.deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        super().__init__(_handler_for(self))

    # ---- script
    def enqueue(self, answer: Answer, times: int = 1) -> None:
        with self._lock:
            self._script.extend([answer] * times)

    def reply(self, text: str | None, finish_reason: str = "stop", *, times: int = 1) -> None:
        self.enqueue(Answer.reply(text, finish_reason), times)

    def status(
        self,
        code: int,
        *,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        times: int = 1,
    ) -> None:
        self.enqueue(Answer.error(code, headers=headers, body=body), times)

    def stall(self, seconds: float, then: Answer | None = None) -> None:
        """Wait ``seconds`` (at most ``MAX_STALL_S``, cut short by close) before answering."""
        self.enqueue(Answer(stall_s=min(seconds, MAX_STALL_S), then=then))

    def invalid_json(self) -> None:
        self.enqueue(Answer.invalid_json())

    def tool_call(self, name: str = "search_knowledge") -> None:
        self.enqueue(Answer.tool_call(name))

    def reset(self) -> None:
        """Forget the script, the recorded requests and any custom default answer."""
        with self._lock:
            self._script.clear()
            self.requests.clear()
        self.default = lambda _body: DEFAULT_TEXT

    # ---- serving (handler threads)
    def _next_answer(self, body: Any) -> Answer:
        with self._lock:
            answer = self._script.popleft() if self._script else None
        return answer if answer is not None else self._default_answer(body)

    def _default_answer(self, body: Any) -> Answer:
        answer = self.default(body)
        return Answer.reply(answer) if isinstance(answer, str) else answer

    def _respond(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        data = handler.rfile.read(length)
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            self.requests.append(RecordedRequest(handler.path, headers, body))
        route = handler.path.split("?", 1)[0]  # Claude Code's ?beta=true included
        answer = self._next_answer(body) if route in PATHS else Answer.error(404)
        if answer.stall_s:
            if self._closing.wait(answer.stall_s):
                return  # shutting down: drop the connection unanswered
            answer = answer.then or self._default_answer(body)
        self._send(handler, answer, body, chat=route == CHAT_PATH)

    def _send(
        self, handler: BaseHTTPRequestHandler, answer: Answer, body: Any, *, chat: bool = True
    ) -> None:
        if answer.events:
            self._send_stream(handler, answer)
            return
        payload = answer.payload
        if chat and answer.raw is None and answer.status == 200 and isinstance(payload, dict):
            model = body.get("model") if isinstance(body, dict) else None
            payload = {
                "id": f"chatcmpl-fake-{next(self._ids)}",
                "object": "chat.completion",
                "created": 0,
                "model": model or "fake-model",
                **payload,
            }
        content = answer.raw if answer.raw is not None else json.dumps(payload).encode()
        handler.send_response(answer.status)
        headers = {"Content-Type": "application/json", **answer.headers}
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def _send_stream(self, handler: BaseHTTPRequestHandler, answer: Answer) -> None:
        """Headers, then each event flushed on its own; the connection closes at the end
        (HTTP/1.0, no Content-Length)."""
        handler.send_response(answer.status)
        for name, value in {"Content-Type": "text/event-stream", **answer.headers}.items():
            handler.send_header(name, value)
        handler.end_headers()
        for number, event in enumerate(answer.events):
            if answer.hold is not None and number == answer.hold_after:
                waited = 0.0
                while not answer.hold.wait(0.05) and waited < MAX_STALL_S:
                    if self._closing.is_set():
                        return
                    waited += 0.05
            handler.wfile.write(event)
            handler.wfile.flush()
        if answer.finished is not None:
            answer.finished.set()

    def _models(self, handler: BaseHTTPRequestHandler) -> None:
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            self.requests.append(RecordedRequest(handler.path, headers, None))
        found = handler.path == "/v1/models"
        payload = (
            {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "t"}]}
            if found
            else {"error": {"message": "not found", "type": "fake", "code": 404}}
        )
        self._send(handler, Answer(status=200 if found else 404, payload=payload), None)


def sse_events(
    pieces: Sequence[str] = (), *, tool_calls: Sequence[tuple[str, str]] = (), chunk_id: str = "s"
) -> list[bytes]:
    """An OpenAI-style chat-completion stream: a role chunk, one chunk per text piece, one per
    tool call ``(name, arguments)``, a finish chunk and ``[DONE]``."""

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": f"chatcmpl-{chunk_id}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": piece}) for piece in pieces]
    for index, (name, arguments) in enumerate(tool_calls):
        call = {
            "index": index,
            "id": f"call_{chunk_id}_{index}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        events.append(event({"tool_calls": [call]}))
    events.append(event({}, "tool_calls" if tool_calls else "stop"))
    events.append(b"data: [DONE]\n\n")
    return events


def _handler_for(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            # The client may give up (timeout) before the answer: nothing left to tell it.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                server._respond(self)

        def do_GET(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                server._models(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running FakeOpenAI, closed after the test."""
    with FakeOpenAI() as server:
        yield server
