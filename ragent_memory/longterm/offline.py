"""The offline extractor (docs/design.md §9): deterministic first-person patterns, no network (the
embedded default). Each clause of a user message that may state a fact (``clauses``) is tried
against the patterns (``patterns``); a match becomes a short third-person fact in its language.
A single-valued slot (name, home, employer …) supersedes that slot's stored fact; a negation
("I don't drink coffee anymore", 我不再…) supersedes the fact it denies and is kept as a fact
itself; near-duplicates merge into one."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Final

import attrs

from ragent_memory.core.records import Draft
from ragent_memory.longterm.clauses import Sentence, sentences, standing_instruction
from ragent_memory.longterm.patterns import (
    PATTERNS,
    SLOTS,
    Pattern,
    Reading,
    read_fact,
    third_person,
)
from ragent_memory.longterm.vocabulary import (
    Add,
    Extraction,
    ExtractionRequest,
    Merge,
    Supersede,
    block_chars,
    normalised,
)
from ragent_memory.settings import MEMORY_ITEM_MAX_CHARS
from ragent_memory.text.porter import stem
from ragent_memory.text.terms import CJK_RUN

__all__ = ["NAME", "Candidate", "OfflineExtractor", "candidates", "read_fact", "says"]

NAME: Final = "offline-patterns"
MAX_VALUE_CHARS: Final = 120
NEGATIVE_SLOTS: Final = frozenset(
    {
        "not",
        "no longer",
        "is not",
        "stopped",
        "quit",
        "gave up",
        "left",
        "lacks",
        "has not",
        "resigned",
    }
)
_JOINERS: Final = MappingProxyType({"en": ", ", "zh": "、"})  # values of one slot joined
# A value that is only a pronoun or a placeholder says nothing on its own ("Likes it").
_BARE_WORDS = """it that this them those these him her they he she one so much there here stuff
    things something everything anything 它 这 那 这个 那个 他 她 他们"""
_BARE: Final = frozenset(_BARE_WORDS.split())
_DEICTIC_ZH = re.compile(r"^(?:这|那|它)")
_CUT_EN = re.compile(
    r"(?<=\S)\s*,?\s+\b(?:which|who|whom|where|because|but|so that|though|although|since"
    r"|while|if|unless|when|whenever|and (?:it|it's|that|this|so))\b.*$"
    r"|,\s*(?:so|everyone|nice to|pleased to|don't|do not|no)\b.*$|\s+[-–—]\s+.*$",
    re.IGNORECASE,
)
_TRAILING_EN = re.compile(
    r"\s+(?:too|as well|a lot|very much|so much|any ?more|now|these days|by the way|btw"
    r"|actually|originally|lol|recently|lately|everywhere"
    r"|last (?:week|month|year|summer|winter|spring|autumn|fall)"
    r"|(?:a few|two|three|several|many)? ?(?:days|weeks|months|years|ages) ago|a while ago"
    r"|for (?:a few |many |several |\d+ |two |three |twelve |ten )?(?:days|weeks|months|years))$",
    re.IGNORECASE,
)
_CUT_ZH = re.compile(r"(?:因为|但是|所以|不过|而且|可是).*$")
_TRAILING_ZH = re.compile(r"(?:就行|就好|就可以)?[了啦呢哦呀吧啊嘛]*$")
_EDGES = " \t\"'“”‘’.,;:!?。，；：！？…"
_PRONOUNS = (
    (re.compile(r"\bmyself\b", re.IGNORECASE), "themselves"),
    (re.compile(r"\bmine\b", re.IGNORECASE), "theirs"),
    (re.compile(r"\bmy\b", re.IGNORECASE), "their"),
    (re.compile(r"\bme\b", re.IGNORECASE), "them"),
    (re.compile(r"\bI'm\b", re.IGNORECASE), "they're"),
    (re.compile(r"\bI\b"), "they"),
)
_DENIES = re.compile(r"\b(?:not|no|never|no longer|stopped|quit)\b|n't|不|没|戒", re.IGNORECASE)
_AS_ROLE = re.compile(r"^(?P<a>.+?)\s+as\s+(?P<b>an?\s.+)$", re.IGNORECASE)
_FROM_PLACE = re.compile(r"^(?P<a>an?\s.+?)\s+(?:from|in|based in)\s+(?P<b>[A-Z][\w -]+)$")
_AND_MORE = re.compile(r"\s+and\s+(?=(?:a|an|one|two|three|four|\d+)\s)", re.IGNORECASE)
_OBJECT_STOP_WORDS = """a an the do does not no longer any more anymore use using eat eating drink drinking have
    has live living in at for with work working works smoke own is am are be i my their them
    they we our years ago since last year been"""
_OBJECT_STOP_EN: Final = frozenset(_OBJECT_STOP_WORDS.split())
_OBJECT_EDGE_ZH = re.compile(r"^(?:在|喝|吃|抽|用|住在|开|玩|养)|(?:工作|上班)$")


def _value(raw: str, language: str) -> str | None:
    value = raw.strip()
    if language == "en":
        value = _CUT_EN.sub("", value)
        for _ in range(3):
            value = _TRAILING_EN.sub("", value.strip(_EDGES))
        for pattern, replacement in _PRONOUNS:
            value = pattern.sub(replacement, value)
    else:
        value = _TRAILING_ZH.sub("", _CUT_ZH.sub("", value).strip(_EDGES))
        value = value.replace("我的", "自己的").replace("我", "自己")
    value = " ".join(value.strip(_EDGES).split())
    if not value or len(value) > MAX_VALUE_CHARS:
        return None
    return value


def object_terms(value: str, language: str) -> frozenset[str]:
    """What a negation is about ("drink coffee" → coffee; 在腾讯工作 → 腾讯)."""
    if language == "zh":
        core = _OBJECT_EDGE_ZH.sub("", value)
        return frozenset([core]) if core else frozenset()
    words = set(re.findall(r"[\w+#.-]+", value.casefold())) - _OBJECT_STOP_EN
    return frozenset(w.strip(".") for w in words if w.strip("."))


def _mentions(content: str, terms: frozenset[str], language: str) -> bool:
    if not terms:
        return False
    if language == "zh":
        return all(t in content for t in terms)
    words = {w.strip(".") for w in re.findall(r"[\w+#.-]+", content.casefold())}
    return terms <= words


@attrs.frozen
class Candidate:
    """One fact found in a user message."""

    reading: Reading
    content: str  # the fact as it would be stored
    is_negation: bool = False  # denies a fact ("I don't drink coffee anymore")


def _pieces(slot: str, value: str) -> list[tuple[str, str]]:
    """A value that holds two facts split in two: "Stripe as a product manager" (employer,
    occupation), "a UX designer from Lisbon" (identity, home), "two cats and a parrot"."""
    if slot == "employer" and (match := _AS_ROLE.match(value)):
        return [("employer", match.group("a")), ("occupation", match.group("b"))]
    if slot == "identity" and (match := _FROM_PLACE.match(value)):
        return [("identity", match.group("a")), ("from", match.group("b"))]
    if slot in ("has", "identity"):
        return [(slot, part) for part in _AND_MORE.split(value)]
    return [(slot, value)]


def _match(pattern: Pattern, clause: str) -> list[Candidate] | None:
    """The candidates ``pattern`` finds in ``clause``; None when it does not match, [] when it
    matches and states nothing durable (the clause is done)."""
    match = pattern.regex.match(clause.rstrip(_EDGES))
    if match is None:
        return None
    groups = match.groupdict()
    raw = groups["x"]
    if pattern.slot in ("name", "address"):
        raw = raw.split(",")[0]
    value = _value(raw, pattern.language)
    if value is None or (pattern.check is not None and not pattern.check(value)):
        return None
    if value.casefold() in _BARE or (pattern.language == "zh" and _DEICTIC_ZH.match(value)):
        return []
    if pattern.verb:
        value = third_person(value)
    slot_key = (groups.get("w") or pattern.slot).casefold()
    thing = " ".join((groups.get("thing") or "").split())
    found = []
    for key, part in _pieces(slot_key, value):
        content = SLOTS[key].render(pattern.language, part, thing)
        if len(content) <= MEMORY_ITEM_MAX_CHARS:
            reading = Reading(key, normalised(part), pattern.language, part, thing)
            found.append(Candidate(reading, content, pattern.is_negation))
    return found


def _request(sentence: Sentence) -> list[Candidate]:
    """The sentence (or clause) as a standing instruction, if it is one."""
    request = standing_instruction(sentence)
    value = None if request is None else _value(request, sentence.language)
    if value is None or value.casefold() in _BARE:
        return []
    reading = Reading("request", normalised(value), sentence.language, value)
    return [Candidate(reading, SLOTS["request"].render(sentence.language, value))]


def _in_clause(clause: str, language: str) -> list[Candidate]:
    for pattern in PATTERNS:
        if pattern.language == language and (matched := _match(pattern, clause)) is not None:
            return matched
    return _request(Sentence(language, clause, ()))


def _in_sentence(sentence: Sentence) -> list[Candidate]:
    """The facts of a sentence, clause by clause; else the whole as a standing instruction."""
    found = [c for clause in sentence.clauses for c in _in_clause(clause, sentence.language)]
    return found or _request(sentence)


def candidates(text: str) -> list[Candidate]:
    """Every fact stated in one user message, in order."""
    return [c for sentence in sentences(text) for c in _in_sentence(sentence)]


@attrs.define
class _Entry:
    id: int | None  # the stored fact, None for one added by this batch
    content: str
    reading: Reading | None
    is_changed: bool = False

    @property
    def is_negation(self) -> bool:
        return self.reading is not None and self.reading.slot in NEGATIVE_SLOTS


def _first(live: Sequence[_Entry], match: Callable[[Reading], bool]) -> _Entry | None:
    return next((e for e in live if e.reading is not None and match(e.reading)), None)


def _words(content: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", content.casefold()))


def _near(a: _Entry, reading: Reading, content: str) -> bool:
    """``a`` says all ``content`` says: the same slot, and its words (en) or text (zh) hold
    the new fact's."""
    if a.reading is None or a.reading.slot_key != reading.slot_key:
        return False
    if reading.language == "zh":
        return normalised(content) in normalised(a.content)
    return _words(content) <= _words(a.content)


