"""The retention check (DESIGN §6): validation proves a summary's form, this checks its content
— the identifiers it lost, a repeat of the previous summary, and the restoring of what is lost."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from types import MappingProxyType

from ragent_memory.core.chars import Message, text_of
from ragent_memory.core.identifiers import Sentences, identifiers, kept_in, lost, normalise
from ragent_memory.errors import SummaryError
from ragent_memory.summary.prompt import EMPTY, SECTIONS

FINDINGS = MappingProxyType({lang: titles[4] for lang, titles in SECTIONS.items()})
# Compressed first when the restored findings need room (DESIGN §6: from the end): Done, Dead ends.
_SQUEEZE = MappingProxyType({lang: (t[6], t[5]) for lang, t in SECTIONS.items()})
# A source sentence longer than this is cut to a window around the identifier.
MAX_SENTENCE_CHARS = 240


def material_texts(material: Sequence[Message]) -> list[str]:
    """The text of each material message, tool-call arguments included, oldest first."""
    texts: list[str] = []
    for message in material:
        calls = message.get("tool_calls") or ()
        parts = [text_of(message), *((c.get("function") or {}).get("arguments") for c in calls)]
        texts.append("\n".join(p for p in parts if p))
    return texts


def wanted(material: Sequence[Message], previous: str) -> list[str]:
    """Identifiers a summary of ``material`` over ``previous`` must keep, newest first."""
    seen: dict[str, str] = {}
    for text in [*reversed(material_texts(material)), previous]:
        for identifier in identifiers(text):
            seen.setdefault(normalise(identifier), identifier)
    return list(seen.values())


def reject_repeat(body: str, previous: str, material: Sequence[Message]) -> None:
    """A summary equal to the previous one while the new material holds identifiers the
    previous one lacks is a model that ignored the material: rejected like an error."""
    if not previous.strip() or body.strip() != previous.strip():
        return
    new = [i for i in wanted(material, "") if not kept_in(i, previous)]
    if new:
        raise SummaryError(
            f"the summary repeats the previous one although the material holds {len(new)} "
            f"new identifiers (e.g. {new[0]!r})"
        )


# List and quote markers a sentence of the previous summary starts with: an addition gets its
# own "- ", so carried across generations they would pile up ("- - - …").
_MARKERS = re.compile(r"^(?:[-*•>]\s+)+")


def _window(sentence: str, identifier: str) -> str:
    sentence = _MARKERS.sub("", " ".join(sentence.split()))
    if len(sentence) <= MAX_SENTENCE_CHARS:
        return sentence
    at = max(normalise(sentence).find(normalise(identifier)), 0)
    half = (MAX_SENTENCE_CHARS - len(identifier)) // 2
    start = max(at - half, 0)
    return "…" + sentence[start : start + MAX_SENTENCE_CHARS].strip() + "…"


def _section(lines: list[str], title: str) -> tuple[int, int] | None:
    """(title line, end) of the section ``title`` in ``lines``."""
    for i, line in enumerate(lines):
        if line.strip() == title:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("## ")), None)
            return i, len(lines) if end is None else end
    return None


def _squeeze(lines: list[str], language: str) -> list[str]:
    """``lines`` with the first non-empty section of Done, Dead ends emptied (or unchanged)."""
    for title in _SQUEEZE[language]:
        found = _section(lines, title)
        if found is None:
            continue
        start, end = found
        body = [line for line in lines[start + 1 : end] if line.strip()]
        if body and body != [EMPTY[language]]:
            return [*lines[: start + 1], EMPTY[language], "", *lines[end:]]
    return lines


def _additions(missing: Iterable[str], sources: Sequence[str], max_chars: int) -> list[str]:
    """The shortest source sentence of each missing identifier, as items, within what
    squeezing can free at most (``max_chars``): no more could fit."""
    additions: list[str] = []
    found = Sentences(sources)
    room = max_chars
    for identifier in missing:
        if room <= 0:
            break
        if any(kept_in(identifier, a) for a in additions):
            continue
        sentence = found.shortest(identifier)
        if sentence is not None:
            additions.append("- " + _window(sentence, identifier))
            room -= len(additions[-1]) + 1
    return additions


def restore(
    body: str, missing: Iterable[str], sources: Sequence[str], *, language: str, max_chars: int
) -> str:
    """``body`` with the shortest source sentence of each missing identifier appended under
    the findings section, ``sources`` searched in order (newest first), within ``max_chars``."""
    additions = _additions(missing, sources, max_chars)
    if not additions:
        return body
    lines = body.splitlines()
    title = FINDINGS[language]
    if _section(lines, title) is None:
        following = SECTIONS[language][SECTIONS[language].index(title) + 1 :]
        at = next((i for i, line in enumerate(lines) if line.strip() in following), len(lines))
        lines = [*lines[:at], title, EMPTY[language], "", *lines[at:]]
    while True:
        start, end = _section(lines, title) or (0, 0)
        existing = [line for line in lines[start + 1 : end] if line.strip()]
        if existing == [EMPTY[language]]:
            existing = []
        fitted: list[str] = []
        for addition in additions:
            candidate = [*lines[: start + 1], *existing, *fitted, addition, "", *lines[end:]]
            if len("\n".join(candidate).strip()) <= max_chars:
                fitted.append(addition)
        squeezed = _squeeze(lines, language)
        if len(fitted) == len(additions) or squeezed == lines:
            break
        lines = squeezed
    if not fitted:
        return body
    merged = [*lines[: start + 1], *existing, *fitted, "", *lines[end:]]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(merged)).strip()


__all__ = ["FINDINGS", "lost", "material_texts", "reject_repeat", "restore", "wanted"]
