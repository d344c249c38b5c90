"""Time in the recall block (docs/design.md §9b): which questions are about order, change or
time, the order excerpts were said in, and which of several statements of one thing is the
latest.

A question is about time when its words say so (order, first, before, after, latest, changed,
updated, when, how long, how many days…, and their Chinese counterparts): its excerpts are
shown oldest first across sessions, by the date each was said (its date stamp) and then the
order it was indexed in. Among the excerpts whose hits share the most of the question's words
(two at least), the most recent is marked as the latest: a value that changed shows which
one holds now.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.parts import stems_of
from ragent_memory.text.relative import stamp_date

_TIME = re.compile(
    r"\b(?:order|ordered|sequence|chronolog\w*|timeline|first|before|after|earlier|later|"
    r"latest|last|recent|recently|current|currently|now|since|until|progress\w*|chang\w*|"
    r"updat\w*|switch\w*|evolv\w*|when|date|dates|day|days|week|weeks|month|months|year|years|"
    r"how long|deadline\w*)\b"
    r"|顺序|先后|之前|之后|以前|以后|最早|最新|最近|目前|现在|变化|改变|更新|换成|什么时候|何时|"
    r"哪天|哪一天|哪年|几月|几号|多久|几天",
    re.IGNORECASE,
)
MIN_SHARED: Final = 2  # an excerpt states "the same thing" when its hit shares this many words
LATEST: Final = "latest"


class Dated(Protocol):
    """What ordering reads of an excerpt: its date stamp and its messages."""

    @property
    def dated(self) -> str: ...

    @property
    def messages(self) -> tuple[IndexedMessage, ...]: ...

    @property
    def hits(self) -> frozenset[int]: ...


def asks_about_time(question: str) -> bool:
    """Whether ``question`` asks about order, change or time (see the module)."""
    return _TIME.search(question) is not None


def said_at(excerpt: Dated) -> tuple[int, int]:
    """When ``excerpt`` was said, for sorting: its date (a day number, 0 when unknown) and
    its first message's row id (the order of indexing)."""
    day = stamp_date(excerpt.dated) if excerpt.dated else None
    first = min((m.id for m in excerpt.messages), default=0)
    return (day.toordinal() if day is not None else 0, first)


def chronological(excerpts: Sequence[Dated]) -> list[int]:
    """The indexes of ``excerpts``, oldest first."""
    return sorted(range(len(excerpts)), key=lambda i: said_at(excerpts[i]))


def latest(
    excerpts: Sequence[Dated],
    stems: frozenset[str],
    stems_held: Callable[[str], frozenset[str]] = stems_of,
) -> int | None:
    """The index of the most recent of the excerpts whose hits share the most of ``stems``
    (``MIN_SHARED`` at least), when two or more do; None otherwise. ``stems_held`` says
    which stems a text holds (the recaller passes one that remembers long texts')."""
    shared = []
    for excerpt in excerpts:
        held: frozenset[str] = frozenset()
        for message in excerpt.messages:
            if message.position in excerpt.hits:
                held |= stems & stems_held(message.content)
        shared.append(len(held))
    most = max(shared, default=0)
    if most < MIN_SHARED:
        return None
    same = [i for i, n in enumerate(shared) if n == most]
    if len(same) < 2:
        return None
    return max(same, key=lambda i: said_at(excerpts[i]))
