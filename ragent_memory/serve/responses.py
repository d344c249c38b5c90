"""The OpenAI Responses wire format (``POST /v1/responses``, stateless: an ``input`` list and
``instructions``; docs/design.md §14b): what Codex CLI and the Agents SDK's default model send,
translated to the engine's chat messages and back.

To the engine: ``instructions`` is the leading system message; a user, system or developer
``message`` item a message of its role (its ``input_text`` parts text parts); a run of
assistant-side items (an assistant ``message``, ``reasoning``, ``function_call`` and the
other ``…_call`` items) one assistant message: calls that carry a ``call_id`` as tool calls,
everything else as an opaque part (``{"type": "x_item", "item": …}``) the engine never reads
as text; a ``…_call_output`` a tool message; any other item (``compaction``, references) an
opaque part of a system message while only system messages came before it (so the engine
keeps it in the prefix), of a user message after. Every item's keys the engine does not use
ride along (``x_item``), so reasoning items with ``encrypted_content`` and compaction items
go back byte for byte. A request chained on the provider's side (``previous_response_id``,
``conversation``) is not the engine's to manage: it is forwarded untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import orjson
from starlette.responses import Response

from ragent_memory.core.chars import Message
from ragent_memory.serve.chat import call_name, error_response
from ragent_memory.serve.http import Reject
from ragent_memory.serve.wire import (
    Translations,
    derived_session,
    dumped_object,
    load_object,
    named_event,
    rebuilt,
)

Item = dict[str, Any]
OPAQUE = "x_item"  # a part that is a whole item, carried as it came
NOT_IN_VIEW = "[ragent-memory: this call's output is not in the current view]"
_TEXT_TYPES = frozenset({"input_text", "output_text"})
_ASSISTANT_SIDE = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
    }
)
_ARGUMENT_KEYS = MappingProxyType({"function_call": "arguments", "custom_tool_call": "input"})
INSTALLATION = "x-codex-installation-id"  # Codex CLI's client_metadata key: one per install
_STARTING = frozenset({"response.created", "response.in_progress", "response.queued"})
_ENDING = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _kind(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) else ("message" if "role" in item else "")


def _without(item: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in keys}


def _parts_in(content: Any, item: Mapping[str, Any] | None = None) -> Any:
    """A message's or output's content for the engine: text parts as ``text`` (their type
    kept as ``x_type``), other parts as they came; ``item``: the message's own keys."""
    if isinstance(content, str):
        if item is None:
            return content
        return [{"type": "text", "text": content, "x_item": item, "x_type": "str"}]
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in _TEXT_TYPES:
            part = {**part, "type": "text", "x_type": part["type"]}
            if item is not None:
                part["x_item"] = item
        parts.append(part)
    return parts


def _call(item: Mapping[str, Any]) -> Message:
    kind = _kind(item)
    arguments = item.get(_ARGUMENT_KEYS.get(kind, "arguments"))
    if not isinstance(arguments, str):
        arguments = orjson.dumps(item.get("action") or {}).decode()
    return {
        "id": item.get("call_id"),
        "type": "function",
        "function": {"name": item.get("name") or kind, "arguments": arguments},
        "x_item": dict(item),
    }


def _is_call(item: Mapping[str, Any]) -> bool:
    return _kind(item).endswith("_call") and "call_id" in item


def _is_output(item: Mapping[str, Any]) -> bool:
    return _kind(item).endswith("_call_output") and "call_id" in item


def _is_assistant_side(item: Mapping[str, Any]) -> bool:
    kind = _kind(item)
    if kind == "message":
        return item.get("role") == "assistant"
    return _is_call(item) or kind in _ASSISTANT_SIDE


