"""Hypothesis strategies: chat histories with tool loops, evictable and not."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TOOLS = ("search_knowledge", "run_sql", "search_knowledge")

texts = st.text(alphabet="abcdefghij klmn。你好", min_size=0, max_size=40)


@st.composite
def tool_loop(draw: st.DrawFn, loop_id: int) -> list[dict[str, Any]]:
    """An assistant message with 1–3 tool calls and a result for each."""
    calls = []
    results = []
    for k in range(draw(st.integers(1, 3))):
        call_id = f"c{loop_id}_{k}"
        name = draw(st.sampled_from(TOOLS))
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"q": draw(texts)})},
            }
        )
        size = draw(st.integers(0, 3_000))
        results.append({"role": "tool", "tool_call_id": call_id, "content": "r" * size})
    assistant = {"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls}
    return [assistant, *results]


@st.composite
def conversations(draw: st.DrawFn, *, max_turns: int = 12) -> list[dict[str, Any]]:
    """System prompt, then turns: a user message, 0–3 tool loops, maybe a final answer.
    The last turn may stop in the middle of its tool loops (current turn)."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "persona"})
    loop_id = 0
    for _ in range(draw(st.integers(0, max_turns))):
        messages.append({"role": "user", "content": draw(texts) or "q"})
        for _ in range(draw(st.integers(0, 3))):
            messages.extend(draw(tool_loop(loop_id)))
            loop_id += 1
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(texts)})
    if draw(st.booleans()):
        messages.extend(draw(tool_loop(loop_id)))  # tool loops with no user message after
    return messages
