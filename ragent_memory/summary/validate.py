"""A summarizer's reply checked and fitted (docs/design.md §6). What cannot be a summary is rejected:
an echoed fence nonce, fewer than three ``## `` sections, a reply cut off (finish reason
``length``) before three sections were complete. What is only too long is fitted to the target
inside its sections: each section keeps its first line and, of the rest, a share of its lines
in proportion to its size, cut at line boundaries (a first line too long for any share is
clipped at a word). A small model writes long sections; the summary it meant is still there."""

from __future__ import annotations

from ragent_memory.errors import SummaryError

MIN_SECTIONS = 3
# A first line is never clipped shorter than this; below it, trailing sections are dropped.
MIN_LINE_CHARS = 48
# When a reply must be fitted, no line keeps more than this share of the target: a line that
# long is a tool's raw output copied, not one fact, and would crowd out every other line.
MAX_LINE_SHARE = 0.2
ELLIPSIS = "…"

Section = tuple[str, list[str]]  # a title line and its non-blank lines


def section_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("## "))


def validate_summary(
    text: str, *, max_chars: int, nonce: str | None = None, finish_reason: str = "stop"
) -> str:
    """The accepted summary, fitted within ``max_chars`` if need be, or ``SummaryError``. A
    reply cut by ``length`` keeps its complete sections (all but the last) when there are at
    least three."""
    text = text.strip()
    if nonce and nonce.lower() in text.lower():
        raise SummaryError("the summary echoes the fence nonce")
    if finish_reason == "length":
        cut = text.rfind("\n## ")
        text = text[:cut].rstrip() if cut > 0 else ""
        if section_count(text) < MIN_SECTIONS:
            raise SummaryError(
                f"finish reason 'length' with {section_count(text)} complete '## ' sections, "
                f"need at least {MIN_SECTIONS}"
            )
    elif finish_reason != "stop":
        raise SummaryError(f"finish reason {finish_reason!r}, not 'stop'")
    count = section_count(text)
    if count < MIN_SECTIONS:
        raise SummaryError(f"only {count} '## ' sections, need at least {MIN_SECTIONS}")
    if len(text) <= max_chars:
        return text
    return fit_sections(text, max_chars)


def sections_of(text: str) -> list[Section]:
    """Each ``## `` section with its non-blank lines; text before the first one is dropped."""
    found: list[Section] = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line.rstrip(), []))
        elif found and line.strip():
            found[-1][1].append(line.rstrip())
    return found


def render(sections: list[Section]) -> str:
    return "\n\n".join("\n".join([title, *lines]) for title, lines in sections)


def fit_sections(text: str, max_chars: int) -> str:
    """``text`` (≥ 3 sections) within ``max_chars``: each line within ``MAX_LINE_SHARE`` of it
    (clipped at a word), lines cut in proportion, at least one per section; first lines
    clipped shorter and then trailing sections dropped (never below three) only when the
    titles and first lines alone are too long."""
    cap = max(int(max_chars * MAX_LINE_SHARE), 2 * MIN_LINE_CHARS)
    sections = [
        (title, [clip_line(line, cap) for line in lines]) for title, lines in sections_of(text)
    ]
    while len(sections) >= MIN_SECTIONS:
        fitted = _proportional(sections, max_chars) or _clipped_heads(sections, max_chars)
        if fitted is not None:
            return fitted
        sections = sections[:-1]
    raise SummaryError(
        f"summary of {len(text)} chars: {MIN_SECTIONS} section titles and first lines do not "
        f"fit in {max_chars} chars"
    )


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def _proportional(sections: list[Section], max_chars: int) -> str | None:
    """Every first line, and of the others a top share of each section in proportion to its
    size, then what room is left filled in order; None when the first lines do not fit."""
    kept = [(title, lines[:1]) for title, lines in sections]
    room = max_chars - len(render(kept))
    if room < 0:
        return None
    rest = [lines[1:] for _, lines in sections]
    total = sum(map(_size, rest))
    share = min(room / total, 1.0) if total else 1.0
    taken = [0] * len(sections)
    for index, lines in enumerate(rest):
        allowance, used = share * _size(lines), 0
        for line in lines:
            if used + len(line) + 1 > allowance:
                break
            used += len(line) + 1
            taken[index] += 1
        room -= used
    for index, lines in enumerate(rest):  # the rounding's leftovers, in section order
        while taken[index] < len(lines) and len(lines[taken[index]]) + 1 <= room:
            room -= len(lines[taken[index]]) + 1
            taken[index] += 1
    fitted = [
        (title, [*head, *more[:count]])
        for (title, head), more, count in zip(kept, rest, taken, strict=True)
    ]
    return render(fitted)


def clip_line(line: str, limit: int) -> str:
    """``line`` within ``limit`` chars, cut at a word boundary when one is near, marked."""
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit - len(ELLIPSIS) + 1)
    if cut < limit // 2:
        cut = limit - len(ELLIPSIS)
    return line[:cut].rstrip() + ELLIPSIS


def _clipped_heads(sections: list[Section], max_chars: int) -> str | None:
    """Titles and first lines only, every first line clipped to the longest length that fits
    (at least ``MIN_LINE_CHARS``); None when even that is too long."""

    def heads(limit: int) -> str:
        return render(
            [(title, [clip_line(line, limit) for line in lines[:1]]) for title, lines in sections]
        )

    low = MIN_LINE_CHARS
    if len(heads(low)) > max_chars:
        return None
    high = max((len(lines[0]) for _, lines in sections if lines), default=low)
    while low < high:  # the longest limit that fits; heads(low) fits throughout
        middle = (low + high + 1) // 2
        if len(heads(middle)) <= max_chars:
            low = middle
        else:
            high = middle - 1
    return heads(low)
