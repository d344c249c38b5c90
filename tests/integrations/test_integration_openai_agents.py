"""OpenAI Agents SDK agent with ``RagentSession`` and a scripted model."""

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
from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ragent_memory import MemoryEngine, Settings
from ragent_memory.integrations.openai_agents import RagentSession, from_items, to_items

B = 20_000


class Scripted(Model):
    """``agent_script.reply`` over what the SDK sends; records every input as chat dicts."""

    def __init__(self, policy: Callable[..., dict[str, Any]] = reply) -> None:
        self.seen: list[list[dict[str, Any]]] = []
        self.policy = policy

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        shown = from_items(items)
        if system_instructions:
            shown.insert(0, {"role": "system", "content": system_instructions})
        self.seen.append(shown)
        answer = self.policy(shown, len(self.seen))
        output: list[Any] = [
            ResponseFunctionToolCall(
                type="function_call", call_id=c["id"], name=c["function"]["name"],
                arguments=c["function"]["arguments"],
            )
            for c in answer.get("tool_calls") or []
        ]  # fmt: skip
        if answer.get("content"):
            text = ResponseOutputText(type="output_text", text=answer["content"], annotations=[])
            output.append(
                ResponseOutputMessage(
                    id=f"m{len(self.seen)}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            )
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def search_knowledge(query: str, turn: int) -> str:
    """Search the knowledge base."""
    return search_result(query, turn)


@pytest.mark.slow
def test_200_turn_agent_stays_in_budget_recalls_and_remembers(
    make_settings: Callable[..., Settings],
) -> None:
    """Inputs ≤ B on every call, recall round-trips, a fact of session s1 shows in session s2."""
    model = Scripted()
    with MemoryEngine(make_settings(context_window_chars=B)) as engine:
        session, other = RagentSession(engine, "s1", "u1"), RagentSession(engine, "s2", "u1")
        agent = Agent(
            name="support", instructions="You answer from the docs.", model=model,
            tools=[search_knowledge, *session.tools()],
        )  # fmt: skip

        async def drive() -> None:
            for turn in range(200):
                await Runner.run(
                    agent,
                    question(turn),
                    session=session,
                    run_config=session.run_config(tracing_disabled=True),
                )
            engine.flush()
            await Runner.run(
                agent,
                question(200),
                session=other,
                run_config=other.run_config(tracing_disabled=True),
            )

        asyncio.run(drive())
        audit = engine.store.compactions("s1")
    check_agent_run(model.seen, from_items(session.items), audit, B)


def test_items_round_trip_through_chat_dicts() -> None:
    """Chat dicts → Responses items → chat dicts keeps roles, calls and results."""
    dicts = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "s", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]
    assert dicts == from_items(to_items(dicts))


def test_recall_block_stays_a_part_of_its_own() -> None:
    """A user message with the recall block ahead of the question (§9b) reaches the model as
    two input_text parts, not one run-on text where the excerpts read as the question."""
    block, asked = "[Excerpts of earlier conversation …] Turn 0: …", "Turn 7: refunds?"
    dicts = [{"role": "user", "content": [{"type": "text", "text": t} for t in (block, asked)]}]
    items = to_items(dicts)
    assert [{"type": "input_text", "text": block}, {"type": "input_text", "text": asked}] == (
        items[0]["content"]
    )
    assert dicts == from_items(items)
    assert [{"role": "user", "content": asked}] == from_items(
        [{"role": "user", "content": [{"type": "input_text", "text": asked}]}]
    )


def test_recall_tool_refuses_bad_arguments(make_settings: Callable[..., Settings]) -> None:
    """Arguments that are not a JSON object get a one-line refusal, not an exception."""
    with MemoryEngine(make_settings()) as engine:
        (recall, *_) = RagentSession(engine, "s1").tools()
        answer = asyncio.run(recall.on_invoke_tool(None, "not json"))  # type: ignore[arg-type]
        assert answer.startswith("[recall_tool_result: arguments must be a JSON object")


def test_search_memory_round_trips(make_settings: Callable[..., Settings]) -> None:
    """The model's search_memory call (limit as text, an extra key) is answered with the
    user's earlier session."""
    model = Scripted(search_reply)
    with MemoryEngine(make_settings()) as engine:
        first, second = RagentSession(engine, "s1", "u1"), RagentSession(engine, "s2", "u1")

        async def drive() -> None:
            for session, text in ((first, LOCKER), (second, ASK_CODE)):
                agent = Agent(name="support", model=model, tools=session.tools())
                config = session.run_config(tracing_disabled=True)
                await Runner.run(agent, text, session=session, run_config=config)
                engine.flush()

        asyncio.run(drive())
    assert "locker code is 4417" in searched(model.seen)
