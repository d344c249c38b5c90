"""The Anthropic Messages wire format (``POST /v1/messages``, docs/design.md §14b): what Claude Code
and the ``anthropic`` SDK send, translated to the engine's chat messages and back.

To the engine: the top-level ``system`` becomes the leading system message; a user turn's
``tool_result`` blocks become ``tool`` messages (their other keys, ``is_error`` and
``cache_control``, kept as ``x_block``) and its other blocks a user message whose parts are the
blocks as sent; an assistant turn's ``tool_use`` blocks become ``tool_calls`` and every other
block (text, ``thinking`` and ``redacted_thinking`` with their signatures, server tool blocks)
a part as sent, so the engine never reads a thinking block as text and hands it back as it
came. Back: the leading system messages are ``system`` again, consecutive user and tool
messages one user turn (tool results first), every ``tool_use`` answered by a ``tool_result``
in the next turn, and never more than 4 ``cache_control`` breakpoints. The engine's own
messages (memory block, summary) are user text after ``system`` and the recall block leads
the latest user turn, so the app's ``tools`` and ``system`` breakpoints keep their prefix.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import orjson
from starlette.responses import Response

from ragent_memory.core.chars import InputRole, Message
from ragent_memory.serve.chat import call_name
from ragent_memory.serve.http import Reject, whole_response
from ragent_memory.serve.wire import (
    Translations,
    arguments_object,
    derived_session,
    dumped_object,
    load_object,
    named_event,
    rebuilt,
    text_parts,
)

Block = dict[str, Any]
MAX_BREAKPOINTS = 4  # cache_control blocks Anthropic accepts in one request
NOT_IN_VIEW = "[ragent-memory: this tool's result is not in the current view]"
_KINDS = MappingProxyType({"server_busy": "overloaded_error", "upstream_error": "api_error"})
TURN_ROLES: Final[frozenset[InputRole]] = frozenset({"user", "assistant", "system", "developer"})


def _extras(block: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k not in known}


def _tool_message(block: Mapping[str, Any]) -> Message:
    message: Message = {
        "role": "tool",
        "tool_call_id": block.get("tool_use_id"),
        "content": block.get("content", ""),
    }
    if extras := _extras(block, ("type", "tool_use_id", "content")):
        message["x_block"] = extras
    return message


def _call(block: Mapping[str, Any]) -> Message:
    arguments = orjson.dumps(block.get("input", {})).decode()
    call: Message = {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }
    if extras := _extras(block, ("type", "id", "name", "input")):
        call["x_block"] = extras
    return call


def _user(content: Any) -> list[Message]:
    if not isinstance(content, list):
        return [{"role": "user", "content": content}]
    out: list[Message] = []
    parts: list[Any] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_message(block))
        else:
            parts.append(block)
    if parts or not out:
        out.append({"role": "user", "content": parts})
    return out


def assistant_message(content: Any) -> Message:
    """An assistant turn's content as one engine message (tool_use blocks as tool_calls)."""
    if not isinstance(content, list):
        return {"role": "assistant", "content": content}
    tool_uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    parts = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_use")]
    message: Message = {"role": "assistant", "content": parts if parts or not tool_uses else None}
    if tool_uses:
        message["tool_calls"] = [_call(b) for b in tool_uses]
    return message


def to_engine(body: Mapping[str, Any], translations: Translations | None = None) -> list[Message]:
    """The request's ``system`` and ``messages`` as the engine's messages (what ``translations``
    holds of the session's last request reused)."""
    translations = translations or Translations()
    out: list[Message] = []
    system = body.get("system")
    if system is not None and not _is_content(system):
        shown = type(system).__name__
        raise Reject(400, f"system: expected a string or a list of content blocks, got {shown}")
    if system:
        out += translations.reuse("system", system, _system_message, system)
    turns = body["messages"]
    start, _, marks = translations.resume(system, turns, out)
    for index in range(start, len(turns)):
        message = turns[index]
        out += translations.reuse(id(message), message, _turn, message, index)
        marks.append((index + 1, len(out), None))
    translations.keep_prefix(system, turns, out, marks)
    return out


def _system_message(system: Any) -> list[Message]:
    return [{"role": "system", "content": system}]


def _is_content(content: Any) -> bool:
    """A string, or a list of blocks (objects): what any provider could read as content."""
    return isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(block, dict) for block in content)
    )


