"""The recall tool: lets the model read back the original behind a placeholder or preview
(docs/design.md §8).

Whatever the model passes, :func:`recall_slice` answers with text it can read: the slice and a
footer (``FOOTER_MARK`` …) saying how much remains, or a clear refusal. It never raises and
never reveals whether a ref exists in another session.
"""

from __future__ import annotations

import re
from typing import Any

from ragent_memory.settings import is_int

RECALL_TOOL_NAME = "recall_tool_result"
DEFAULT_LIMIT = 8_000
FOOTER_MARK = "\n[recall: "  # starts the footer after a slice; refusals start with "[recall: "
REF_PATTERN = re.compile(r"\brm-[0-9a-f]{20}\b")  # the shape of Store.ref_for


def tool_schema(
    name: str, description: str, required: list[str], **properties: dict[str, Any]
) -> dict[str, Any]:
    """An OpenAI function tool's schema: its parameters are ``properties``, no others."""
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def integer(minimum: int, default: int, description: str, **more: int) -> dict[str, Any]:
    """A tool's integer parameter."""
    return {
        "type": "integer",
        "minimum": minimum,
        **more,
        "default": default,
        "description": description,
    }


def recall_tool_schema() -> dict[str, Any]:
    """The OpenAI tool schema of ``recall_tool_result(ref, offset=0, limit=8000)``."""
    return tool_schema(
        RECALL_TOOL_NAME,
        "Read back the full text of an earlier tool result (or tool input) that the context "
        "shows only as a placeholder or a truncated preview. Pass the recall ref it names; "
        "page through long texts with offset and limit.",
        ["ref"],
        ref={"type": "string", "description": "The recall ref, e.g. rm-…"},
        offset=integer(0, 0, "First character to return."),
        limit=integer(1, DEFAULT_LIMIT, "How many characters to return at most."),
    )


def find_refs(text: str) -> list[str]:
    """The recall refs named in ``text`` (a placeholder or a preview notice), in order."""
    return REF_PATTERN.findall(text)


def recall_slice(original: str | None, ref: object, offset: Any, limit: Any) -> str:
    """The text the model reads for a recall call: the slice and a footer, or a refusal."""
    if original is None:
        return f"[recall: ref {ref!r} not found in this session (unknown, expired or dropped)]"
    if not is_int(offset) or offset < 0:
        return f"[recall: offset must be an integer ≥ 0, got {offset!r}]"
    if not is_int(limit) or limit < 1:
        return f"[recall: limit must be an integer ≥ 1, got {limit!r}]"
    if offset >= len(original) and original:
        return (
            f"[recall: offset {offset} is past the end; the text has {len(original)} chars, "
            f"use an offset below {len(original)}]"
        )
    piece = original[offset : offset + limit]
    end = offset + len(piece)
    remaining = len(original) - end
    if remaining > 0:
        return (
            f"{piece}{FOOTER_MARK}chars {offset}–{end} of {len(original)}; {remaining} remain, "
            f"call again with offset={end}]"
        )
    return f"{piece}{FOOTER_MARK}end of text, chars {offset}–{end} of {len(original)}]"