def _replaced(live: Sequence[_Entry], candidate: Candidate) -> _Entry | None:
    """The live fact a new one replaces: the positive fact a negation denies (or the negation
    a positive fact overturns), its single-valued slot's, the opposite slot's with the same
    value ("likes tea" replaces "dislikes tea"), or a fact of its slot it says more than."""
    reading, language = candidate.reading, candidate.reading.language
    if candidate.is_negation:
        terms = object_terms(reading.raw_value, language)
        return next(
            (e for e in live if not e.is_negation and _mentions(e.content, terms, language)), None
        )
    for entry in live:
        if entry.is_negation and entry.reading is not None:
            terms = object_terms(entry.reading.raw_value, entry.reading.language)
            if _mentions(candidate.content, terms, language):
                return entry
    slot = SLOTS[reading.slot]
    target = _first(live, lambda r: r.slot_key == reading.slot_key) if slot.is_single else None
    if target is None and slot.opposite is not None:
        target = _first(live, lambda r: r.slot == slot.opposite and r.value == reading.value)
    if target is None:  # a fact of its slot it says more than ("Uses vim" → "Uses vim, not …")
        entry = _Entry(None, candidate.content, reading)
        target = next(
            (e for e in live if e.reading is not None and _near(entry, e.reading, e.content)),
            None,
        )
    return target


