"""The memory block as injected (DESIGN §9): the facts, then excerpts of the user's summaries
from other sessions while room is left (DeepFlux), and the excerpts a summary is indexed as.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

from ragent_memory.longterm.vocabulary import clean, render_block
from ragent_memory.summary.verbatim import VERBATIM_LABEL

EXCERPT_MAX_CHARS: Final = 300
EXCERPT_CANDIDATES: Final = 8
MIN_EXCERPT_ROOM: Final = 80  # below this, the block has no room worth an FTS query


def fit_block(
    facts: Sequence[str], excerpts: Iterable[str], *, language: str, max_chars: int
) -> str:
    """The block within ``max_chars``: every fact (the newest that fit, should the cap have
    shrunk since they were stored), then each excerpt that still fits, best first."""
    kept = list(facts)
    while kept and len(render_block(kept, language=language)) > max_chars:
        kept.pop(0)
    chosen: list[str] = []
    for excerpt in excerpts:
        if excerpt in chosen:
            continue
        if len(render_block(kept, [*chosen, excerpt], language=language)) <= max_chars:
            chosen.append(excerpt)
    return render_block(kept, chosen, language=language)


def memory_message(text: str) -> dict[str, Any]:
    """The injected message: role ``user`` (some providers reject a mid-context system one)."""
    return {"role": "user", "content": text}


def summary_chunks(summary: str) -> list[str]:
    """The excerpts a summary is indexed as: its items and quoted user words, one per line."""
    skip = {"none", "无", *(label.casefold() for label in VERBATIM_LABEL.values())}
    chunks: list[str] = []
    for line in summary.splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        text = clean(re.sub(r"^(?:[-*+]\s+|>\s?)+", "", text))
        if not text or text.casefold() in skip:
            continue
        if len(text) > EXCERPT_MAX_CHARS:
            text = text[: EXCERPT_MAX_CHARS - 1] + "…"
        if text not in chunks:
            chunks.append(text)
    return chunks
