"""LangChain ``create_agent`` with ``RagentMemoryMiddleware`` and a scripted chat model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from agent_script import (
    ASK_CODE,
    LOCKER,
    check_agent_run,
    question,
    reply,
    search_reply,
    search_result,
    searched,
)
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

from ragent_memory import MemoryEngine, Settings, chars
from ragent_memory.integrations.langchain import (
    RagentMemoryMiddleware,
    from_langchain,
    to_langchain,
)

B = 20_000
TEXT = {"type": "text", "text": "Turn 3: what do the docs say about warranty terms?"}


class ScriptedChatModel(BaseChatModel):
    """Answers by ``agent_script.reply``; records every input it was given (as chat dicts)."""

    seen: list[list[dict[str, Any]]] = Field(default_factory=list)
    policy: Any = reply

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        shown = [from_langchain(m) for m in messages]
        self.seen.append(shown)
        (message,) = to_langchain([self.policy(shown, len(self.seen))])
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def search_knowledge(query: str, turn: int) -> str:
    """Search the knowledge base."""
    return search_result(query, turn)


def _run(agent: Any, thread: str, turns: range, history: list[Any]) -> list[Any]:
    config = {"configurable": {"thread_id": thread, "user_id": "u1"}}
    for turn in turns:
        state = agent.invoke({"messages": [*history, HumanMessage(question(turn))]}, config)
        history = state["messages"]
    return history


@pytest.mark.slow
def test_200_turn_agent_stays_in_budget_recalls_and_remembers(
    make_settings: Callable[..., Settings],
) -> None:
    """Inputs ≤ B on every call, recall round-trips, a fact of thread t1 shows in thread t2."""
    model = ScriptedChatModel()
    with MemoryEngine(make_settings(context_window_chars=B)) as engine:
        middleware = RagentMemoryMiddleware(engine)
        assert {"recall_tool_result"} <= {t.name for t in middleware.tools}
        agent = create_agent(
            model, tools=[search_knowledge], system_prompt="You answer from the docs.",
            middleware=[middleware],
        )  # fmt: skip
        history = _run(agent, "t1", range(200), [])
        engine.flush()
        _run(agent, "t2", range(200, 201), [])
        audit = engine.store.compactions("t1")
    raw = [from_langchain(m) for m in history]
    check_agent_run(model.seen, raw, audit, B)


def test_missing_thread_id_is_a_clear_error(make_settings: Callable[..., Settings]) -> None:
    """Without ``configurable.thread_id`` the middleware says what it needs."""
    with MemoryEngine(make_settings()) as engine:
        agent = create_agent(
            ScriptedChatModel(), tools=[search_knowledge],
            middleware=[RagentMemoryMiddleware(engine)],
        )  # fmt: skip
        with pytest.raises(ValueError, match="thread_id"):
            agent.invoke({"messages": [HumanMessage(question(0))]})


def test_tool_arguments_from_the_model_are_untrusted(
    make_settings: Callable[..., Settings],
) -> None:
    """Unknown keys are ignored and a missing ref gets a one-line refusal, not an exception."""
    with MemoryEngine(make_settings()) as engine:
        (recall,) = [t for t in RagentMemoryMiddleware(engine).tools if t.name.startswith("recall")]
        config = {"configurable": {"thread_id": "t1"}}
        answer = recall.invoke({"ref": "rm-0123456789abcdef0123", "why": "x"}, config)
        assert answer.startswith("[recall: ref") and "\n" not in answer
        assert answer == recall.invoke({"ref": "rm-0123456789abcdef0123"}, config)


def test_search_memory_round_trips(make_settings: Callable[..., Settings]) -> None:
    """The model's search_memory call (limit as text, an extra key) is answered with the
    user's earlier thread."""
    model = ScriptedChatModel(policy=search_reply)
    with MemoryEngine(make_settings()) as engine:
        middleware = RagentMemoryMiddleware(engine)
        agent = create_agent(model, tools=[search_knowledge], middleware=[middleware])
        for thread, text in (("t1", LOCKER), ("t2", ASK_CODE)):
            config = {"configurable": {"thread_id": thread, "user_id": "u1"}}
            agent.invoke({"messages": [HumanMessage(text)]}, config)
            engine.flush()
    assert "locker code is 4417" in searched(model.seen)


def test_text_parts_reach_the_model_at_the_size_the_engine_measured() -> None:
    """A user message whose recall block rides as a leading text part (§9b) is the same
    message after the round trip through LangChain messages: joining its parts with a newline
    once made a view of exactly B chars reach the model as B + 1."""
    parts = [{"type": "text", "text": "[Excerpts of earlier conversation]"}, dict(TEXT)]
    message = {"role": "user", "content": parts}
    (back,) = [from_langchain(m) for m in to_langchain([message])]
    assert message == back
    assert chars(message) == chars(back)
