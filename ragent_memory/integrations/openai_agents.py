"""OpenAI Agents SDK: ``RagentSession(engine, session_id, user_id=None)``.

::

    session = RagentSession(engine, "s1", "u1")
    agent = Agent(name="support", instructions="…", tools=[*my_tools, *session.tools()])
    result = await Runner.run(agent, "question", session=session, run_config=session.run_config())

The session keeps the raw items (``session.items``); ``get_items()`` and the
``call_model_input_filter`` of ``run_config()`` give the SDK ``engine.prepare``'s view, for every
model call of a run. ``add_items`` feeds ``after_turn``. Items the chat format has no place for
(reasoning, hosted tool calls) stay in the raw history but are not shown to the model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from agents import FunctionTool, RunConfig, RunContextWrapper
from agents.memory import SessionABC
from agents.run_config import CallModelData, ModelInputData

from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.engine.tools import call_tool, memory_tools

__all__ = ["RagentSession", "from_items", "to_items"]


def _texts(content: Any) -> list[str]:
    """The text parts of ``content`` (a string is one part; parts without text are left out)."""
    if isinstance(content, str) or content is None:
        return [content or ""]
    texts = (
        part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        for part in content
    )
    return [str(text) for text in texts if text is not None]


def _text(content: Any) -> str:
    return "".join(_texts(content))


def _content(content: Any, part_type: str | None) -> str | list[dict[str, str]]:
    """One text as a string; several (the recall block ahead of the user's words, §9b) stay
    separate parts of ``part_type`` so the model reads them apart, or are joined (None)."""
    texts = _texts(content)
    if len(texts) <= 1 or part_type is None:
        return "".join(texts)
    return [{"type": part_type, "text": text} for text in texts]


def from_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Responses-API input items as chat dicts (function calls in a row form one message)."""
    out: list[dict[str, Any]] = []
    for raw in items:
        item = raw if isinstance(raw, dict) else dict(raw.model_dump(exclude_none=True))
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _content(item.get("content"), "text")})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return out


def to_items(messages: Sequence[dict[str, Any]]) -> list[Any]:
    """Chat dicts as Responses-API input items."""
    out: list[Any] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": _text(message["content"]),
                }
            )
            continue
        if message.get("content"):
            part_type = None if role == "assistant" else "input_text"
            out.append({"role": role, "content": _content(message["content"], part_type)})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            out.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function.get("arguments") or "{}",
                }
            )
    return out


class RagentSession(SessionABC):
    """An Agents SDK session whose model input is always ``engine.prepare``'s view."""

    def __init__(self, engine: MemoryEngine, session_id: str, user_id: str | None = None) -> None:
        self.engine, self.session_id, self.user_id = engine, session_id, user_id
        self.items: list[Any] = []  # the raw history, as the SDK handed it over
        self._lock = asyncio.Lock()
        # The view get_items() last returned, and the raw items it was prepared from.
        self._shown: list[dict[str, Any]] = []
        self._shown_raw: list[Any] = []
        self._instructions: str | None = None  # the agent's, as the last run gave them

    async def _view(
        self, raw: Sequence[Any], instructions: str | None
    ) -> tuple[str | None, list[dict[str, Any]]]:
        """The prepared view of ``raw`` behind ``instructions`` as a system message, and the
        instructions as prepared (the view's leading system message, split off again)."""
        history = from_items(raw)
        if instructions:
            history = [{"role": "system", "content": instructions}, *history]
        prepared = await self.engine.aprepare(
            history, session_id=self.session_id, user_id=self.user_id
        )
        messages = prepared.messages
        if instructions and messages and messages[0]["role"] == "system":
            return _text(messages[0]["content"]), messages[1:]
        return instructions, messages

    async def get_items(self, limit: int | None = None) -> list[Any]:
        if limit is not None:  # the SDK peeking at what it stored: the raw tail
            return list(self.items[-limit:]) if limit > 0 else []
        async with self._lock:
            raw = list(self.items)
        # With the last run's instructions: the shape the input filter gives the engine, since
        # a history gaining and losing its first message would undo every compaction.
        _, messages = await self._view(raw, self._instructions)
        shown = to_items(messages)
        self._shown, self._shown_raw = from_items(shown), raw
        return shown

    async def add_items(self, items: list[Any]) -> None:
        async with self._lock:
            self.items.extend(items)
            raw = list(self.items)
        if self.user_id is not None:
            await self.engine.aafter_turn(
                from_items(raw), session_id=self.session_id, user_id=self.user_id
            )

    async def pop_item(self) -> Any | None:
        async with self._lock:
            return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        async with self._lock:
            self.items.clear()
        self.engine.drop_session(self.session_id)

    async def filter_model_input(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig.call_model_input_filter``: the run's input (the prepared history plus
        this run's items) becomes the prepared view of the raw history plus this run's items."""
        given = list(data.model_data.input)
        converted = from_items(given)
        n = len(self._shown)
        if converted[:n] == self._shown:  # the history get_items() gave, then this run's items
            raw = [*self._shown_raw, *to_items(converted[n:])]
        else:  # not this session's history: prepare what was given
            raw = given
        self._instructions = data.model_data.instructions
        instructions, messages = await self._view(raw, self._instructions)
        return ModelInputData(input=to_items(messages), instructions=instructions)

    def run_config(self, **kwargs: Any) -> RunConfig:
        """A ``RunConfig`` (with ``kwargs``) whose model input filter is this session's."""
        return RunConfig(call_model_input_filter=self.filter_model_input, **kwargs)

    def tools(self) -> list[FunctionTool]:
        """The engine's tools (recall, and search when available) as SDK function tools."""

        def tool(schema: dict[str, Any]) -> FunctionTool:
            function = schema["function"]
            name = function["name"]

            async def invoke(_context: RunContextWrapper[Any], arguments: str) -> str:
                return await asyncio.to_thread(
                    call_tool,
                    self.engine,
                    name,
                    arguments,
                    session_id=self.session_id,
                    user_id=self.user_id,
                )

            return FunctionTool(
                name=name,
                description=function["description"],
                params_json_schema=function["parameters"],
                on_invoke_tool=invoke,
                strict_json_schema=False,
            )

        return [tool(schema) for schema in memory_tools(self.engine)]
