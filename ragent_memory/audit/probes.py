"""Fidelity probes: what each applied compaction kept of the messages it summarized.

For each applied generation, every identifier (codes, numbers with a unit, amounts, dates,
names, e-mail addresses, URLs, paths — the retention check's own extraction) and every user
constraint (a sentence of the user's stating a limit, a negation, a deadline) in the raw
messages it covered is one probe, checked in turn:

- **kept**: the generation's summary holds it verbatim (case and spacing aside);
- **recallable**: else a recall search for a question built from its context — the sentence
  around it with the item itself taken out — returns an excerpt holding it;
- **lost**: neither.

Deterministic, offline, no model: a floor, not a judge. A paraphrase the summary got right
counts as lost, and a "recallable" item is one the search finds for this question, not one a
model would think to ask for. The raw text comes from the recall index (``recall_enabled``);
without it, or for rows written before the audit recorded a generation's range, a generation
has no probes and says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

import attrs

from ragent_memory.core.chars import Role
from ragent_memory.core.identifiers import identifiers, kept_in, normalise, sentences
from ragent_memory.core.names import WrittenBy
from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.excerpts import Ask, find_block
from ragent_memory.recall.recaller import DEFAULT_SEARCH_LIMIT
from ragent_memory.settings import Settings
from ragent_memory.store import AuditLog, RecallIndex
from ragent_memory.summary.verbatim import states_constraint
from ragent_memory.text.terms import search_terms

# What became of a probed item: in the summary, found by recall, or neither.
Outcome: TypeAlias = Literal["kept", "recallable", "lost"]
# What a probe asks about: an identifier of any covered message, or a constraint the user set.
ProbeKind: TypeAlias = Literal["identifier", "constraint"]
KEPT: Final[Outcome] = "kept"
RECALLABLE: Final[Outcome] = "recallable"
LOST: Final[Outcome] = "lost"
OUTCOMES: Final[tuple[Outcome, ...]] = (KEPT, RECALLABLE, LOST)
MAX_PROBES: Final = 300  # per generation; the rest are counted as not probed
MAX_QUESTION_CHARS: Final = 300
PROBED_ROLES: Final[frozenset[Role]] = frozenset({"user", "assistant", "tool"})


class AuditedIndex(AuditLog, RecallIndex, Protocol):
    """What probing asks of a store: the audit rows, and the indexed messages they cover."""


@attrs.frozen
class Probe:
    """One item of a covered message and what became of it."""

    kind: ProbeKind
    item: str
    position: int  # the raw message it came from (index in the session's history)
    role: str
    question: str  # the recall question asked ("" when its context had no words to ask with)
    outcome: Outcome


@attrs.frozen
class GenerationProbes:
    generation: int
    covered_from: int
    covered_to: int
    written_by: WrittenBy
    probes: tuple[Probe, ...] = ()
    not_probed: int = 0  # items past MAX_PROBES
    note: str = ""  # why there are no probes, when there are none

    def counts(self) -> dict[Outcome, int]:
        return {o: sum(p.outcome == o for p in self.probes) for o in OUTCOMES}


@attrs.frozen
class SessionProbes:
    session_id: str
    generations: tuple[GenerationProbes, ...]

    def totals(self) -> dict[str, int]:
        return {o: sum(g.counts()[o] for g in self.generations) for o in OUTCOMES}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form: the totals, then each generation with its counts and probes."""
        return {
            "session_id": self.session_id,
            "totals": self.totals(),
            "generations": [
                {**attrs.asdict(g, recurse=True), "counts": g.counts()} for g in self.generations
            ],
        }


def probe_session(store: AuditedIndex, settings: Settings, session_id: str) -> SessionProbes:
    """Probe every applied generation of ``session_id`` the audit records, oldest first."""
    rows = [r for r in store.compactions(session_id) if r["status"] == "applied"]
    return SessionProbes(session_id, tuple(probe_generation(store, settings, r) for r in rows))


def probe_generation(
    store: RecallIndex, settings: Settings, row: dict[str, Any]
) -> GenerationProbes:
    """The probes of one applied ``compactions`` row."""
    start, stop = int(row.get("covered_from") or 0), int(row.get("covered_to") or 0)
    made = GenerationProbes(row["generation"], start, stop, row.get("written_by") or "")
    if stop <= start:
        return attrs.evolve(made, note="the audit row does not record the messages it covered")
    covered = store.indexed_at(row["session_id"], range(start, stop))
    if not covered:
        note = "no raw text of these messages in the store (recall_enabled is off?)"
        return attrs.evolve(made, note=note)
    summary = row.get("summary") or ""
    found = list(items(covered))
    probes = tuple(
        attrs.evolve(probe, outcome=_outcome(store, settings, row, probe, summary))
        for probe in found[:MAX_PROBES]
    )
    return attrs.evolve(made, probes=probes, not_probed=max(len(found) - MAX_PROBES, 0))


def items(covered: Sequence[IndexedMessage]) -> Iterator[Probe]:
    """Each identifier of the covered messages and each constraint of the user's, once (its
    first mention), with the question recall is asked for it; outcome not yet known."""
    seen: set[str] = set()
    for message in covered:
        if message.role not in PROBED_ROLES:
            continue
        text = message.content
        for sentence in sentences(text):
            found: list[tuple[ProbeKind, str]] = [("identifier", i) for i in identifiers(sentence)]
            if message.role == "user" and states_constraint(sentence):
                found.append(("constraint", " ".join(sentence.split())))
            for kind, item in found:
                key = normalise(item)
                if key in seen:
                    continue
                seen.add(key)
                question = _question(kind, item, sentence, text)
                yield Probe(kind, item, message.position, message.role, question, LOST)


def _without(text: str, item: str) -> str:
    return re.sub(re.escape(item), " ", text, flags=re.IGNORECASE)


def _question(kind: ProbeKind, item: str, sentence: str, text: str) -> str:
    """The words around ``item`` without it: its sentence (for a constraint, the sentence
    without its identifiers and constraint words), then the message's other sentences when
    that leaves fewer than three words to search for."""
    if kind == "constraint":
        asked = sentence
        for identifier in identifiers(sentence):
            asked = _without(asked, identifier)
        asked = " ".join(w for w in asked.split() if not states_constraint(w))
    else:
        asked = _without(sentence, item)
    if len(search_terms(asked)) < 3:
        others = [s for s in sentences(text) if s != sentence]
        asked = " ".join([asked, *(_without(s, item) for s in others)])
    asked = " ".join(asked.split())
    return asked[:MAX_QUESTION_CHARS] if search_terms(asked) else ""


def _outcome(
    store: RecallIndex, settings: Settings, row: dict[str, Any], probe: Probe, summary: str
) -> Outcome:
    if kept_in(probe.item, summary):
        return KEPT
    if not probe.question:
        return LOST
    ask = Ask(
        probe.question,
        row["session_id"],
        None,  # this session's own history: what the generation's recall could show
        settings.recall_floor_chars,
        settings.language,
        visible_from=int(row["covered_to"]),
        limit=DEFAULT_SEARCH_LIMIT,
    )
    found = find_block(store, ask, known=lambda _text: False)
    return RECALLABLE if kept_in(probe.item, found.text) else LOST
