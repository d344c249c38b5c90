"""The offline extractor: deterministic first-person patterns, no network (the embedded default).
A clause of a user message (not a question) starting "my name is", "I live in", 我住在 … becomes
a short third-person fact in its language. A single-valued slot (name, home, employer …)
supersedes that slot's stored fact; "I like X" and "I don't like X" supersede each other;
"I no longer …" / 我不再… retracts."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Final

import attrs

from ragent_memory.core.records import Draft
from ragent_memory.longterm.vocabulary import (
    Add,
    Extraction,
    ExtractionRequest,
    Merge,
    Retract,
    Supersede,
    block_chars,
    normalised,
)
from ragent_memory.settings import MEMORY_ITEM_MAX_CHARS

NAME: Final = "offline-patterns"
MAX_VALUE_CHARS: Final = 120


@attrs.frozen
class Slot:
    """A kind of fact and how it is worded, per language."""

    key: str
    templates: dict[str, str]  # language → "Lives in {x}"
    is_single: bool = False
    opposite: str | None = None

    def render(self, language: str, value: str, thing: str = "") -> str:
        return self.templates[language].format(x=value, thing=thing)


SLOTS: Final = MappingProxyType(
    {
        s.key: s
        for s in (
            Slot("name", {"en": "Is called {x}", "zh": "名叫{x}"}, is_single=True),
            Slot("lives", {"en": "Lives in {x}", "zh": "住在{x}"}, is_single=True),
            Slot("employer", {"en": "Works at {x}", "zh": "在{x}工作"}, is_single=True),
            Slot("occupation", {"en": "Works as {x}"}, is_single=True),
            Slot("favourite", {"en": "Favourite {thing} is {x}"}, is_single=True),
            Slot("allergic", {"en": "Is allergic to {x}", "zh": "对{x}过敏"}),
            Slot("prefers", {"en": "Prefers {x}", "zh": "偏好{x}"}),
            Slot("likes", {"en": "Likes {x}", "zh": "喜欢{x}"}, opposite="dislikes"),
            Slot("dislikes", {"en": "Does not like {x}", "zh": "不喜欢{x}"}, opposite="likes"),
            Slot("speaks", {"en": "Speaks {x}", "zh": "会说{x}"}),
            Slot("plays", {"en": "Plays {x}"}),
            Slot("doing", {"en": "Has been {x}", "zh": "最近在{x}"}),  # before "Has {x}"
            Slot("has", {"en": "Has {x}", "zh": "养了{x}"}),
            Slot("family", {"en": "Their {x}", "zh": "自己的{x}"}),
            Slot("plans", {"en": "Plans to {x}", "zh": "打算{x}"}),
            Slot("always", {"en": "Always {x}"}, opposite="never"),
            Slot("never", {"en": "Never {x}"}, opposite="always"),
            Slot("identity", {"en": "Is {x}", "zh": "是{x}"}),  # last: "Is called …" is a name
        )
    }
)


def _fact_pattern(template: str, language: str) -> re.Pattern[str]:
    parts = re.split(r"(\{x\}|\{thing\})", template)
    regex = "".join(
        "(?P<x>.+?)" if p == "{x}" else "(?P<thing>.+?)" if p == "{thing}" else re.escape(p)
        for p in parts
    )
    return re.compile(f"^{regex}$", re.IGNORECASE if language == "en" else 0)


_JOINERS: Final = MappingProxyType({"en": ", ", "zh": "、"})  # values of one slot joined
_FACT_PATTERNS: Final = tuple(
    (slot, language, _fact_pattern(template, language))
    for slot in SLOTS.values()
    for language, template in slot.templates.items()
)


@attrs.frozen
class Reading:
    """What a fact's wording says: its slot (with a favourite's thing) and value."""

    slot: str
    value: str  # normalised
    language: str
    raw_value: str = ""
    thing: str = ""

    @property
    def slot_key(self) -> str:
        return f"{self.slot}:{self.thing.casefold()}" if self.thing else self.slot


def read_fact(content: str) -> Reading | None:
    """The slot and value of a fact worded by this module (None for any other wording)."""
    for slot, language, pattern in _FACT_PATTERNS:
        match = pattern.match(content)
        if match is not None:
            groups = match.groupdict()
            return Reading(
                slot.key, normalised(groups["x"]), language, groups["x"], groups.get("thing") or ""
            )
    return None


Check = Callable[[str], object]  # a truthy result accepts the value


@attrs.frozen
class Pattern:
    slot: str
    language: str
    regex: re.Pattern[str]
    is_retraction: bool = False
    check: Check | None = None


def _en(
    slot: str, regex: str, *, is_retraction: bool = False, check: Check | None = None
) -> Pattern:
    return Pattern(slot, "en", re.compile(regex, re.IGNORECASE), is_retraction, check)


def _zh(slot: str, regex: str, *, is_retraction: bool = False) -> Pattern:
    return Pattern(slot, "zh", re.compile(regex), is_retraction)


_CAPITALISED_NAME = re.compile(r"^[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*){0,3}$")
_SHORT_NAME = re.compile(r"^\S+(?:\s+\S+){0,3}$")
_I_AM = r"(?:i'm|i am|im)"
_I_HAVE = r"(?:i've|i have|ive)"
_LATELY = r"(?:now |currently |still |recently |just )?"
_RELATIVES = (
    r"(?:kids?|children|child|sons?|daughters?|wife|husband|partner|boyfriend|girlfriend"
    r"|mom|mum|mother|dad|father|parents|sisters?|brothers?|family"
    r"|dogs?|cats?|puppy|kitten|pets?|parrot|rabbit|hamster|horse)"
)
_PETS_AND_KIDS = (
    r"(?:a|an|one|two|three|four|five|\d+) (?:[\w-]+ ){0,2}?"
    r"(?:dogs?|cats?|puppy|puppies|kittens?|birds?|parrots?|fish|hamsters?|rabbits?|horses?"
    r"|turtles?|kids?|children|sons?|daughters?|boys?|girls?)\b"
)
# A value that is only a pronoun or a placeholder says nothing on its own ("Likes it").
_BARE_WORDS = """it that this them those these him her they he she one so much there here stuff
    things something everything anything 它 这 那 这个 那个 他 她 他们"""
_BARE: Final = frozenset(_BARE_WORDS.split())
_ADVERB = r"(?:really |just |also |absolutely |genuinely |still )?"

PATTERNS: Final = (
    # Retractions first: "I no longer live in X" must not read as a new home.
    _en("lives", r"i (?:no longer|don't|do not) live in (?P<x>.+)", is_retraction=True),
    _en("employer", r"i (?:no longer|don't|do not) work (?:at|for) (?P<x>.+)", is_retraction=True),
    _en("occupation", r"i (?:no longer|don't|do not) work as (?P<x>.+)", is_retraction=True),
    _en("likes", r"i no longer (?:like|love|enjoy) (?P<x>.+)", is_retraction=True),
    _en("allergic", rf"{_I_AM} (?:no longer|not) allergic to (?P<x>.+)", is_retraction=True),
    _zh("lives", r"我(?:已经)?不再住在(?P<x>.+)", is_retraction=True),
    _zh("employer", r"我(?:已经)?不再在(?P<x>.+?)(?:工作|上班)", is_retraction=True),
    _zh("likes", r"我(?:已经)?不再喜欢(?P<x>.+)", is_retraction=True),
    _en(
        "name",
        r"(?:my name is|my name's|i'm called|i am called) (?P<x>.+)",
        check=_SHORT_NAME.match,
    ),
    _en("name", r"(?:call me|people call me) (?P<x>.+)", check=_CAPITALISED_NAME.match),
    _en(
        "lives",
        r"(?:i (?:now |currently )?live in|i'm (?:now )?(?:living|based) in"
        r"|i am (?:now )?(?:living|based) in|i(?:'ve| have) been living in"
        r"|(?:i|i've|i have) (?:just |recently |finally )?(?:moved|relocated) to) (?P<x>.+)",
    ),
    _en(
        "employer",
        rf"(?:i {_LATELY}(?:work|am working)|i'm {_LATELY}working|{_I_HAVE} been working"
        rf"|i {_LATELY}(?:started|began) (?:working|a (?:new )?job)) (?:at|for) (?P<x>.+)",
    ),
    _en("employer", rf"{_I_AM} {_LATELY}employed (?:at|by) (?P<x>.+)"),
    _en("employer", rf"i {_LATELY}(?:got|took|landed) a (?:new )?job (?:at|with) (?P<x>.+)"),
    _en(
        "occupation",
        rf"(?:i {_LATELY}(?:work|am working)|i'm {_LATELY}working|{_I_HAVE} been working)"
        r" as (?P<x>.+)",
    ),
    _en("allergic", rf"{_I_AM} (?:very |severely |really |highly )?allergic to (?P<x>.+)"),
    _en(
        "identity",
        rf"{_I_AM} (?P<x>vegetarian|vegan|pescatarian|lactose[- ]intolerant|gluten[- ]intolerant"
        r"|diabetic|colou?r ?blind|left[- ]handed|right[- ]handed|retired|married|divorced)$",
    ),
    _en(
        "identity",
        rf"{_I_AM} (?P<x>(?:a|an) (?!bit\b|little\b|lot\b|moment\b|second\b|minute\b|sec\b|few\b).+)",
    ),
    _en("prefers", r"i (?:always |generally |usually |much |really |would )?prefer (?P<x>.+)"),
    _en("dislikes", rf"i {_ADVERB}(?:don't|do not|dont) (?:really )?(?:like|enjoy) (?P<x>.+)"),
    _en("dislikes", rf"i {_ADVERB}(?:hate|dislike|detest|can't stand|cannot stand) (?P<x>.+)"),
    _en("likes", rf"i {_ADVERB}(?:like|love|enjoy|adore) (?P<x>.+)"),
    _en("likes", r"my (?:hobby is|hobbies are|hobbies include) (?P<x>.+)"),
    _en("likes", rf"{_I_AM} {_ADVERB}(?:into|passionate about|a fan of) (?P<x>.+)"),
    _en("favourite", r"my favou?rite (?P<thing>[a-z][\w -]{0,30}?) is (?P<x>.+)"),
    _en("family", rf"my (?P<x>{_RELATIVES}\b.+)"),
    _en("has", rf"(?:i (?:have|own)|{_I_HAVE} got) (?P<x>{_PETS_AND_KIDS}.*)"),
    _en("plans", r"(?:i plan|i'm planning|i am planning|i intend|i hope) to (?P<x>.+)"),
    _en("doing", rf"{_I_HAVE} been (?:really )?(?P<x>[a-z]+ing\b.+)"),
    _en("plays", rf"i {_ADVERB}play (?P<x>.+)"),
    _en("speaks", r"i (?:can )?speak (?P<x>.+)"),
    _en("always", r"(?:please )?(?P<w>always|never) (?P<x>.+?) for me$"),
    _zh("name", r"(?:我叫|我的名字是|我的名字叫|叫我)(?P<x>(?![了你他她它过])\S{1,20})"),
    _zh("lives", r"(?:我(?:现在|目前)?住在|我(?:已经|刚)?搬到了?|我(?:现在)?定居在)(?P<x>.+)"),
    _zh("employer", r"我(?:现在|目前|最近|已经)?(?:开始)?在(?P<x>.{1,30}?)(?:工作|上班|任职)"),
    _zh("doing", r"我(?:最近|这段时间)(?:一直)?在(?P<x>.+)"),
    _zh("plans", r"我(?:打算|计划|准备)(?P<x>.+)"),
    _zh("has", r"我(?:养了|养着)(?P<x>.+)"),
    _zh("family", r"我的(?P<x>(?:孩子|儿子|女儿|妻子|老婆|丈夫|老公|父母|妈妈|爸爸|狗|猫)\S+)"),
    _zh("likes", r"我的爱好是(?P<x>.+)"),
    _zh("allergic", r"我对(?P<x>.{1,30}?)过敏"),
    _zh("prefers", r"我(?:更喜欢|偏好|倾向于|比较喜欢)(?P<x>.+)"),
    _zh("dislikes", r"我(?:很|真的|特别|非常|也)?(?:不喜欢|讨厌|不爱)(?P<x>.+)"),
    _zh("likes", r"我(?:很|最|特别|非常|真的|也)?(?:喜欢|热爱)(?P<x>.+)"),
    _zh("speaks", r"我会说(?P<x>.+)"),
    _zh(
        "identity",
        r"我是(?:一名|一个|一位|个|名)?(?P<x>(?![说不想在来要问因觉指从怎什谁否的])[^，。！？]{1,20})",
    ),
)

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；;])|\n+")
_CLAUSE_SPLIT = re.compile(
    r",\s*(?:and\s+|but\s+|so\s+)?(?=(?:i|i'm|i've|im|my|call me|please|always|never)\b)"
    r"|\s+(?:and|but)\s+(?=(?:i|i'm|i've|my)\b)"
    r"|\s+(?:and|but)\s+(?=(?:work|live|prefer|like|love|hate|speak|moved)\b)"
    r"|[，,](?=我|叫我)"
    r"|[，,](?=(?:住在|在|喜欢|不喜欢|对|搬到))",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^(?:(?:hi|hello|hey|ok|okay|yes|yeah|no|well|oh|so|also|and|but|btw|by the way|actually"
    r"|now|anyway|fyi|just so you know|for the record|for context|as you know|remember that"
    r"|remember|note that|oh and|另外|还有|对了|顺便说一下|其实|嗯)\b[\s,!:，：]*)+",
    re.IGNORECASE,
)
_IMPLICIT_I = re.compile(r"^(?:work|live|prefer|like|love|hate|speak|moved)\b", re.IGNORECASE)
_IMPLICIT_WO = re.compile(r"^(?:住在|在.{1,30}?(?:工作|上班)|喜欢|不喜欢|对.{1,30}?过敏|搬到)")
_CUT_EN = re.compile(
    r"\s*,?\s*\b(?:which|who|whom|where|because|but|so that|though|although|since|while|if"
    r"|unless|when|whenever)\b.*$",
    re.IGNORECASE,
)
_TRAILING_EN = re.compile(
    r"\s+(?:too|as well|a lot|very much|so much|any ?more|now|these days|by the way|actually"
    r"|recently|lately|last (?:week|month|year|summer|winter|spring|autumn|fall)"
    r"|(?:a few|two|three|several) (?:days|weeks|months|years) ago|a while ago"
    r"|for (?:a few |many |several |\d+ |two |three )?(?:days|weeks|months|years))$",
    re.IGNORECASE,
)
_CUT_ZH = re.compile(r"(?:因为|但是|所以|不过|而且|可是).*$")
_TRAILING_ZH = re.compile(r"[了啦呢哦呀吧啊嘛]+$")
_EDGES = " \t\"'“”‘’.,;:!?。，；：！？…"
_PRONOUNS = (
    (re.compile(r"\bmyself\b", re.IGNORECASE), "themselves"),
    (re.compile(r"\bmine\b", re.IGNORECASE), "theirs"),
    (re.compile(r"\bmy\b", re.IGNORECASE), "their"),
    (re.compile(r"\bme\b", re.IGNORECASE), "them"),
    (re.compile(r"\bI'm\b", re.IGNORECASE), "they're"),
    (re.compile(r"\bI\b"), "they"),
)


def clauses(text: str) -> list[str]:
    """The clauses of ``text`` that may state a fact, filler taken off, in order."""
    out: list[str] = []
    for sentence in _SENTENCE_SPLIT.split(text):
        sentence = sentence.strip()
        if not sentence or sentence.endswith(("?", "？", "吗", "吗。", "呢")):  # a question
            continue
        for index, part in enumerate(_CLAUSE_SPLIT.split(sentence)):
            part = _FILLER.sub("", part.strip())
            if index and _IMPLICIT_I.match(part):
                part = f"I {part}"
            elif index and _IMPLICIT_WO.match(part):
                part = f"我{part}"
            if part:
                out.append(part)
    return out


def _value(raw: str, language: str) -> str | None:
    value = raw.strip()
    if language == "en":
        value = _CUT_EN.sub("", value)
        for _ in range(2):
            value = _TRAILING_EN.sub("", value.strip(_EDGES))
        for pattern, replacement in _PRONOUNS:
            value = pattern.sub(replacement, value)
    else:
        value = _TRAILING_ZH.sub("", _CUT_ZH.sub("", value).strip(_EDGES))
        value = value.replace("我的", "自己的")
    value = " ".join(value.strip(_EDGES).split())
    if not value or len(value) > MAX_VALUE_CHARS:
        return None
    return value


@attrs.frozen
class Candidate:
    """One fact (or retraction) found in a user message."""

    reading: Reading
    content: str  # the fact as it would be stored
    is_retraction: bool = False


def candidates(text: str) -> list[Candidate]:
    """Every fact and retraction stated in one user message, in order."""
    found: list[Candidate] = []
    for clause in clauses(text):
        for pattern in PATTERNS:
            match = pattern.regex.match(clause.rstrip(_EDGES))
            if match is None:
                continue
            groups = match.groupdict()
            value = _value(groups["x"], pattern.language)
            if value is None or (pattern.check is not None and not pattern.check(value)):
                continue
            if value.casefold() in _BARE:
                break  # "I like it": the clause states nothing durable
            slot = SLOTS[(groups.get("w") or pattern.slot).casefold()]
            thing = " ".join((groups.get("thing") or "").split())
            content = slot.render(pattern.language, value, thing)
            if len(content) > MEMORY_ITEM_MAX_CHARS:
                break
            reading = Reading(slot.key, normalised(value), pattern.language, value, thing)
            found.append(Candidate(reading, content, pattern.is_retraction))
            break
    return found


@attrs.define
class _Entry:
    id: int | None  # the stored fact, None for one added by this batch
    content: str
    reading: Reading | None
    is_changed: bool = False


def _same_value(a: str, b: str) -> bool:
    return a == b or a.startswith(b) or b.startswith(a)


def _first(live: Sequence[_Entry], match: Callable[[Reading], bool]) -> _Entry | None:
    return next((e for e in live if e.reading is not None and match(e.reading)), None)


def _replaced(live: Sequence[_Entry], reading: Reading) -> _Entry | None:
    """The live fact a new reading replaces: its single-valued slot's, or the opposite slot's
    with the same value ("likes tea" replaces "dislikes tea")."""
    slot = SLOTS[reading.slot]
    target = _first(live, lambda r: r.slot_key == reading.slot_key) if slot.is_single else None
    if target is None and slot.opposite is not None:
        target = _first(live, lambda r: r.slot == slot.opposite and r.value == reading.value)
    return target


def _apply(live: list[_Entry], retracted: list[int], candidate: Candidate) -> None:
    reading = candidate.reading
    if candidate.is_retraction:
        target = _first(
            live, lambda r: r.slot_key == reading.slot_key and _same_value(r.value, reading.value)
        )
        if target is not None:
            live.remove(target)
            retracted.extend([] if target.id is None else [target.id])
        return
    key = normalised(candidate.content)
    if any(normalised(e.content) == key for e in live):
        return
    target = _replaced(live, reading)
    if target is None:
        live.append(_Entry(None, candidate.content, reading))
    else:
        target.content, target.reading, target.is_changed = candidate.content, reading, True


def _extends(longer: str, shorter: str) -> bool:
    """``longer`` says all ``shorter`` says and more, in the same words from the start."""
    a, b = re.findall(r"\w+", longer.casefold()), re.findall(r"\w+", shorter.casefold())
    return a[: len(b)] == b or normalised(longer).startswith(normalised(shorter))


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
        """The operations the patterns in the messages imply for the facts (DESIGN §9)."""
        live = [_Entry(f.id, f.content, read_fact(f.content)) for f in request.facts]
        retracted: list[int] = []
        for message in request.messages:
            for candidate in candidates(message):
                _apply(live, retracted, candidate)
        changes = [
            Add(e.content) if e.id is None else Supersede(e.id, e.content)
            for e in live
            if e.id is None or e.is_changed
        ]
        return Extraction((*[Retract(i) for i in retracted], *changes), 0, NAME, 0)

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
