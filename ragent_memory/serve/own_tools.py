"""The proxy's own tool calls answered inside B: arguments clamped to what fits, answers
fitted to the room left, and a reply's own calls cut from the message that stays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragent_memory.core.chars import clip
from ragent_memory.engine.tools import ToolHost, as_int, call_tool, parse_arguments
from ragent_memory.recall.recaller import SEARCH_TOOL_NAME
from ragent_memory.recall.refs import DEFAULT_LIMIT, RECALL_TOOL_NAME
from ragent_memory.serve.chat import split_calls
from ragent_memory.settings import is_int

FOOTER_ROOM = 200  # a recall answer's footer ("chars a–b of n; … call again with offset=…")
SEARCH_MAX = 20  # the search tool's declared maximum of excerpts
MIN_ANSWER = 120  # below this much room an answer says there is none
NO_ROOM = (
    "[ragent-memory: no room left under this request's budget for more; "
    "answer from what the conversation shows]"
)


def answer_calls(
    engine: ToolHost,
    calls: Sequence[Mapping[str, Any]],
    room: int,
    session_id: str,
    user_id: str | None,
) -> list[dict[str, Any]]:
    """The tool messages answering ``calls`` of the proxy's tools, all of them within
    ``room`` chars: each call's arguments ``limited`` to the room left, each answer
    ``fitted`` to it. The arguments are the model's: ``call_tool`` refuses bad ones with a
    line it can read."""
    answers = []
    for call in calls:
        function = call.get("function") or {}
        name, arguments = str(function.get("name")), function.get("arguments")
        text = call_tool(
            engine, name, limited(name, arguments, room), session_id=session_id, user_id=user_id
        )
        text = fitted(text, room)
        room -= len(text)
        answers.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
    return answers


def limited(name: Any, arguments: Any, room: int) -> Any:
    """``arguments`` of a call of the proxy's tool ``name``, clamped: a recall ``limit`` to
    the room left under B (less its footer), a search ``limit`` to the tool's maximum.
    Arguments that are not an object, and values of the wrong type, are passed on as they
    are: the tool refuses them with a line the model can read."""
    args = parse_arguments(arguments)
    if args is None:
        return arguments
    if name == RECALL_TOOL_NAME:
        limit = as_int(args.get("limit", DEFAULT_LIMIT))
        cap = max(room - FOOTER_ROOM, 1)
        if is_int(limit) and limit > cap:
            args["limit"] = cap
    elif name == SEARCH_TOOL_NAME:
        limit = as_int(args.get("limit"))
        if is_int(limit) and limit > SEARCH_MAX:
            args["limit"] = SEARCH_MAX
    return args


def fitted(text: str, room: int) -> str:
    """An answer cut to the ``room`` left under B; a line saying so when there is none."""
    if len(text) <= room:
        return text
    return clip(text, room) if room >= MIN_ANSWER else NO_ROOM


def without_calls(message: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message with the proxy's calls cut out (a copy)."""
    _, theirs = split_calls(message, own)
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if theirs:
        out["tool_calls"] = theirs
    elif out.get("content") is None:
        out["content"] = ""
    return out
