"""Validation of a model's summary (DESIGN §6): finish reason, sections, no echoed nonce,
clamped at a section boundary."""

from __future__ import annotations

from ragent_memory.errors import SummaryError


def section_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("## "))


def validate_summary(
    text: str, *, max_chars: int, nonce: str | None = None, finish_reason: str = "stop"
) -> str:
    """Return the accepted (possibly clipped) summary, or raise SummaryError."""
    if finish_reason != "stop":
        raise SummaryError(f"finish reason {finish_reason!r}, not 'stop'")
    text = text.strip()
    if nonce and nonce.lower() in text.lower():
        raise SummaryError("the summary echoes the fence nonce")
    if section_count(text) < 3:
        raise SummaryError(f"only {section_count(text)} '## ' sections, need at least 3")
    if len(text) > max_chars:
        clip = text.rfind("\n## ", 0, max_chars)
        if clip <= 0:
            raise SummaryError(f"summary of {len(text)} chars has no section boundary to clip at")
        text = text[:clip].rstrip()
        if section_count(text) < 2:
            raise SummaryError("fewer than 2 sections left after clipping to the target")
    return text