def _apply(live: list[_Entry], candidate: Candidate) -> None:
    """``candidate`` learnt: nothing when a live fact already says it (near-duplicates
    included), else replacing the fact it supersedes, else added."""
    reading, content = candidate.reading, candidate.content
    key = normalised(content)
    if any(normalised(e.content) == key or _near(e, reading, content) for e in live):
        return
    target = _replaced(live, candidate)
    if target is None:
        live.append(_Entry(None, content, reading))
    else:
        target.content, target.reading, target.is_changed = content, reading, True


def _extends(longer: str, shorter: str) -> bool:
    """``longer`` says all ``shorter`` says and more, in the same words from the start."""
    a, b = re.findall(r"\w+", longer.casefold()), re.findall(r"\w+", shorter.casefold())
    return a[: len(b)] == b or normalised(longer).startswith(normalised(shorter))


def _stems(content: str) -> frozenset[str]:
    for pattern, replacement in _PRONOUNS:  # "My …" as the offline wording has it, "Their …"
        content = pattern.sub(replacement, content)
    return frozenset(stem(word) for word in re.findall(r"\w+", content.casefold()))


def says(fact: str, other: str) -> bool:
    """``fact`` says all ``other`` says, so ``other`` is a near-duplicate of it: the same words
    from the start (and more), or, unless only ``fact`` denies, all of ``other``'s words
    (stemmed; "Maya is a nurse" says "Is a nurse") or, in Chinese, its text."""
    if _extends(fact, other):
        return True
    if _DENIES.search(fact) and not _DENIES.search(other):
        return False
    if CJK_RUN.search(other):
        return normalised(other) in normalised(fact)
    return _stems(other) <= _stems(fact)