def assistant_message(items: Sequence[Item]) -> Message:
    """A run of assistant-side items as one engine message."""
    parts: list[Any] = []
    calls: list[Message] = []
    for item in items:
        if _kind(item) == "message":
            parts += _parts_in(item.get("content"), _without(item, "content"))
        elif _is_call(item):
            calls.append(_call(item))
        else:
            parts.append({"type": OPAQUE, "item": item})
    message: Message = {"role": "assistant", "content": parts if parts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _other(item: Item, index: int, leading: bool) -> list[Message]:
    kind = _kind(item)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer"):
            raise Reject(400, f"input[{index}]: unknown message role {role!r}")
        engine_role = "user" if role == "user" else "system"
        keys = _without(item, "content")
        return [{"role": engine_role, "content": _parts_in(item.get("content")), "x_item": keys}]
    if _is_output(item):
        output = item.get("output")
        return [
            {
                "role": "tool",
                "tool_call_id": item.get("call_id"),
                "content": _parts_in(output) if output is not None else "",
                "x_item": _without(item, "output"),
            }
        ]
    return [{"role": "system" if leading else "user", "content": [{"type": OPAQUE, "item": item}]}]


def to_engine(body: Mapping[str, Any], translations: Translations | None = None) -> list[Message]:
    """``instructions`` and ``input`` as the engine's messages (what ``translations`` holds of the
    session's last request reused). The items the session's last body began with, as the
    same objects, are not even looked at again: what they made up to the last item that
    closed a message is reused as a whole."""
    translations = translations or Translations()
    out: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        system = {"role": "system", "content": instructions, "x_instructions": True}
        out += translations.reuse("instructions", instructions, list, (system,))
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise Reject(400, "malformed body: 'input' must be a string or a list of items")
    start, state, marks = translations.resume(instructions, items, out)
    leading = True if state is None else bool(state)  # only system messages so far
    run: list[Item] = []
    for index, item in enumerate([*items[start:], None], start):
        if isinstance(item, dict) and _is_assistant_side(item):
            run.append(item)
            continue
        if run:
            ran = tuple(run)
            out += translations.reuse(ran_key(ran), ran, _assistant_list, ran)
            run, leading = [], False
        if item is None and index == len(items):
            break
        if not isinstance(item, dict):
            raise Reject(400, f"input[{index}]: expected an item object")
        made = translations.reuse((id(item), leading), item, _other, item, index, leading)
        out += made
        leading = leading and made[0]["role"] == "system"
        marks.append((index + 1, len(out), leading))
    translations.keep_prefix(instructions, items, out, marks)
    return out


def _assistant_list(run: tuple[Item, ...]) -> list[Message]:
    return [assistant_message(run)]


def ran_key(run: tuple[Item, ...]) -> tuple[int, ...]:
    return tuple(map(id, run))


# ---------------------------------------------------------------------- back to the wire


def _parts_out(content: Any, role: str) -> Any:
    if not isinstance(content, list):
        return content
    default = "output_text" if role == "assistant" else "input_text"
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            kind = part.get("x_type")
            kind = kind if kind in _TEXT_TYPES else default
            part = {**_without(part, "x_type", "x_item"), "type": kind}
        out.append(part)
    return out


def _message_items(message: Mapping[str, Any]) -> list[Item]:
    """A user/system engine message as items: opaque parts as the items they are, the rest
    as message items (their own keys restored)."""
    role = message.get("role", "user")
    content = message.get("content")
    keys = message.get("x_item") or {"role": role}
    if not isinstance(content, list):
        return [{**keys, "content": content if content is not None else ""}]
    items: list[Item] = []
    pending: list[Any] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == OPAQUE:
            if pending:
                items.append({**keys, "content": _parts_out(pending, role)})
                pending = []
            items.append(part["item"])
        else:
            pending.append(part)
    if pending or not items:
        items.append({**keys, "content": _parts_out(pending, role)})
    return items


def _assistant_items(message: Mapping[str, Any]) -> list[Item]:
    content = message.get("content")
    items: list[Item] = []
    if isinstance(content, str):
        items.append({"role": "assistant", "content": content})
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict) and part.get("type") == OPAQUE:
            items.append(part["item"])
            continue
        keys = part.get("x_item") if isinstance(part, dict) else None
        keys = keys if isinstance(keys, dict) else {"type": "message", "role": "assistant"}
        if isinstance(part, dict) and part.get("x_type") == "str":
            items.append({**keys, "content": part.get("text", "")})
            continue
        [restored] = _parts_out([part], "assistant")
        last = items[-1] if items else None
        if last is not None and last.get("x_keys") == keys:
            last["content"].append(restored)
        else:
            items.append({**keys, "content": [restored], "x_keys": keys})
    for item in items:
        item.pop("x_keys", None)
    for call in message.get("tool_calls") or ():
        items.append(_call_item(call))
    return items


