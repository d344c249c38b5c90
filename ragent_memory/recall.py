"""The recall tool: lets the model read back a trimmed or truncated tool result (DESIGN §8)."""

from __future__ import annotations

from typing import Any

from .reduce import RECALL_TOOL_NAME

DEFAULT_LIMIT = 8_000


def recall_tool_schema() -> dict[str, Any]:
    """The OpenAI tool schema of ``recall_tool_result(ref, offset=0, limit=8000)``."""
    return {
        "type": "function",
        "function": {
            "name": RECALL_TOOL_NAME,
            "description": (
                "Read back the full text of an earlier tool result that the context shows only "
                "as a placeholder or a truncated preview. Pass the recall ref it names; page "
                "through long texts with offset and limit."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "ref": {"type": "string", "description": "The recall ref, e.g. rm-…"},
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "default": 0,
                        "description": "First character to return.",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "default": DEFAULT_LIMIT,
                        "description": "How many characters to return at most.",
                    },
                },
                "required": ["ref"],
                "additionalProperties": False,
            },
        },
    }


def recall_slice(original: str | None, ref: str, offset: Any, limit: Any) -> str:
    """The text the model reads for a recall call: the slice, a footer, or a clear refusal."""
    if original is None:
        return f"[recall: ref {ref!r} not found in this session (unknown, expired or dropped)]"
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return f"[recall: offset must be an integer ≥ 0, got {offset!r}]"
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return f"[recall: limit must be an integer ≥ 1, got {limit!r}]"
    if offset >= len(original) and original:
        return f"[recall: offset {offset} is past the end; the text has {len(original)} chars]"
    piece = original[offset : offset + limit]
    remaining = len(original) - offset - len(piece)
    if remaining > 0:
        footer = (
            f"\n[recall: chars {offset}–{offset + len(piece)} of {len(original)}; {remaining} "
            f"remain, call again with offset={offset + len(piece)}]"
        )
    else:
        footer = f"\n[recall: end of text, {len(original)} chars in all]"
    return piece + footer
