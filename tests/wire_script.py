"""What a scripted upstream answers in the Anthropic Messages and OpenAI Responses formats:
whole replies and SSE streams written as the providers write them, for
``FakeOpenAI`` to send."""

from __future__ import annotations

import json
from typing import Any

from fake_openai import Answer

# ---------------------------------------------------------------------- Anthropic Messages


def message(blocks: list[dict[str, Any]], stop: str | None = None) -> dict[str, Any]:
    """A Messages API reply holding ``blocks``."""
    uses = any(b["type"] == "tool_use" for b in blocks)
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": blocks,
        "stop_reason": stop or ("tool_use" if uses else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def anthropic_reply(blocks: list[dict[str, Any]]) -> Answer:
    return Answer(payload=message(blocks))


def _event(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_events(blocks: list[dict[str, Any]], *, pieces: int = 3) -> list[bytes]:
    """The SSE stream of a reply holding ``blocks``: text, thinking and tool input each in
    ``pieces`` deltas, the signature in one."""
    start = {**message([]), "stop_reason": None}
    events = [_event({"type": "message_start", "message": start}), _event({"type": "ping"})]
    for index, block in enumerate(blocks):
        events += _block_events(index, block, pieces)
    done = message(blocks)
    events.append(
        _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": done["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 5},
            }
        )
    )
    events.append(_event({"type": "message_stop"}))
    return events


def split(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _block_events(index: int, block: dict[str, Any], pieces: int) -> list[bytes]:
    kind = block["type"]
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        opening = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": t} for t in split(block["text"], pieces)]
    elif kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": t} for t in split(block["thinking"], pieces)
        ]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        opening = {**block, "input": {}}
        text = json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": t} for t in split(text, pieces)]
    else:
        opening = block
    events = [_event({"type": "content_block_start", "index": index, "content_block": opening})]
    events += [_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
    events.append(_event({"type": "content_block_stop", "index": index}))
    return events


def thinking(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


# ---------------------------------------------------------------------- OpenAI Responses


def response(output: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    """A Responses API reply holding ``output``."""
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "gpt-fake",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }


def responses_reply(output: list[dict[str, Any]]) -> Answer:
    return Answer(payload=response(output))


def text_item(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def call_item(call_id: str, name: str, arguments: str, item_id: str = "fc_1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def reasoning_item(item_id: str, encrypted: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "encrypted_content": encrypted}


def responses_events(output: list[dict[str, Any]], *, pieces: int = 3) -> list[bytes]:
    """The SSE stream of a reply holding ``output``, as the Responses API writes it."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response([], "in_progress")},
        {"type": "response.in_progress", "response": response([], "in_progress")},
    ]
    for index, item in enumerate(output):
        events += _item_events(index, item, pieces)
    events.append({"type": "response.completed", "response": response(output)})
    return [_event({**e, "sequence_number": n}) for n, e in enumerate(events)]


def _item_events(index: int, item: dict[str, Any], pieces: int) -> list[dict[str, Any]]:
    at = {"output_index": index}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        where = {**at, "item_id": item["id"], "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        return [
            {"type": "response.output_item.added", **at, "item": {**item, "content": []}},
            {"type": "response.content_part.added", **where, "part": empty},
            *(
                {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                for piece in split(text, pieces)
            ),
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": item["content"][0]},
            {"type": "response.output_item.done", **at, "item": item},
        ]
    if item["type"] == "function_call":
        where = {**at, "item_id": item["id"]}
        return [
            {"type": "response.output_item.added", **at, "item": {**item, "arguments": ""}},
            *(
                {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                for piece in split(item["arguments"], pieces)
            ),
            {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": item["arguments"],
            },
            {"type": "response.output_item.done", **at, "item": item},
        ]
    return [
        {"type": "response.output_item.added", **at, "item": item},
        {"type": "response.output_item.done", **at, "item": item},
    ]
