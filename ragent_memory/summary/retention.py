"""The retention check (docs/design.md §6): validation proves a summary's form, this checks its content
— the identifiers it lost, a repeat of the previous summary, and the restoring of what is lost."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from types import MappingProxyType

import attrs

from ragent_memory.core.chars import Message, text_of
from ragent_memory.core.identifiers import Sentences, identifiers, kept_in, lost, normalise
from ragent_memory.core.logs import get_logger
from ragent_memory.core.provenance import Source, source_tag
from ragent_memory.errors import LLMError, SummaryError
from ragent_memory.summary.prompt import EMPTY, SECTIONS
from ragent_memory.summary.summarize import Summarizer, SummaryOutcome, SummaryRequest
from ragent_memory.summary.validate import fit_sections

log = get_logger(__name__)

FINDINGS = MappingProxyType({lang: titles[4] for lang, titles in SECTIONS.items()})
# Compressed first when the restored findings need room (docs/design.md §6: from the end): Done, Dead ends.
_SQUEEZE = MappingProxyType({lang: (t[6], t[5]) for lang, t in SECTIONS.items()})
# A source sentence longer than this is cut to a window around the identifier.
MAX_SENTENCE_CHARS = 240
# At most this share of the target is restored sentences when the model's own lines must be
# cut (inside their sections) to make room for them.
RESTORE_SHARE = 0.5


def material_texts(material: Sequence[Message]) -> list[str]:
    """The text of each material message, tool-call arguments included, oldest first."""
    texts: list[str] = []
    for message in material:
        calls = message.get("tool_calls") or ()
        parts = [text_of(message), *((c.get("function") or {}).get("arguments") for c in calls)]
        texts.append("\n".join(p for p in parts if p))
    return texts


def tagged_sources(material: Sequence[Message], previous: str) -> tuple[list[str], list[str]]:
    """Where a lost identifier is looked for, newest first — the material's messages, then
    each line of the previous summary — and the source tag each one's sentences carry when
    restored: ``(user)``, ``(assistant)``, ``(tool: name)``; a line of the previous summary
    keeps its own tag (a quoted line is the user's)."""
    names: dict[str, str] = {}
    tags: list[str] = []
    for message in material:
        for call in message.get("tool_calls") or ():
            names[call.get("id", "")] = (call.get("function") or {}).get("name") or "tool"
        role = message.get("role")
        if role == "tool":
            name = names.get(message.get("tool_call_id", "")) or message.get("name") or "tool"
            tags.append(source_tag(Source.TOOL, str(name)))
        else:
            tags.append(source_tag(Source.USER if role == "user" else Source.ASSISTANT))
    lines = [line for line in previous.splitlines() if line.strip()]
    line_tags = [source_tag(Source.USER) if line.lstrip().startswith(">") else "" for line in lines]
    return (
        [*reversed(material_texts(material)), *lines],
        [*reversed(tags), *line_tags],
    )


def wanted(material: Sequence[Message], previous: str) -> list[str]:
    """Identifiers a summary of ``material`` over ``previous`` must keep, newest first."""
    seen: dict[str, str] = {}
    for text in [*reversed(material_texts(material)), previous]:
        for identifier in identifiers(text):
            seen.setdefault(normalise(identifier), identifier)
    return list(seen.values())


def repeated(body: str, previous: str, material: Sequence[Message]) -> list[str]:
    """The new material's identifiers the previous summary lacks, newest first, when ``body``
    repeats the previous summary unchanged (a model that ignored the material); else []. Such a
    reply is the previous summary plus nothing: the caller may ask once more naming these, and
    otherwise keeps it and restores the new material's facts like any lost identifier."""
    if not previous.strip() or body.strip() != previous.strip():
        return []
    return [i for i in wanted(material, "") if not kept_in(i, previous)]


def moved_on(
    summarizer: Summarizer, request: SummaryRequest, outcome: SummaryOutcome
) -> SummaryOutcome:
    """``outcome`` when it is no repeat of the previous summary; else the summarizer asked once
    more, the note naming the new identifiers, and its reply taken. A second repeat, or a retry
    that fails, leaves the repeat: the previous summary plus nothing, which the retention check
    then moves on by restoring the new material's facts. Attempts add up either way."""
    new = repeated(outcome.body, request.previous, request.material)
    if not new:
        return outcome
    log.warning("summary.repeat_retried", new_identifiers=len(new), example=new[0])
    try:
        retry = summarizer.summarize(attrs.evolve(request, new=tuple(new)))
    except (LLMError, SummaryError) as err:
        log.warning("summary.repeat_kept", error=str(err))
        return attrs.evolve(outcome, attempts=outcome.attempts + getattr(err, "attempts", 0))
    return attrs.evolve(retry, attempts=outcome.attempts + retry.attempts)


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


def _additions(
    missing: Iterable[str], sources: Sequence[str], tags: Sequence[str], max_chars: int
) -> list[str]:
    """The shortest source sentence of each missing identifier, as items tagged with their
    source (``tags``, parallel to ``sources``), within what squeezing can free at most
    (``max_chars``): no more could fit."""
    additions: list[str] = []
    found = Sentences(sources)
    room = max_chars
    for identifier in missing:
        if room <= 0:
            break
        if any(kept_in(identifier, a) for a in additions):
            continue
        hit = found.find(identifier)
        if hit is not None:
            text = _window(hit[1], identifier)
            tag = tags[hit[0]] if hit[0] < len(tags) else ""
            if tag and not text.startswith(f"{tag} "):  # a tool's "(user) …" stays the tool's
                text = f"{tag} {text}"
            additions.append("- " + text)
            room -= len(additions[-1]) + 1
    return additions


def _placed(lines: list[str], title: str, additions: list[str], language: str) -> str:
    """``lines`` with ``additions`` after the section ``title``'s own lines ("none" dropped)."""
    start, end = _section(lines, title) or (0, 0)
    existing = [line for line in lines[start + 1 : end] if line.strip()]
    if existing == [EMPTY[language]]:
        existing = []
    merged = [*lines[: start + 1], *existing, *additions, "", *lines[end:]]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(merged)).strip()