def _call_item(call: Mapping[str, Any]) -> Item:
    function = call.get("function") or {}
    item = dict(call.get("x_item") or {"type": "function_call"})
    item["call_id"] = call.get("id")
    key = _ARGUMENT_KEYS.get(_kind(item))
    if key is not None:
        item["name"] = function.get("name")
        item[key] = function.get("arguments")
    return item


def _output_item(message: Mapping[str, Any]) -> Item:
    keys = message.get("x_item") or {"type": "function_call_output"}
    item = {**keys, "call_id": message.get("tool_call_id")}
    item["output"] = _parts_out(message.get("content"), "user") or ""
    return item


def from_engine(
    messages: Sequence[Message], translations: Translations | None = None
) -> tuple[str | None, list[Item]]:
    """``(instructions, input)`` of the upstream request; what ``translations`` holds of the
    session's last request (the view's same or equal messages) is reused."""
    translations = translations or Translations()
    messages = list(messages)  # as it is now: the proxy's own tool rounds extend the view
    items: list[Item] = []
    start, state, marks = translations.resume(None, messages, items, "out")
    instructions, called, answered = _Paired.at(state)
    for index in range(start, len(messages)):
        message = messages[index]
        if message.get("x_instructions") and isinstance(message.get("content"), str):
            instructions = message["content"]
        else:
            made, calling, answering = translations.reuse(
                ("out", id(message)), message, _items, message
            )
            items += made
            called += calling
            answered += answering
        marks.append((index + 1, len(items), _Paired(instructions, called, answered)))
    translations.keep_prefix(None, messages, items, marks, "out")
    calls, outputs = set(called), set(answered)
    if calls != outputs:
        _pair(items, calls, outputs)
    return instructions, items


class _Paired:
    """The state of ``from_engine`` after a message: the instructions so far, and the call
    ids the items so far call and answer (a count into lists later messages append to)."""

    __slots__ = ("answered", "called", "instructions", "size")

    def __init__(self, instructions: str | None, called: list[Any], answered: list[Any]) -> None:
        self.instructions, self.called, self.answered = instructions, called, answered
        self.size = (len(called), len(answered))

    @staticmethod
    def at(state: _Paired | None) -> tuple[str | None, list[Any], list[Any]]:
        """``(instructions, called, answered)`` to go on from (fresh lists)."""
        if state is None:
            return None, [], []
        calls, outputs = state.size
        return state.instructions, state.called[:calls], state.answered[:outputs]


def _items(message: Mapping[str, Any]) -> tuple[list[Item], tuple[Any, ...], tuple[Any, ...]]:
    """An engine message as items, with the call ids of its calls and of its outputs."""
    role = message.get("role")
    if role == "assistant":
        items = _assistant_items(message)
    elif role == "tool":
        items = [_output_item(message)]
    else:
        items = _message_items(message)
    calls = tuple(i.get("call_id") for i in items if _is_call(i))
    return items, calls, tuple(i.get("call_id") for i in items if _is_output(i))


def _pair(items: list[Item], calls: set[Any], outputs: set[Any]) -> None:
    """Every output answering a call (an orphan becomes a user message), every function
    call answered (an output saying it is not in view, after the call's run of assistant-side
    items; a call the input ends with is the model's latest: no output yet). ``calls`` and
    ``outputs``: the call ids the items' calls and outputs name."""
    orphans, unanswered = outputs - calls, calls - outputs
    mended: list[Item] = []
    owed: list[Item] = []  # outputs for the calls of the current run
    for item in items:
        call_id = item.get("call_id")
        if owed and not _is_assistant_side(item):
            mended += owed
            owed = []
        if call_id in orphans and _is_output(item):
            text = item.get("output") if isinstance(item.get("output"), str) else ""
            item = {"role": "user", "content": f"[output of call {call_id}]\n{text}"}
        elif call_id in unanswered and _kind(item) in _ARGUMENT_KEYS:
            kind = "custom_tool_call_output" if _kind(item) == "custom_tool_call" else None
            output = {"type": kind or "function_call_output", "call_id": call_id}
            owed.append({**output, "output": NOT_IN_VIEW})
        mended.append(item)
    items[:] = mended