def _turn(message: Any, index: int) -> list[Message]:
    """One turn as engine messages; a turn no provider could read is refused, naming it. A
    ``system`` or ``developer`` turn (anywhere: Claude Code sends them mid-conversation) is a
    system message that remembers its turn's keys (``x_turn``) so it goes back in its place."""
    if not isinstance(message, dict):
        raise Reject(
            400, f"messages[{index}]: expected a turn object, got {type(message).__name__}"
        )
    role, content = message.get("role"), message.get("content")
    if role not in TURN_ROLES:
        raise Reject(
            400,
            f"messages[{index}].role: {role!r} is not one of user, assistant, system, developer",
        )
    if not _is_content(content):
        raise Reject(
            400,
            f"messages[{index}].content: expected a string or a list of content blocks, "
            f"got {type(content).__name__}",
        )
    if role == "user":
        return _user(content)
    if role == "assistant":
        return [assistant_message(content)]
    keys = {k: v for k, v in message.items() if k != "content"}
    return [{"role": "system", "content": content, "x_turn": keys}]


# ---------------------------------------------------------------------- back to the wire


def _blocks(message: Mapping[str, Any]) -> list[Block]:
    """A user, tool or stray system engine message as the blocks of a user turn."""
    if message.get("role") == "tool":
        block: Block = {
            "type": "tool_result",
            "tool_use_id": message.get("tool_call_id"),
            "content": message.get("content") or "",
            **(message.get("x_block") or {}),
        }
        return [block]
    return text_parts(message.get("content"))


def _tool_uses(message: Mapping[str, Any]) -> list[Block]:
    uses = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        uses.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments_object(function.get("arguments")),
                **(call.get("x_block") or {}),
            }
        )
    return uses


