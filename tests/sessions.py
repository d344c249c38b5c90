"""Deterministic simulated agent sessions for tests."""

from __future__ import annotations

import json
import random
from typing import Any

TOPICS = (
    "refund policy",
    "shipping times",
    "warranty terms",
    "invoice format",
    "api limits",
    "data retention",
    "sso setup",
    "pricing tiers",
    "on-call rota",
    "backup schedule",
)


def rag_turn(turn: int, rng: random.Random) -> list[dict[str, Any]]:
    """One RAG turn: a question, a search_knowledge call, a 1–3k-char result, an answer."""
    topic = TOPICS[turn % len(TOPICS)]
    call_id = f"call_{turn}"
    body = " ".join(
        f"Doc {turn}-{k}: the {topic} section says item {rng.randint(1, 999)} applies."
        for k in range(rng.randint(18, 55))
    )
    return [
        {"role": "user", "content": f"Turn {turn}: what do the docs say about {topic}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "search_knowledge",
                        "arguments": json.dumps({"query": topic, "turn": turn}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": body},
        {
            "role": "assistant",
            "content": f"According to the docs on {topic}, item {turn} applies. "
            "I will check the next question.",
        },
    ]