# ---------------------------------------------------------------------- streams


class Builder:
    """The output items a Responses stream announces, as the engine message they spell."""

    def __init__(self) -> None:
        self._items: dict[int, Item] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        kind = chunk.get("type")
        if kind in ("response.output_item.added", "response.output_item.done"):
            index, item = chunk.get("output_index"), chunk.get("item")
            if isinstance(index, int) and isinstance(item, dict):
                self._items[index] = item
        elif kind == "response.completed":
            output = (chunk.get("response") or {}).get("output")
            if isinstance(output, list):
                self._items = dict(enumerate(i for i in output if isinstance(i, dict)))

    def message(self) -> Message:
        return assistant_message([self._items[i] for i in sorted(self._items)])


class Cutter:
    """Cuts the proxy's function calls out of a Responses stream: their events dropped, the
    later ``output_index`` and ``sequence_number`` renumbered, the final output without them.
    A round that continues the app's reply (``follow``) loses its opening events and goes on
    numbering from there; its final output holds the items of the earlier rounds first, and
    the response keeps the first round's id."""

    def __init__(
        self,
        own: Mapping[str, Any],
        prior: Sequence[Item] = (),
        base: int = 0,
        *,
        following: bool = False,
        response_id: Any = None,
    ) -> None:
        self.own = own
        self.following = following  # a round after the first: its opening events dropped
        self.response_id = response_id  # the id the app's response started with
        self.prior = list(prior)  # the items the app saw in earlier rounds of this reply
        self.base = base  # the sequence number this round's first event gets
        self._cut: set[int] = set()
        self._shown: dict[int, Item] = {}
        self._dropped = 0
        self._last = base - 1

    def follow(self, dropped: int) -> Cutter:
        """The cutter of the round that continues this one (``dropped``: its ending events
        the app never got)."""
        shown = [self._shown[i] for i in sorted(self._shown)]
        base = self._last + 1 - dropped
        return Cutter(
            self.own, [*self.prior, *shown], base, following=True, response_id=self.response_id
        )

    def cut(self, chunk: dict[str, Any]) -> bool:
        index = chunk.get("output_index")
        kind = chunk.get("type")
        if self.following and kind in _STARTING:
            return self._drop(chunk)
        changed = False
        if isinstance(index, int):
            if kind == "response.output_item.added" and _is_own(chunk.get("item"), self.own):
                self._cut.add(index)
            if index in self._cut:
                return self._drop(chunk)
            changed = self._renumber(chunk, index)
        changed = self._response(chunk.get("response")) or changed
        return self._number(chunk) or changed

    def _renumber(self, chunk: dict[str, Any], index: int) -> bool:
        """The app's ``output_index``: the proxy's items before it cut, the earlier rounds'
        items counted; an item done is remembered for a round that may follow."""
        shifted = index - sum(1 for cut in self._cut if cut < index) + len(self.prior)
        chunk["output_index"] = shifted
        if chunk.get("type") == "response.output_item.done" and isinstance(chunk.get("item"), dict):
            self._shown[shifted] = chunk["item"]
        return shifted != index

    def _response(self, response: Any) -> bool:
        """The response a chunk carries, as the app's: the proxy's items cut from its output,
        the earlier rounds' items first, the first round's id."""
        if not isinstance(response, dict):
            return False
        changed = False
        if self.response_id is None:
            self.response_id = response.get("id")
        elif response.get("id") != self.response_id:
            response["id"] = self.response_id
            changed = True
        output = response.get("output")
        if isinstance(output, list):
            kept = [i for i in output if not _is_own(i, self.own)]
            if self.prior or len(kept) != len(output):
                response["output"] = [*self.prior, *kept]
                changed = True
        return changed

    def _drop(self, chunk: dict[str, Any]) -> bool:
        chunk.clear()
        self._dropped += 1
        return True

    def _number(self, chunk: dict[str, Any]) -> bool:
        number = chunk.get("sequence_number")
        if not isinstance(number, int):
            return False
        self._last = number - self._dropped + self.base
        if self._last == number:
            return False
        chunk["sequence_number"] = self._last
        return True


