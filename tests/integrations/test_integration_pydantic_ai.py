"""pydantic-ai ``Agent`` with ``history_processor`` and a scripted ``FunctionModel``."""

from __future__ import annotations

import asyncio
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
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ragent_memory import MemoryEngine, Settings
from ragent_memory.integrations.pydantic_ai import (
    from_pydantic_ai,
    history_processor,
    memory_toolset,
    to_pydantic_ai,
)

B = 20_000


class Script:
    """The scripted model: ``agent_script.reply`` over what pydantic-ai shows it."""

    def __init__(self, policy: Callable[..., dict[str, Any]] = reply) -> None:
        self.seen: list[list[dict[str, Any]]] = []
        self.policy = policy

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        shown = from_pydantic_ai(messages)
        self.seen.append(shown)
        (response,) = to_pydantic_ai([self.policy(shown, len(self.seen))])
        assert isinstance(response, ModelResponse)
        return response


def search_knowledge(query: str, turn: int) -> str:
    """Search the knowledge base."""
    return search_result(query, turn)


def _agent(engine: MemoryEngine, script: Script, session_id: str) -> tuple[Agent[None, str], Any]:
    processor = history_processor(engine, session_id, "u1")
    agent = Agent(
        FunctionModel(script),
        system_prompt="You answer from the docs.",
        tools=[search_knowledge],
        toolsets=[memory_toolset(engine, session_id, "u1")],
        capabilities=[ProcessHistory(processor)],
    )
    return agent, processor


@pytest.mark.slow
def test_200_turn_agent_stays_in_budget_recalls_and_remembers(
    make_settings: Callable[..., Settings],
) -> None:
    """Inputs ≤ B on every call, recall round-trips, a fact of session s1 shows in session s2."""
    script = Script()
    with MemoryEngine(make_settings(context_window_chars=B)) as engine:
        agent, processor = _agent(engine, script, "s1")
        other, _ = _agent(engine, script, "s2")

        async def drive() -> None:  # one event loop for the whole session, closed at the end
            history: list[ModelMessage] = []
            for turn in range(200):
                history = (await agent.run(question(turn), message_history=history)).all_messages()
            engine.flush()
            await other.run(question(200))

        asyncio.run(drive())
        audit = engine.store.compactions("s1")
    check_agent_run(script.seen, from_pydantic_ai(processor.raw_history), audit, B)


def test_round_trip_keeps_roles_tool_calls_and_results() -> None:
    """Chat dicts → pydantic-ai messages → chat dicts is the identity for the usual shapes."""
    dicts = [
        {"role": "system", "content": "persona"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "s", "arguments": '{"a":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "s", "content": "r"},
        {"role": "assistant", "content": "done"},
    ]
    assert dicts == from_pydantic_ai(to_pydantic_ai(dicts))


def test_user_text_parts_stay_apart() -> None:
    """A user message's text parts (a recall block, then the question) stay separate items."""
    block = {"type": "text", "text": "[earlier conversation] Locker 7 code 4417"}
    dicts = [{"role": "user", "content": [block, {"type": "text", "text": "What is the code?"}]}]
    (request,) = to_pydantic_ai(dicts)
    assert ["[earlier conversation] Locker 7 code 4417", "What is the code?"] == list(
        request.parts[0].content  # type: ignore[union-attr]
    )
    assert dicts == from_pydantic_ai([request])


def test_toolset_answers_untrusted_arguments(make_settings: Callable[..., Settings]) -> None:
    """The recall tool ignores unknown keys and refuses a missing ref in one line."""
    with MemoryEngine(make_settings()) as engine:
        toolset = memory_toolset(engine, "s1")
        (recall,) = [t for name, t in toolset.tools.items() if name == "recall_tool_result"]
        answer = asyncio.run(recall.function_schema.call({"why": "x"}, None))  # type: ignore[arg-type]
        assert answer.startswith('[recall: "ref" is required') and "\n" not in answer


def test_search_memory_round_trips(make_settings: Callable[..., Settings]) -> None:
    """The model's search_memory call (limit as text, an extra key) is answered with the
    user's earlier session."""
    script = Script(search_reply)
    with MemoryEngine(make_settings()) as engine:
        first, _ = _agent(engine, script, "s1")
        second, _ = _agent(engine, script, "s2")

        async def drive() -> None:
            await first.run(LOCKER)
            engine.flush()
            await second.run(ASK_CODE)

        asyncio.run(drive())
    assert "locker code is 4417" in searched(script.seen)