def _made_room(
    lines: list[str], title: str, additions: list[str], language: str, max_chars: int
) -> tuple[str, int] | None:
    """The most of ``additions`` (within ``RESTORE_SHARE`` of ``max_chars``) placed after
    fitting the other lines inside their sections (``fit_sections``) to the room left, and
    how many were placed; None when none could be."""
    share = int(max_chars * RESTORE_SHARE)
    chosen: list[str] = []
    for addition in additions:
        if sum(len(a) + 1 for a in chosen) + len(addition) + 1 > share:
            break
        chosen.append(addition)
    while chosen:
        size = sum(len(a) + 1 for a in chosen)
        try:
            fitted = fit_sections("\n".join(lines), max_chars - size)
        except SummaryError:
            chosen.pop()
            continue
        text = _placed(fitted.splitlines(), title, chosen, language)
        if len(text) <= max_chars:
            return text, len(chosen)
        chosen.pop()
    return None


def restore(
    body: str,
    missing: Iterable[str],
    sources: Sequence[str],
    *,
    language: str,
    max_chars: int,
    tags: Sequence[str] = (),
) -> str:
    """``body`` with the shortest source sentence of each missing identifier appended under
    the findings section, ``sources`` searched in order (newest first), each sentence tagged
    with its source's entry of ``tags`` (see ``tagged_sources``), within ``max_chars``:
    Done and Dead ends are emptied to make room, and when that is not enough the other
    lines are cut inside their sections (up to ``RESTORE_SHARE`` of the target restored)."""
    additions = _additions(missing, sources, tags, max_chars)
    if not additions:
        return body
    lines = body.splitlines()
    title = FINDINGS[language]
    if _section(lines, title) is None:
        following = SECTIONS[language][SECTIONS[language].index(title) + 1 :]
        at = next((i for i, line in enumerate(lines) if line.strip() in following), len(lines))
        lines = [*lines[:at], title, EMPTY[language], "", *lines[at:]]
    while True:
        fitted: list[str] = []
        for addition in additions:
            if len(_placed(lines, title, [*fitted, addition], language)) <= max_chars:
                fitted.append(addition)
        squeezed = _squeeze(lines, language)
        if len(fitted) == len(additions) or squeezed == lines:
            break
        lines = squeezed
    if len(fitted) < len(additions):
        roomier = _made_room(lines, title, additions, language, max_chars)
        if roomier is not None and roomier[1] > len(fitted):
            return roomier[0]
    return _placed(lines, title, fitted, language) if fitted else body


__all__ = [
    "FINDINGS",
    "lost",
    "material_texts",
    "moved_on",
    "repeated",
    "restore",
    "tagged_sources",
    "wanted",
]
