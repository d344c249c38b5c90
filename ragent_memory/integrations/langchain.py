"""LangChain: ``RagentMemoryMiddleware(engine)`` for ``langchain.agents.create_agent``.

::

    agent = create_agent(model, tools=[...], middleware=[RagentMemoryMiddleware(engine)])
    agent.invoke({"messages": history}, {"configurable": {"thread_id": "t1", "user_id": "u1"}})

Every model call sees ``engine.prepare`` of the agent's messages (session = the run config's
``configurable.thread_id``, user = ``configurable.user_id``); the agent's state keeps the raw
history, and after each model call the history and the reply go to ``after_turn``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.messages import convert_to_openai_messages as _to_openai
from langchain_core.messages.utils import convert_to_messages
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_config

from ragent_memory.core.inputs import Inputs
from ragent_memory.engine.memory_engine import MemoryEngine, PreparedContext
from ragent_memory.engine.tools import call_tool, memory_tools

__all__ = ["RagentMemoryMiddleware", "from_langchain", "to_langchain"]


def from_langchain(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as an OpenAI chat dict; a list of parts stays a list (LangChain's
    string form joins them with newlines the budget never saw, §9b)."""
    if isinstance(message.content, list):
        return dict(_to_openai(message, text_format="block"))
    return dict(_to_openai(message))


def to_langchain(messages: list[dict[str, Any]]) -> list[BaseMessage]:
    """OpenAI chat dicts as LangChain messages."""
    return list(convert_to_messages(messages))


def _ids() -> tuple[str, str | None]:
    configurable = get_config().get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise ValueError(
            "RagentMemoryMiddleware needs the session: invoke the agent with "
            "config={'configurable': {'thread_id': ..., 'user_id': ...}}"
        )
    user_id = configurable.get("user_id")
    return str(thread_id), None if user_id is None else str(user_id)


def _tool(engine: MemoryEngine, schema: dict[str, Any]) -> BaseTool:
    function = schema["function"]
    name = function["name"]

    def run(**arguments: Any) -> str:
        session_id, user_id = _ids()
        return call_tool(engine, name, arguments, session_id=session_id, user_id=user_id)

    return StructuredTool.from_function(
        func=run, name=name, description=function["description"], args_schema=function["parameters"]
    )


class RagentMemoryMiddleware(AgentMiddleware):
    """Keeps every model call of a LangChain agent inside the engine's budget."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__()
        self.engine = engine
        self.tools = [_tool(engine, schema) for schema in memory_tools(engine)]
        self._inputs = Inputs(convert=from_langchain)

    def _history(self, request: ModelRequest) -> list[dict[str, Any]]:
        system = [request.system_message] if request.system_message is not None else []
        return list(self._inputs.accept([*system, *request.messages]))

    @staticmethod
    def _request(request: ModelRequest, prepared: PreparedContext) -> ModelRequest:
        messages: list[Any] = to_langchain(prepared.messages)
        system = None
        if request.system_message is not None and isinstance(messages[0], SystemMessage):
            system, messages = messages[0], messages[1:]
        return request.override(messages=messages, system_message=system)

    def _learned(self, history: list[dict[str, Any]], response: Any) -> list[dict[str, Any]]:
        replies = response.result if isinstance(response, ModelResponse) else [response]
        return [*history, *(from_langchain(m) for m in replies if isinstance(m, AIMessage))]

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Any]) -> Any:
        session_id, user_id = _ids()
        history = self._history(request)
        prepared = self.engine.prepare(history, session_id=session_id, user_id=user_id)
        response = handler(self._request(request, prepared))
        if user_id is not None:
            self.engine.after_turn(
                self._learned(history, response), session_id=session_id, user_id=user_id
            )
        return response

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]
    ) -> Any:
        session_id, user_id = _ids()
        history = self._history(request)
        prepared = await self.engine.aprepare(history, session_id=session_id, user_id=user_id)
        response = await handler(self._request(request, prepared))
        if user_id is not None:
            await self.engine.aafter_turn(
                self._learned(history, response), session_id=session_id, user_id=user_id
            )
        return response
