"""The OpenAI chat-completions wire format, as the proxy reads and writes it: which session a
request belongs to, its body, the proxy's own tool calls found and cut out of a reply (whole
or streamed), the report headers and the error shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import orjson
from starlette.responses import Response

from ragent_memory.core.chars import Message
from ragent_memory.serve.http import RawHeaders, Reject, whole_response
from ragent_memory.serve.wire import Translations, dumped_object, json_object

if TYPE_CHECKING:
    from ragent_memory.engine.memory_engine import TurnReport

NO_SESSION = (
    "no session id: send the X-Session-Id header (or set the request's user field) "
    "so the proxy knows which conversation this is"
)


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> Response:
    """An OpenAI-shaped error on one line: the openai client shows ``message``."""
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n"
    return whole_response(status, [(b"content-type", b"application/json"), *headers], body)


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a dict with a ``messages`` list, or a 400 ``Reject`` saying what is wrong."""
    body = json_object(raw)
    if not isinstance(body.get("messages"), list):
        raise Reject(400, "malformed body: 'messages' must be a list of chat messages")
    return body


def identify(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(session_id, user_id)`` of a request: headers first, then the ``user`` field."""
    user_field = body.get("user") if isinstance(body.get("user"), str) else None
    session_id = headers.get("x-session-id") or user_field
    if not session_id:
        raise Reject(400, NO_SESSION)
    return session_id, headers.get("x-user-id") or user_field


def report_headers(report: TurnReport, rounds: int) -> dict[str, str]:
    """Every figure of the ``TurnReport`` as an ``X-Ragent-*`` header (``chars_in`` →
    ``X-Ragent-Chars-In``), plus the tool rounds the proxy answered itself."""
    headers = {}
    for field in attrs.fields(type(report)):
        value = getattr(report, field.name)
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        headers["X-Ragent-" + "-".join(p.capitalize() for p in field.name.split("_"))] = text
    headers["X-Ragent-Tool-Rounds"] = str(rounds)
    return headers


def report_raw(report: TurnReport, rounds: int) -> RawHeaders:
    items = report_headers(report, rounds).items()
    return [(name.lower().encode(), value.encode("latin-1")) for name, value in items]


def call_name(call: Any) -> Any:
    """The function name of a tool call or a tool declaration (None when it has none)."""
    function = call.get("function") if isinstance(call, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def declared_tools(body: Mapping[str, Any]) -> set[str]:
    """The names of the tools the app declares itself."""
    tools = body.get("tools") or ()
    return {name for tool in tools if isinstance(name := call_name(tool), str)}


def pins_tools(body: Mapping[str, Any]) -> bool:
    """The app pins ``tool_choice`` or uses the legacy ``functions``: no tools are added."""
    choice = body.get("tool_choice")
    return choice == "none" or isinstance(choice, dict) or "functions" in body


def split_calls(
    message: Mapping[str, Any], own: Mapping[str, Any]
) -> tuple[list[Message], list[Message]]:
    """The message's tool calls: (the proxy's own, the app's)."""
    calls = message.get("tool_calls") or ()
    return [c for c in calls if call_name(c) in own], [c for c in calls if call_name(c) not in own]


def strip_own_calls(data: dict[str, Any], own: Mapping[str, Any]) -> bool:
    """Remove the proxy-tool calls from every choice of a completion; True if any was."""
    stripped = False
    for choice in data.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        mine, theirs = split_calls(message, own)
        if not mine:
            continue
        stripped = True
        if theirs:
            message["tool_calls"] = theirs
        else:
            message.pop("tool_calls", None)
            if message.get("content") is None:
                message["content"] = ""
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
    return stripped


def first_message(data: Any) -> Message | None:
    """The assistant message of choice 0 (the one the app keeps, as SDKs do)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    return message if isinstance(message, dict) else None


def only_message(data: Any) -> Message | None:
    """The assistant message of a one-choice completion."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return first_message(data) if isinstance(choices, list) and len(choices) == 1 else None


def json_or_none(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def deltas(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``delta`` of each choice of index 0 in a chunk (the proxy follows that one only)."""
    out = []
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out.append(delta)
    return out


class ReplyBuilder:
    """Accumulates the deltas of choice 0 into the assistant message they spell."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for delta in deltas(chunk):
            content = delta.get("content")
            if isinstance(content, str):
                self._text.append(content)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._add_call(call)

    def _add_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self._calls))
        slot = self._calls.setdefault(
            index if isinstance(index, int) else len(self._calls),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if isinstance(call.get("id"), str):
            slot["id"] = call["id"]
        function = call.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    slot["function"][key] += function[key]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        elif message["content"] is None:
            message["content"] = ""
        return message


def verdict(chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
    """Whose reply a stream is, from its first substantive delta: ``"own"`` when it calls a
    proxy tool, ``"pass"`` for anything else; None while nothing has been said yet."""
    for delta in deltas(chunk):
        for call in delta.get("tool_calls") or ():
            if name := call_name(call):
                return "own" if name in own else "pass"
        for key, value in delta.items():
            if key not in ("role", "tool_calls") and value not in (None, "", [], {}):
                return "pass"  # text, a refusal, reasoning: the app's reply has begun
    return None


def has_substance(chunk: Mapping[str, Any]) -> bool:
    """A chunk worth sending once the proxy's calls are cut out of it."""
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and (choice.get("finish_reason") or choice.get("delta")):
            return True
    return False


class CallCutter:
    """Cuts the deltas of proxy-tool calls out of one stream's chunks, remembering which
    tool-call indices are the proxy's."""

    def __init__(self, own: Mapping[str, Any], chunk_id: Any = None) -> None:
        self.own = own
        self.chunk_id = chunk_id  # the id the app's reply started with (a later round's: set)
        self._following = chunk_id is not None
        self._own_indices: set[int] = set()
        self._app_calls = False

    def cut(self, chunk: dict[str, Any]) -> bool:
        """Remove the proxy's calls from ``chunk`` in place; True if it changed."""
        changed = False
        if not self._following:
            self.chunk_id = chunk.get("id") if self.chunk_id is None else self.chunk_id
        elif "id" in chunk and chunk["id"] != self.chunk_id:
            chunk["id"] = self.chunk_id  # a later round goes on as the reply the app began
            changed = True
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                kept = [call for call in calls if not self._is_own(call)]
                if len(kept) != len(calls):
                    changed = True
                    if kept:
                        delta["tool_calls"] = kept
                    else:
                        del delta["tool_calls"]
            if (
                self._own_indices
                and not self._app_calls
                and choice.get("finish_reason") == "tool_calls"
            ):
                choice["finish_reason"] = "stop"  # every call of this reply was cut
                changed = True
        return changed

    def follow(self, dropped: int) -> CallCutter:
        """The cutter of the round that continues this one (the app saw no call yet)."""
        return CallCutter(self.own, self.chunk_id if self.chunk_id is not None else "")

    def _is_own(self, call: Any) -> bool:
        if not isinstance(call, dict) or not isinstance(call.get("index"), int):
            return False
        name = call_name(call)
        if name in self.own:
            self._own_indices.add(call["index"])
        elif name:
            self._app_calls = True
        return call["index"] in self._own_indices


class ChatWire:
    """``POST /v1/chat/completions``: the engine's own format, translated by nothing (only
    the JSON of the view's messages is the last request's where they are)."""

    name = "chat"
    field = "messages"
    path = "/chat/completions"
    provider = "openai"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse(raw)

    def ids(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
        return identify(headers, body)

    def managed(self, body: Mapping[str, Any]) -> bool:
        return True

    def history(self, body: Mapping[str, Any], translations: Any) -> list[Message]:
        return list(body["messages"])  # the engine's own messages: nothing to translate

    def payload(
        self,
        body: Mapping[str, Any],
        messages: list[Message],
        tools: list[Message],
        translations: Translations,
    ) -> bytes:
        out = {**body, "messages": messages}
        if tools:
            out["tools"] = [*(body.get("tools") or ()), *tools]
        return dumped_object(out, "messages", translations.dumped(messages))

    def declared_tools(self, body: Mapping[str, Any]) -> set[str]:
        return declared_tools(body)

    def pins_tools(self, body: Mapping[str, Any]) -> bool:
        return pins_tools(body)

    def reply(self, data: Any) -> Message | None:
        message = only_message(data)  # a copy: ``strip`` edits the reply the app gets
        return None if message is None else dict(message)

    def record(self, data: Any) -> Message | None:
        return first_message(data)

    def strip(self, data: dict[str, Any], own: Mapping[str, Any]) -> bool:
        return strip_own_calls(data, own)

    def builder(self) -> ReplyBuilder:
        return ReplyBuilder()

    def cutter(self, own: Mapping[str, Any]) -> CallCutter:
        return CallCutter(own)

    def verdict(self, chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
        return verdict(chunk, own)

    def has_substance(self, chunk: Mapping[str, Any]) -> bool:
        return has_substance(chunk)

    def ends(self, chunk: Mapping[str, Any]) -> bool:
        """The finish chunk, or a usage chunk after it (``[DONE]`` is the stream's)."""
        choices = chunk.get("choices") or ()
        if not choices:
            return bool(chunk.get("usage"))
        return any(isinstance(c, dict) and c.get("finish_reason") for c in choices)

    def encode(self, chunk: Mapping[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def stream_error(self, message: str) -> bytes:
        return self.encode({"error": {"message": message}})

    def error(
        self, status: int, message: str, kind: str, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> Response:
        return error_response(status, message, kind, headers)
