"""What a wire format gives the proxy's one turn pipeline (``turn.Proxy``): one module per
format (``chat``, ``anthropic``, ``responses``) implements ``Wire``, translating its request
to the engine's chat messages and the prepared view back, and reading its replies and streams.

The engine only ever sees chat dicts. What it must neither read nor change rides along in
them untouched: a content part it does not know (``type`` other than ``text``) is counted at
a fixed size and never read as text, and keys it does not know (``x_…`` here) are kept on the
messages, parts and tool calls it hands back, so a translation back restores them.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import orjson
from starlette.responses import Response

from ragent_memory.core.chars import Message
from ragent_memory.serve.http import Reject

T = TypeVar("T")
# What one request's translation made (by the identity of the objects it was made from: the
# turns and items ``BodyCache`` hands out again, the view's messages ``prepare`` hands out
# again): key -> (source, made). See ``Translations``.
Made = dict[Hashable, tuple[Any, Any]]
Marks = list[tuple[int, int, Any]]  # (items translated, messages made, the loop's state)


class Builder(Protocol):
    """Accumulates a stream's chunks into the engine message they spell."""

    def add(self, chunk: dict[str, Any]) -> None: ...

    def message(self) -> Message: ...


class Cutter(Protocol):
    """Cuts the proxy's own tool calls out of a stream's chunks, in place."""

    def cut(self, chunk: dict[str, Any]) -> bool: ...

    def follow(self, dropped: int) -> Cutter:
        """The cutter of a round that continues this stream's reply: its opening events
        dropped, its numbering going on (``dropped``: this round's ending events the app
        did not get)."""
        ...


