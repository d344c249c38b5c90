"""Reading transcripts (JSON array or JSONL of OpenAI messages) and replaying them turn by turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragent_memory.core.chars import validate_messages
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import InvalidMessagesError


def read_transcript(path: str | Path) -> list[dict[str, Any]]:
    """Messages from a JSON array, a ``{"messages": [...]}`` object, or JSON Lines."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InvalidMessagesError(
            None, f"{path}: not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x})"
        ) from None
    stripped = text.lstrip()
    if not stripped:
        raise InvalidMessagesError(None, f"{path}: the file is empty")
    if stripped[0] in "[{" and not _looks_like_jsonl(stripped):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InvalidMessagesError(
                None, f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
            ) from None
        if isinstance(data, dict) and isinstance(data.get("messages"), list):
            data = data["messages"]
        elif isinstance(data, dict) and "role" in data:  # JSON Lines with a single message
            data = [data]
    else:
        data = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InvalidMessagesError(
                    None, f"{path}: invalid JSON on line {number}: {err.msg}"
                ) from None
    validate_messages(data)
    return list(data)


def _looks_like_jsonl(text: str) -> bool:
    first = text.split("\n", 1)[0].strip()
    if not first.startswith("{"):
        return False
    try:
        json.loads(first)
    except json.JSONDecodeError:
        return False
    return "\n" in text.strip()


# The report's fields in each turn of ``replay``'s result.
_REPORTED_FIELDS = """chars_raw chars_in chars_out trimmed truncated reclaimed_chars compacted
    skipped_reason generation memory_chars"""
_REPORTED = tuple(_REPORTED_FIELDS.split())


def replay(
    engine: MemoryEngine, messages: list[dict[str, Any]], *, session_id: str, user_id: str | None
) -> dict[str, Any]:
    """Prepare the context at every user message, as an agent would before each model call,
    then record the transcript as its ``after_turn`` would (facts, the recall index)."""
    turns = []
    prepared = None
    for index, message in enumerate(messages):
        is_last = index == len(messages) - 1
        if message.get("role") != "user" and not is_last:
            continue
        prepared = engine.prepare(messages[: index + 1], session_id=session_id, user_id=user_id)
        report = prepared.report
        fields = {k: getattr(report, k) for k in _REPORTED}
        duration_ms = round(report.duration_ms, 3)
        turns.append({"message_index": index, **fields, "duration_ms": duration_ms})
    view = prepared.messages if prepared else []
    engine.after_turn(messages, session_id=session_id, user_id=user_id)
    return {"session_id": session_id, "messages": view, "turns": turns}