# A fact's wording and the drafts it stands for; None once folded into another group.
_Group = tuple[str, list[Draft]] | None


def _fold_duplicates(drafts: Sequence[Draft]) -> list[_Group]:
    """Near-duplicates folded into the longer wording, oldest first."""
    groups: list[_Group] = []
    for draft in drafts:
        for index, group in enumerate(groups):
            assert group is not None
            content, members = group
            if _extends(draft.content, content) or _extends(content, draft.content):
                longer = draft.content if len(draft.content) >= len(content) else content
                groups[index] = (longer, [*members, draft])
                break
        else:
            groups.append((draft.content, [draft]))
    return groups


def _join_slot(groups: list[_Group], readings: Sequence[tuple[int, Reading]]) -> None:
    """Join the values of one multi-valued slot's facts into the first, within the item cap."""
    reading = readings[0][1]
    slot, language = SLOTS[reading.slot], reading.language
    joiner = _JOINERS[language]
    values: list[str] = []
    folded: list[Draft] = []
    taken: list[int] = []
    for index, reading in readings:
        joined = joiner.join([*values, reading.raw_value])
        if values and len(slot.render(language, joined)) > MEMORY_ITEM_MAX_CHARS:
            break
        group = groups[index]
        assert group is not None
        values.append(reading.raw_value)
        folded.extend(group[1])
        taken.append(index)
    if len(taken) < 2:
        return
    groups[taken[0]] = (slot.render(language, joiner.join(values)), folded)
    for index in taken[1:]:
        groups[index] = None


class OfflineExtractor:
    """The embedded default extractor."""

    name = NAME

    def extract(self, request: ExtractionRequest) -> Extraction:
        """The operations the patterns in the messages imply for the facts (docs/design.md §9)."""
        live = [_Entry(f.id, f.content, read_fact(f.content)) for f in request.facts]
        for message in request.messages:
            for candidate in candidates(message):
                _apply(live, candidate)
        changes = [
            Add(e.content) if e.id is None else Supersede(e.id, e.content)
            for e in live
            if e.id is None or e.is_changed
        ]
        return Extraction(tuple(changes), 0, NAME, 0)

    def consolidate(
        self, drafts: Sequence[Draft], *, target_chars: int, language: str
    ) -> list[Merge]:
        """Deterministic merges toward ``target_chars``: near-duplicates always fold into the
        longer wording; then facts of one multi-valued slot are joined, slot by slot, while the
        block is over the target."""
        groups = _fold_duplicates(drafts)
        buckets: dict[tuple[str, str, str], list[tuple[int, Reading]]] = {}
        for index, group in enumerate(groups):
            reading = read_fact(group[0]) if group is not None else None
            if reading is not None and not SLOTS[reading.slot].is_single:
                key = (reading.slot, reading.thing, reading.language)
                buckets.setdefault(key, []).append((index, reading))
        for readings in buckets.values():
            kept = [Draft(0, g[0], 0) for g in groups if g is not None]
            if block_chars(kept, language) <= target_chars:
                break
            _join_slot(groups, readings)
        return [
            Merge(content, tuple(d.key for d in members))
            for content, members in (g for g in groups if g is not None)
            if len(members) > 1 or members[0].content != content
        ]

    def close(self) -> None:
        return None
