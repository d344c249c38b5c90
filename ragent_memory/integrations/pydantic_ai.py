"""pydantic-ai: ``history_processor(engine, session_id, user_id=None)`` for ``pydantic_ai.Agent``.

::

    agent = Agent(model, capabilities=[ProcessHistory(history_processor(engine, "s1", "u1"))],
                  toolsets=[memory_toolset(engine, "s1", "u1")])

pydantic-ai replaces the run's history with what a history processor returns, so the processor
keeps the raw history itself (``processor.raw_history``): each call it appends what is new since
the view it last returned, and returns ``prepare``'s view of the whole. ``memory_toolset``
registers the engine's tools."""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

from pydantic_ai import Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.toolsets import FunctionToolset

from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.engine.tools import call_tool, memory_tools

__all__ = [
    "HistoryProcessor",
    "from_pydantic_ai",
    "history_processor",
    "memory_toolset",
    "to_pydantic_ai",
]


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": item if isinstance(item, str) else repr(item)} for item in content
    ]


def _tool_dict(part: ToolReturnPart | RetryPromptPart, content: str) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": part.tool_call_id,
        "name": part.tool_name,
        "content": content,
    }


def _part_dict(part: ModelRequestPart) -> dict[str, Any] | None:
    """One part of a request as a chat dict (None for a part the chat format has no place for)."""
    if isinstance(part, SystemPromptPart):
        return {"role": "system", "content": part.content}
    if isinstance(part, UserPromptPart):
        return {"role": "user", "content": _user_content(part.content)}
    if isinstance(part, ToolReturnPart):
        return _tool_dict(part, part.model_response_str())
    if isinstance(part, RetryPromptPart):
        if part.tool_name is None:
            return {"role": "user", "content": part.model_response()}
        return _tool_dict(part, part.model_response())
    return None


def _response_dict(message: ModelResponse) -> dict[str, Any]:
    text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
    calls = [
        {
            "id": p.tool_call_id,
            "type": "function",
            "function": {"name": p.tool_name, "arguments": p.args_as_json_str()},
        }
        for p in message.parts
        if isinstance(p, ToolCallPart)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out


def from_pydantic_ai(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """pydantic-ai messages as OpenAI chat dicts (one per part of a request)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            out += [d for d in map(_part_dict, message.parts) if d is not None]
        else:
            out.append(_response_dict(message))
    return out


def _text(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _response(message: dict[str, Any], names: dict[str, str]) -> ModelResponse:
    """An assistant dict as a ``ModelResponse``; ``names`` learns each call's tool name."""
    reply: list[ModelResponsePart] = []
    if message.get("content"):
        reply.append(TextPart(content=_text(message["content"])))
    for call in message.get("tool_calls") or []:
        function = call["function"]
        names[call["id"]] = function["name"]
        arguments = function.get("arguments") or "{}"
        reply.append(
            ToolCallPart(tool_name=function["name"], args=arguments, tool_call_id=call["id"])
        )
    return ModelResponse(parts=reply)


def _request_part(message: dict[str, Any], names: dict[str, str]) -> ModelRequestPart:
    """A system, tool or user dict as a part of a ``ModelRequest``."""
    role, content = message["role"], message["content"]
    if role == "system":
        return SystemPromptPart(content=_text(content))
    if role == "tool":
        call_id = message["tool_call_id"]
        name = names.get(call_id) or message.get("name") or "tool"
        return ToolReturnPart(tool_name=name, content=_text(content), tool_call_id=call_id)
    if isinstance(content, str):
        return UserPromptPart(content=content)
    # Each text part stays its own item, so a recall block never runs into the question.
    return UserPromptPart(content=[p.get("text", "") for p in content if isinstance(p, dict)])


def to_pydantic_ai(
    messages: Sequence[dict[str, Any]], instructions: str | None = None
) -> list[ModelMessage]:
    """OpenAI chat dicts as pydantic-ai messages: consecutive system/user/tool dicts form one
    ``ModelRequest`` (carrying ``instructions``), each assistant dict a ``ModelResponse``."""
    out: list[ModelMessage] = []
    names: dict[str, str] = {}  # tool call id → tool name, from the calls seen so far
    parts: list[ModelRequestPart] = []
    for message in messages:
        if message["role"] != "assistant":
            parts.append(_request_part(message, names))
            continue
        if parts:
            out.append(ModelRequest(parts=parts, instructions=instructions))
            parts = []
        out.append(_response(message, names))
    if parts:
        out.append(ModelRequest(parts=parts, instructions=instructions))
    return out


class HistoryProcessor:
    """The processor ``history_processor`` returns; ``raw_history`` is the run's raw history."""

    def __init__(self, engine: MemoryEngine, session_id: str, user_id: str | None) -> None:
        self.engine, self.session_id, self.user_id = engine, session_id, user_id
        self.raw_history: list[ModelMessage] = []
        self._shown: list[ModelMessage] = []
        self._lock = threading.Lock()

    def _raw(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The raw history behind ``messages``: the view returned last time, then what is new."""
        n = len(self._shown)
        if n and len(messages) >= n and all(map(operator.is_, messages, self._shown)):
            return [*self.raw_history, *messages[n:]]
        return list(messages)

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        with self._lock:
            raw = self._raw(messages)
            history = from_pydantic_ai(raw)
            prepared = self.engine.prepare(
                history, session_id=self.session_id, user_id=self.user_id
            )
            if self.user_id is not None:
                self.engine.after_turn(history, session_id=self.session_id, user_id=self.user_id)
            given = [m.instructions for m in raw if isinstance(m, ModelRequest) and m.instructions]
            shown = to_pydantic_ai(prepared.messages, given[-1] if given else None)
            self.raw_history, self._shown = raw, shown
            return list(shown)


def history_processor(
    engine: MemoryEngine, session_id: str, user_id: str | None = None
) -> HistoryProcessor:
    """A pydantic-ai history processor keeping every model request inside the engine's budget."""
    return HistoryProcessor(engine, session_id, user_id)


def memory_toolset(
    engine: MemoryEngine, session_id: str, user_id: str | None = None
) -> FunctionToolset[Any]:
    """The engine's tools (recall, and search when available) for ``Agent(toolsets=[...])``."""

    def tool(schema: dict[str, Any]) -> Tool[Any]:
        function = schema["function"]
        name = function["name"]

        def run(**arguments: Any) -> str:
            return call_tool(engine, name, arguments, session_id=session_id, user_id=user_id)

        return Tool.from_schema(
            run, name=name, description=function["description"], json_schema=function["parameters"]
        )

    return FunctionToolset([tool(schema) for schema in memory_tools(engine)])