class Wire(Protocol):
    """One wire format (see the module docstring)."""

    name: str  # for logs: chat, messages, responses
    field: str  # the body's conversation list (``BodyCache`` parses it by its tail)
    path: str  # the upstream path after the base URL
    provider: str  # which ``serve.upstreams`` entry replaces ``serve.upstream``

    def parse(self, raw: bytes) -> dict[str, Any]: ...

    def ids(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str | None]:
        """``(session_id, user_id)`` as the request names them (before scoping)."""
        ...

    def managed(self, body: Mapping[str, Any]) -> bool:
        """False for a request the engine cannot manage: it is forwarded untouched."""
        ...

    def history(self, body: Mapping[str, Any], translations: Translations) -> list[Message]:
        """The request's conversation as the engine's chat messages (what the session's last
        request made of the same objects reused)."""
        ...

    def payload(
        self,
        body: Mapping[str, Any],
        messages: list[Message],
        tools: list[Message],
        translations: Translations,
    ) -> bytes:
        """The upstream body: the app's, with ``messages`` translated back (what the session's
        last request made of the same view messages reused) and the proxy's ``tools``
        (chat-completions schemas) added in this format's shape."""
        ...

    def declared_tools(self, body: Mapping[str, Any]) -> set[str]: ...

    def pins_tools(self, body: Mapping[str, Any]) -> bool: ...

    def reply(self, data: Any) -> Message | None:
        """The engine message of a whole reply (None when it is none the proxy follows)."""
        ...

    def record(self, data: Any) -> Message | None:
        """The engine message of a whole reply that the app keeps (after_turn records it)."""
        ...

    def strip(self, data: dict[str, Any], own: Mapping[str, Any]) -> bool:
        """Remove the proxy's own calls from a whole reply; True if any was."""
        ...

    def builder(self) -> Builder: ...

    def cutter(self, own: Mapping[str, Any]) -> Cutter: ...

    def verdict(self, chunk: dict[str, Any], own: Mapping[str, Any]) -> str | None:
        """``"own"`` / ``"pass"`` from a stream's first substantive chunk; None before it."""
        ...

    def has_substance(self, chunk: Mapping[str, Any]) -> bool: ...

    def ends(self, chunk: Mapping[str, Any]) -> bool:
        """An event that ends a reply (held back while a round of the proxy may follow)."""
        ...

    def encode(self, chunk: Mapping[str, Any]) -> bytes: ...

    def stream_error(self, message: str) -> bytes: ...

    def error(
        self, status: int, message: str, kind: str, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> Response: ...


class Translations:
    """One request's translations both ways, reusing the session's last request's: an app
    resends its whole history and ``BodyCache`` hands the turns it sent before out again as
    the same objects; ``prepare`` hands the view's unchanged messages out again as the same
    objects. What was made from an object (or a run of them) the last request saw is taken
    as it was, so a request translates only what is new, and the engine gets the very
    message objects it saw before (its prefix checks rely on their identity); the JSON of
    the messages sent upstream is reused the same way (``dumped``), in every format.

    Nothing made here is changed afterwards (it may be the next request's), nor is anything
    it was made from. ``made`` is kept per session (``bodies.KeptTranslations``); ``next()`` is what the
    session's next request starts from."""

    def __init__(self, last: Made | None = None) -> None:
        self.last: Made = last if last is not None else {}
        self.made: Made = {}

    def next(self) -> Translations:
        return Translations(self.made)

    def reuse(self, key: Hashable, source: Any, make: Callable[..., T], *args: Any) -> T:
        """What ``make(*args)`` makes of ``source`` (an object, or a tuple of objects): the
        last request's when it saw the very same object(s) under ``key``; recorded for the
        next request either way."""
        hit = self.last.get(key)
        if hit is None or not _same(hit[0], source):
            hit = (source, make(*args))
        self.made[key] = hit
        made: T = hit[1]
        return made

    def resume(
        self, head: Any, items: list[Any], out: list[Any], way: str = "in"
    ) -> tuple[int, Any, Marks]:
        """Where translating ``items`` starts: when the session's last request translated
        (this ``way``) items after the same ``head`` (system, instructions), what it made
        of them up to its last mark within the items both share (the same objects, or equal
        ones: what is made of equal ones is equal) is put in ``out``, so those items are not
        looked at again. ``(start, state at start or None, the marks kept)``."""
        prior = self.last.get(("prefix", way))
        if prior is None or prior[0][0] != head:
            return 0, None, []
        _, known, made, marks = prior[0]
        shared = _shared(known, items)
        last = len(marks) - 1
        while last >= 0 and marks[last][0] > shared:
            last -= 1
        if last < 0:
            return 0, None, []
        start, count, state = marks[last]
        out[:] = made[:count]
        return start, state, marks[: last + 1]

    def keep_prefix(
        self, head: Any, items: list[Any], out: list[Any], marks: Marks, way: str = "in"
    ) -> None:
        """Record this translation (``items`` after ``head`` made ``out``; each mark: the
        items up to it made ``out`` up to its count, the translation's state there) for
        ``resume`` on the session's next request. Nothing may change ``items`` afterwards."""
        self.made[("prefix", way)] = ((head, items, list(out), marks), None)

    def dumped(self, items: Sequence[Any]) -> bytes:
        """``orjson.dumps(list(items))``: the JSON of the leading items the session's last
        request dumped (the same objects, or equal ones) reused, the rest dumped now."""
        items = list(items)
        prior = self.last.get("json")
        parts: list[bytes] = []
        if prior is not None:
            known, known_parts = prior[0]
            parts = known_parts[: _shared(known, items)]
        parts += map(orjson.dumps, items[len(parts) :])
        self.made["json"] = ((items, parts), None)
        return b"[" + b",".join(parts) + b"]"


def dumped_object(body: Mapping[str, Any], key: str, value: bytes) -> bytes:
    """``orjson.dumps(body)`` where ``body[key]``'s JSON is ``value`` already."""
    fields = (
        orjson.dumps(name) + b":" + (value if name == key else orjson.dumps(item))
        for name, item in body.items()
    )
    return b"{" + b",".join(fields) + b"}"


def _shared(known: list[Any], items: list[Any]) -> int:
    """How many leading items of both lists are the same objects or equal ones (identity
    compared at C speed; only where it differs is equality asked)."""
    differ = itertools.compress(itertools.count(), map(operator.is_not, known, items))
    return next((at for at in differ if known[at] != items[at]), min(len(known), len(items)))


def _same(known: Any, source: Any) -> bool:
    if isinstance(source, tuple):
        return len(known) == len(source) and all(map(operator.is_, known, source))
    return known is source


# Body fields the proxy reads ids from (each format's ``ids``), and which.
ID_FIELDS = MappingProxyType(
    {
        "user": "session_id",
        "metadata.user_id": "session_id and user_id",
        "prompt_cache_key": "session_id",
    }
)


def json_object(raw: bytes) -> dict[str, Any]:
    """A body that is a JSON object, or a 400 ``Reject`` saying what it is instead."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        where = _lone_surrogate(raw)
        if where is not None:  # valid JSON, but text no provider can take
            what = f" (read as the {ID_FIELDS[where]})" if where in ID_FIELDS else ""
            problem = f"malformed body: {where}{what}: not valid text (a lone surrogate)"
            raise Reject(400, problem) from None
        raise Reject(400, f"malformed body: not JSON ({err})") from err
    if not isinstance(body, dict):
        raise Reject(400, "malformed body: expected a JSON object")
    return body


def load_object(raw: bytes, key: str, want: str) -> dict[str, Any]:
    """A JSON object body whose ``key`` is present (``want`` says what it must be), or a 400."""
    body = json_object(raw)
    if key not in body:
        raise Reject(400, f"malformed body: '{key}' is required ({want})")
    return body


def named_event(chunk: Mapping[str, Any]) -> bytes:
    """One SSE event named after the chunk's ``type`` (Anthropic's and Responses' framing)."""
    kind = chunk.get("type")
    head = b"event: " + kind.encode() + b"\n" if isinstance(kind, str) else b""
    return head + b"data: " + orjson.dumps(chunk) + b"\n\n"


def arguments_object(arguments: Any) -> Any:
    """A tool call's JSON arguments as the object they spell; a shortened (no longer JSON)
    argument text as ``{"_preview": text}``, so a call the engine truncated stays an object."""
    if not isinstance(arguments, str):
        return {}
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_preview": arguments}
    return value if isinstance(value, dict) else {"_preview": arguments}


def text_parts(content: Any) -> list[dict[str, Any]]:
    """A chat content as a list of parts (a string as one text part)."""
    if isinstance(content, list):
        return [p for p in content if isinstance(p, dict)]
    if isinstance(content, str) and content:
        return [{"type": "text", "text": content}]
    return []


def derived_session(prefix: str, opening: Sequence[Any]) -> str:
    """A session id derived from a conversation's opening (its system and first user
    message): the same on every turn of it, different for another opening."""
    import hashlib

    digest = hashlib.sha256(orjson.dumps(list(opening), option=orjson.OPT_SORT_KEYS))
    return f"{prefix}-{digest.hexdigest()[:24]}"


def rebuilt(
    body: Mapping[str, Any],
    turns: tuple[str, list[Any]],
    top: tuple[str, Any],
    tools: list[dict[str, Any]],
) -> dict[str, Any]:
    """``body`` with its list of turns replaced (``turns``: key, items), its top-level
    instructions set or dropped (``top``: key, value or None) and the proxy's own ``tools``
    (already in the format's shape) after the app's."""
    out = {**body, turns[0]: turns[1]}
    if top[1] is None:
        out.pop(top[0], None)
    else:
        out[top[0]] = top[1]
    if tools:
        out["tools"] = [*(body.get("tools") or ()), *tools]
    return out


def _lone_surrogate(raw: bytes) -> str | None:
    """The path of the first string of a JSON body holding a lone surrogate (which JSON can
    escape but UTF-8 cannot carry), or None when the body is not such JSON."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    pending: list[tuple[str, Any]] = [("", body)]
    for _ in range(100_000):  # bounded: a body of many small values is cut short, not slow
        if not pending:
            break
        path, value = pending.pop()
        if isinstance(value, str):
            if any("\ud800" <= c <= "\udfff" for c in value):
                return path or "body"
        elif isinstance(value, dict):
            pending += [(f"{path}.{k}" if path else str(k), v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            pending += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
    return None