def _is_call_item(item: Any) -> bool:
    return isinstance(item, dict) and _kind(item) == "function_call"


def _is_own(item: Any, own: Mapping[str, Any]) -> bool:
    return isinstance(item, dict) and _kind(item) == "function_call" and item.get("name") in own


# ---------------------------------------------------------------------- the wire


class ResponsesWire:
    """``POST /v1/responses`` (see the module docstring)."""

    name = "responses"
    field = "input"
    path = "/responses"
    provider = "openai"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return load_object(raw, "input", "a string or a list of items")

    def ids(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
        """X-Session-Id / X-User-Id first; else ``prompt_cache_key`` (Codex CLI's
        conversation id) for the session, then ``user`` or ``safety_identifier`` (the user
        too); else the session derived from ``instructions`` and the first input item. The
        user without those: Codex CLI's installation id (``client_metadata``)."""
        field = next(
            (v for k in ("user", "safety_identifier") if isinstance(v := body.get(k), str) and v),
            None,
        )
        session = headers.get("x-session-id") or _text(body.get("prompt_cache_key")) or field
        if not session:
            items = body["input"]
            first = items[:1] if isinstance(items, list) else [items]
            session = derived_session("responses", [body.get("instructions"), *first])
        metadata = body.get("client_metadata")
        installation = metadata.get(INSTALLATION) if isinstance(metadata, dict) else None
        return session, headers.get("x-user-id") or field or _text(installation)

    def managed(self, body: Mapping[str, Any]) -> bool:
        return not (body.get("previous_response_id") or body.get("conversation"))

    def history(self, body: Mapping[str, Any], translations: Translations) -> list[Message]:
        return to_engine(body, translations)

    def payload(
        self,
        body: Mapping[str, Any],
        messages: list[Message],
        tools: list[Message],
        translations: Translations,
    ) -> bytes:
        instructions, items = from_engine(messages, translations)
        out = rebuilt(body, ("input", items), ("instructions", instructions), [*map(_tool, tools)])
        return dumped_object(out, "input", translations.dumped(items))

    def declared_tools(self, body: Mapping[str, Any]) -> set[str]:
        tools = body.get("tools") or ()
        return {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}

    def pins_tools(self, body: Mapping[str, Any]) -> bool:
        choice = body.get("tool_choice")
        return choice in ("none", "required") or isinstance(choice, dict)

    def reply(self, data: Any) -> Message | None:
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list):
            return None
        return assistant_message([i for i in output if isinstance(i, dict)])

    record = reply

    def strip(self, data: dict[str, Any], own: Mapping[str, Any]) -> bool:
        output = data.get("output") or []
        kept = [i for i in output if not _is_own(i, own)]
        if len(kept) == len(output):
            return False
        data["output"] = kept
        return True

    def builder(self) -> Builder:
        return Builder()

    def cutter(self, own: Mapping[str, Any]) -> Cutter:
        return Cutter(own)

    def verdict(self, chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
        kind = chunk.get("type")
        if not isinstance(kind, str) or kind in _STARTING:
            return None  # nothing said yet
        item = chunk.get("item")
        if kind == "response.output_item.added" and _is_call_item(item):
            return "own" if _is_own(item, own) else "pass"
        return "pass"  # a message, reasoning (it streams live; a call after it: ``follow``)

    def has_substance(self, chunk: Mapping[str, Any]) -> bool:
        return bool(chunk)

    def ends(self, chunk: Mapping[str, Any]) -> bool:
        return chunk.get("type") in _ENDING

    def encode(self, chunk: Mapping[str, Any]) -> bytes:
        return named_event(chunk)

    def stream_error(self, message: str) -> bytes:
        error = {"type": "error", "code": "upstream_error", "message": message, "param": None}
        return named_event({**error, "sequence_number": 0})

    def error(
        self, status: int, message: str, kind: str, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> Response:
        return error_response(status, message, kind, headers)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions tool schema (the proxy's own) as a Responses function tool."""
    function = schema.get("function") or {}
    return {
        "type": "function",
        "name": call_name(schema),
        "description": function.get("description", ""),
        "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        "strict": False,
    }
