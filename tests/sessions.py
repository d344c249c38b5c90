"""Shared test helpers: deterministic simulated sessions, tool loops, the CLI runner."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragent_memory import LLMError
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.summary.offline import OfflineSummarizer
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "config" / "ragent-memory.yaml"  # the documented default config


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def chat(*said: str) -> list[dict[str, Any]]:
    """A history: the system prompt, then each user message followed by a short answer."""
    history: list[dict[str, Any]] = [SYSTEM]
    for text in said:
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return history


def query(db_path: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows straight from the SQLite file."""
    with sqlite3.connect(db_path) as db:
        found = db.execute(sql, params).fetchall()
    db.close()
    return found


def user(text: str) -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": text}


def tool_loop(
    call_id: str, result: str, *, name: str = "search_knowledge", arguments: str = "{}"
) -> list[dict[str, Any]]:
    """An assistant message with one tool call and the tool message answering it."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def run_cli(
    *args: str, cwd: Path = ROOT, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m ragent_memory ARGS`` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "ragent_memory", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


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


def without_recall(message: dict[str, Any]) -> dict[str, Any]:
    """The message as the user wrote it: a recall block (docs/design.md §9b), when the engine put one
    in front of the final user message, taken off (the user's own content follows it)."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return message
    first = content[0]
    if not (isinstance(first, dict) and str(first.get("text", "")).startswith("[Excerpts of")):
        return message
    rest = content[1:]
    own = rest[0]["text"] if len(rest) == 1 and rest[0].get("type") == "text" else rest
    return {**message, "content": own}


class LateSummarizer(OfflineSummarizer):
    """A model that answers only once ``landed`` is set (at most 30 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.landed = threading.Event()

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        self.landed.wait(30)
        return super().summarize(request)


CONSTRAINT = "Plan the offsite for my team. Never exceed 4,321 euros in total."


class CountingSummarizer:
    """The offline summarizer, counting calls (and optionally blocking or failing)."""

    name = "counting"

    def __init__(self, *, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.calls = 0
        self.fail = fail
        self.gate = gate
        self.offline = OfflineSummarizer()

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(timeout=30)
        if self.fail:
            raise LLMError("endpoint down", attempts=3)
        return self.offline.summarize(request)

    def close(self) -> None:
        return None


def build_history(turns: int, *, seed: int = 1) -> list[dict[str, Any]]:
    """A finished history of ``turns`` RAG turns (no engine involved)."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [{"role": "user", "content": CONSTRAINT}]
    for turn in range(turns):
        history.extend(rag_turn(turn, rng))
    return history


def run_session(
    engine: MemoryEngine,
    turns: int,
    *,
    seed: int = 1,
    history: list[dict[str, Any]] | None = None,
    check: Callable[[int, Any], None] | None = None,
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    history = (
        history
        if history is not None
        else [
            {"role": "system", "content": "You are a planning assistant."},
            {"role": "user", "content": CONSTRAINT},
            {"role": "assistant", "content": "Understood."},
        ]
    )
    for turn in range(turns):
        messages = rag_turn(turn, rng)
        history.append(messages[0])
        prepared = engine.prepare(history, session_id="s1", user_id="u1")
        if check is not None:
            check(turn, prepared)
        history.extend(messages[1:])
    return history


def rows(db_path: str) -> list[dict[str, Any]]:
    """The compactions table, read straight from the SQLite file."""
    with sqlite3.connect(db_path) as db:
        db.row_factory = sqlite3.Row
        found = [dict(r) for r in db.execute("SELECT * FROM compactions ORDER BY id")]
    db.close()
    return found