def _assistant(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    uses = _tool_uses(message)
    if isinstance(content, str) and not uses:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": [*text_parts(content), *uses]}


def _system(leading: Sequence[Message]) -> Any:
    if len(leading) == 1 and isinstance(leading[0].get("content"), str):
        return leading[0]["content"]
    return [block for message in leading for block in text_parts(message.get("content"))]


def from_engine(
    messages: Sequence[Message], translations: Translations | None = None
) -> tuple[Any, list[dict[str, Any]], int]:
    """``(system, messages, cache_control marks in messages)`` of the upstream request
    (system None when there is none). Each assistant message is a turn, each system or
    developer turn the app sent goes back as that turn in its place, each run of user/tool
    messages between them one user turn, answered against the assistant turn before it
    (``_answered``); what ``translations`` holds of the session's last request (the view's same or
    equal messages) is reused."""
    translations = translations or Translations()
    messages = list(messages)  # as it is now: the proxy's own tool rounds extend the view
    lead = 0
    while lead < len(messages) and _is_leading_system(messages[lead]):
        lead += 1
    turns: list[dict[str, Any]] = []
    start, state, marks = translations.resume(None, messages, turns, "out")
    before, asked, marked = state or (None, None, 0)  # the assistant message before the run
    run = start = max(start, lead)  # where the run of user/tool messages started
    for index in range(start, len(messages) + 1):
        message = messages[index] if index < len(messages) else None
        if message is not None and not _breaks_run(message):
            continue
        if run < index:
            source = (before, *messages[run:index])
            unit = translations.reuse(
                ("out", *map(id, source)), source, _answered, asked, source[1:]
            )
            turns.append(unit[0])
            marked += unit[1]
            before = asked = None  # its calls are answered
        if message is None:
            break
        unit = translations.reuse(("out", id(message)), message, _own_turn, message)
        turns.append(unit[0])
        marked += unit[1]
        if message.get("role") == "assistant":
            before, asked = message, unit[0]
        run = index + 1
        marks.append((run, len(turns), (before, asked, marked)))
    translations.keep_prefix(None, messages, turns, marks, "out")
    return (_system(messages[:lead]) if lead else None), turns, marked


def _is_leading_system(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "system" and "x_turn" not in message


def _breaks_run(message: Mapping[str, Any]) -> bool:
    """An assistant message, or a system turn the app sent inside ``messages``."""
    return message.get("role") == "assistant" or "x_turn" in message


Unit = tuple[dict[str, Any], int]  # a turn and how many cache_control marks it holds


def _own_turn(message: Mapping[str, Any]) -> Unit:
    """An assistant message, or a system turn the app sent, as its own turn."""
    if message.get("role") == "assistant":
        turn = _assistant(message)
    else:
        turn = {**message["x_turn"], "content": message.get("content")}
    return turn, _marks(turn)


def _answered(asked: Mapping[str, Any] | None, run: Sequence[Message]) -> Unit:
    """The user turn of ``run``, paired with ``asked`` (the assistant turn before it, if
    any): every tool_use of it answered (a result saying it is not in view where the run has
    none), every tool_result answering one of them (an orphan becomes text)."""
    turn = _user_turn(run)
    calls = [b.get("id") for b in _content_blocks(asked) if b.get("type") == "tool_use"]
    content = turn["content"]
    if isinstance(content, str):
        if not calls:
            return turn, 0
        content = turn["content"] = text_parts(content)
    answered = set()
    for position, block in enumerate(content):
        if block.get("type") != "tool_result":
            continue
        if block.get("tool_use_id") in calls:
            answered.add(block.get("tool_use_id"))
            continue
        text = "\n".join(p.get("text", "") for p in text_parts(block.get("content")))
        note = f"[tool result {block.get('tool_use_id')}]\n{text}"
        content[position] = {"type": "text", "text": note}
    content[:0] = [
        {"type": "tool_result", "tool_use_id": call_id, "content": NOT_IN_VIEW}
        for call_id in calls
        if call_id not in answered
    ]
    return turn, _marks(turn)


def _user_turn(run: Sequence[Message]) -> dict[str, Any]:
    if len(run) == 1 and run[0].get("role") == "user" and isinstance(run[0].get("content"), str):
        return {"role": "user", "content": run[0]["content"]}
    blocks = [block for message in run for block in _blocks(message)]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    others = [b for b in blocks if b.get("type") != "tool_result"]
    return {"role": "user", "content": [*results, *others]}


def _content_blocks(turn: Mapping[str, Any] | None) -> list[Block]:
    content = turn.get("content") if turn else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def limit_breakpoints(body: dict[str, Any]) -> None:
    """At most ``MAX_BREAKPOINTS`` ``cache_control`` marks: past that, the earliest ones in
    ``messages`` lose theirs (the app's ``tools`` and ``system`` ones are its stable prefix).
    A turn that loses one is replaced in ``messages`` by a changed copy (the turns may be
    another request's too)."""
    turns = body["messages"]
    marked = [(index, *at) for index, turn in enumerate(turns) for at in _marked_in(turn)]
    copied: set[int] = set()
    for index, position, part in marked[
        : max(_fixed_marks(body) + len(marked) - MAX_BREAKPOINTS, 0)
    ]:
        if index not in copied:
            turns[index] = {**turns[index], "content": list(turns[index]["content"])}
            copied.add(index)
        blocks = turns[index]["content"]
        if part is None:
            blocks[position] = _unmarked(blocks[position])
        else:
            nested = list(blocks[position]["content"])
            nested[part] = _unmarked(nested[part])
            blocks[position] = {**blocks[position], "content": nested}


def _fixed_marks(body: Mapping[str, Any]) -> int:
    """The ``cache_control`` marks of the app's ``tools`` and ``system`` blocks."""
    count = sum(1 for tool in body.get("tools") or () if _marked(tool))
    system = body.get("system")
    return count + (sum(1 for b in system if _marked(b)) if isinstance(system, list) else 0)


def _marked_in(turn: Mapping[str, Any]) -> list[tuple[int, int | None]]:
    """Where a turn's ``cache_control`` marks are: (block, part of a tool_result or None)."""
    found: list[tuple[int, int | None]] = []
    for position, block in enumerate(_content_blocks(turn)):
        if _marked(block):
            found.append((position, None))
        nested = block.get("content")
        if block.get("type") == "tool_result" and isinstance(nested, list):
            found += [(position, i) for i, part in enumerate(nested) if _marked(part)]
    return found


def _marks(turn: Mapping[str, Any]) -> int:
    return len(_marked_in(turn))


def _unmarked(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _marked(block: Any) -> bool:
    return isinstance(block, dict) and "cache_control" in block


# ---------------------------------------------------------------------- streams


class Builder:
    """Accumulates a Messages stream's events into the engine message they spell."""

    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}
        self._json: dict[int, list[str]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        kind, index = chunk.get("type"), chunk.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start" and isinstance(chunk.get("content_block"), dict):
            self._blocks[index] = dict(chunk["content_block"])
            if self._blocks[index].get("type") == "tool_use":
                self._json[index] = []
        elif kind == "content_block_delta" and index in self._blocks:
            _apply(self._blocks[index], chunk.get("delta") or {}, self._json.get(index))
        elif kind == "content_block_stop" and index in self._json:
            self._blocks[index]["input"] = arguments_object("".join(self._json.pop(index)))

    def message(self) -> Message:
        return assistant_message([self._blocks[i] for i in sorted(self._blocks)])


def _apply(block: Block, delta: Mapping[str, Any], json_parts: list[str] | None) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "input_json_delta" and json_parts is not None:
        json_parts.append(delta.get("partial_json", ""))
    elif kind == "citations_delta":
        block["citations"] = [*(block.get("citations") or ()), delta.get("citation")]


class Cutter:
    """Cuts the content blocks of the proxy's tool calls out of a stream, renumbering the
    blocks after them so the app sees a gapless ``index``; a round that continues the app's
    reply (``follow``) loses its ``message_start`` and numbers its blocks on from there."""

    def __init__(self, own: Mapping[str, Any], offset: int = 0, *, following: bool = False) -> None:
        self.own = own
        self.following = following  # a round after the first: its message_start dropped
        self.offset = offset  # blocks the app saw in earlier rounds of this reply
        self._cut: set[int] = set()
        self._shown = 0
        self._app_calls = False

    def follow(self, dropped: int) -> Cutter:
        """The cutter of the round that continues this one."""
        return Cutter(self.own, self.offset + self._shown, following=True)

    def cut(self, chunk: dict[str, Any]) -> bool:
        kind, index = chunk.get("type"), chunk.get("index")
        if self.following and kind in ("message_start", "ping"):
            chunk.clear()  # the app's message started in an earlier round
            return True
        if kind == "content_block_start" and isinstance(index, int):
            block = chunk.get("content_block") or {}
            if block.get("type") == "tool_use" and block.get("name") in self.own:
                self._cut.add(index)
            else:
                self._shown += 1
                self._app_calls = self._app_calls or block.get("type") == "tool_use"
        if isinstance(index, int) and (self._cut or self.offset):
            if index in self._cut:
                chunk.clear()  # nothing of it reaches the app
                return True
            shifted = index - sum(1 for cut in self._cut if cut < index) + self.offset
            if shifted != index:
                chunk["index"] = shifted
                return True
        delta = chunk.get("delta") if kind == "message_delta" else None
        cut_all = self._cut and not self._app_calls
        if cut_all and isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
            delta["stop_reason"] = "end_turn"  # every call of this reply was cut
            return True
        return False


# ---------------------------------------------------------------------- the wire

_LEGACY_USER_ID = re.compile(
    r"user_(?P<device>[^_]*)_account_(?P<account>[^_]*)_session_(?P<session>.+)"
)


def client_ids(field: Any) -> tuple[str | None, str | None]:
    """``(session, user)`` named by a request's ``metadata.user_id``. Claude Code sends a
    JSON object as that string (``{"device_id", "account_uuid", "session_id"}``; before,
    ``user_<device>_account_<account>_session_<session>``): its ``session_id`` is the
    session and its ``account_uuid`` (else ``device_id``) the user. Any other non-empty
    string names both, as the app meant it."""
    if not isinstance(field, str) or not field:
        return None, None
    named: Any = None
    if field.startswith("{"):
        with contextlib.suppress(orjson.JSONDecodeError):
            named = orjson.loads(field)
    elif legacy := _LEGACY_USER_ID.fullmatch(field):
        named = {
            "session_id": legacy["session"],
            "account_uuid": legacy["account"],
            "device_id": legacy["device"],
        }
    if not isinstance(named, dict):
        return field, field
    session, user = (
        value if isinstance(value := named.get(key), str) and value else None
        for key in ("session_id", "account_uuid")
    )
    device = named.get("device_id")
    return session, user or (device if isinstance(device, str) and device else None)


class AnthropicWire:
    """``POST /v1/messages`` (see the module docstring)."""

    name = "messages"
    field = "messages"
    path = "/messages"
    provider = "anthropic"

    def parse(self, raw: bytes) -> dict[str, Any]:
        body = load_object(raw, "messages", "a list of turns")
        if not isinstance(body["messages"], list):
            raise Reject(400, "malformed body: 'messages' must be a list of turns")
        return body

    def ids(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
        """X-Session-Id / X-User-Id first; else what ``metadata.user_id`` names (see
        ``client_ids``); else Claude Code's X-Claude-Code-Session-Id; else the session
        derived from ``system`` and the first turn."""
        metadata = body.get("metadata")
        field = metadata.get("user_id") if isinstance(metadata, dict) else None
        named_session, named_user = client_ids(field)
        session = (
            headers.get("x-session-id") or named_session or headers.get("x-claude-code-session-id")
        )
        if not session:
            first = body["messages"][:1]
            session = derived_session("messages", [body.get("system"), *first])
        return session, headers.get("x-user-id") or named_user

    def managed(self, body: Mapping[str, Any]) -> bool:
        return True

    def history(self, body: Mapping[str, Any], translations: Translations) -> list[Message]:
        return to_engine(body, translations)

    def payload(
        self,
        body: Mapping[str, Any],
        messages: list[Message],
        tools: list[Message],
        translations: Translations,
    ) -> bytes:
        system, turns, marked = from_engine(messages, translations)
        out = rebuilt(body, ("messages", turns), ("system", system), [*map(_tool, tools)])
        if marked + _fixed_marks(out) > MAX_BREAKPOINTS:
            limit_breakpoints(out)
        return dumped_object(out, "messages", translations.dumped(out["messages"]))

    def declared_tools(self, body: Mapping[str, Any]) -> set[str]:
        tools = body.get("tools") or ()
        return {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}

    def pins_tools(self, body: Mapping[str, Any]) -> bool:
        choice = body.get("tool_choice")
        return isinstance(choice, dict) and choice.get("type") in ("any", "tool", "none")

    def reply(self, data: Any) -> Message | None:
        content = data.get("content") if isinstance(data, dict) else None
        return assistant_message(content) if isinstance(content, list) else None

    record = reply

    def strip(self, data: dict[str, Any], own: Mapping[str, Any]) -> bool:
        content = data.get("content") or []
        kept = [b for b in content if not (b.get("type") == "tool_use" and b.get("name") in own)]
        if len(kept) == len(content):
            return False
        data["content"] = kept
        if data.get("stop_reason") == "tool_use" and not any(
            b.get("type") == "tool_use" for b in kept
        ):
            data["stop_reason"] = "end_turn"
        return True

    def builder(self) -> Builder:
        return Builder()

    def cutter(self, own: Mapping[str, Any]) -> Cutter:
        return Cutter(own)

    def verdict(self, chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
        kind = chunk.get("type")
        if kind in ("message_start", "ping"):
            return None  # nothing said yet
        block = chunk.get("content_block") if kind == "content_block_start" else None
        if isinstance(block, dict) and block.get("type") == "tool_use":
            return "own" if block.get("name") in own else "pass"
        return "pass"  # text, thinking (it streams live; a call after it: see ``follow``)

    def has_substance(self, chunk: Mapping[str, Any]) -> bool:
        return bool(chunk)

    def ends(self, chunk: Mapping[str, Any]) -> bool:
        return chunk.get("type") in ("message_delta", "message_stop")

    def encode(self, chunk: Mapping[str, Any]) -> bytes:
        return named_event(chunk)

    def stream_error(self, message: str) -> bytes:
        return named_event({"type": "error", "error": {"type": "api_error", "message": message}})

    def error(
        self, status: int, message: str, kind: str, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> Response:
        """An Anthropic-shaped error: the anthropic client shows ``message``."""
        error = {"type": _KINDS.get(kind, kind), "message": message}
        body = orjson.dumps({"type": "error", "error": error}) + b"\n"
        return whole_response(status, [(b"content-type", b"application/json"), *headers], body)


def _tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions tool schema (the proxy's own) as an Anthropic tool."""
    function = schema.get("function") or {}
    return {
        "name": call_name(schema),
        "description": function.get("description", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
