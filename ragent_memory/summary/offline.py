"""The offline summarizer: deterministic, extractive, no network (the embedded default). It
writes the seven sections a model would, merged with the previous summary (new wins), and
shortens Done → Dead ends first. Same input, same output: no clocks, no randomness."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import zip_longest
from typing import Any

from ragent_memory.core.chars import clip, text_of
from ragent_memory.core.provenance import Source, source_tag
from ragent_memory.summary.facts import prose, supersede, technical_weight
from ragent_memory.summary.prompt import EMPTY, SECTIONS
from ragent_memory.summary.summarize import SummaryOutcome, SummaryRequest
from ragent_memory.summary.transcript import UNCLIPPED, Transcript
from ragent_memory.summary.validate import validate_summary

NAME = "offline-extractive"

ITEM_CHARS = 240
MAX_ITEMS = (4, 6, 1, 1, 48, 8, 12)  # per section, in order
FINDINGS = 4  # "Tools and findings": kept by salience, not by age
# Sections dropped from first when the body is too long (Done, Dead ends, Tools and findings),
# then the rest from the end.
SHRINK_ORDER = (6, 5, 4, 1, 0, 3, 2)

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_FAILURE = re.compile(
    r"\b(?:error|failed|fails|failure|not found|no results?|unable|timed? ?out|denied|invalid"
    r"|doesn'?t work|didn'?t work|dead end)\b|失败|错误|未找到|没有结果|超时|无法|不可用",
    re.IGNORECASE,
)
_DONE = re.compile(
    r"\b(?:done|completed?|finished|sent|created|updated|booked|saved|fixed|resolved|confirmed"
    r"|submitted|deployed|merged)\b|已完成|完成了|已发送|已创建|已更新|已修复|已确认|已提交",
    re.IGNORECASE,
)
# An assistant's closing courtesy ("Let me know if …"): no step, nothing done.
_PLEASANTRY = re.compile(
    r"\b(?:let me know|feel free|hope (?:this|that|it) helps|happy to help|don'?t hesitate"
    r"|good luck)\b",
    re.IGNORECASE,
)
_NEXT = re.compile(
    r"\b(?:next|then|will|i'll|let me|plan to|going to)\b|下一步|接下来|然后|将会|我会",
    re.IGNORECASE,
)


def _item(text: str, limit: int = ITEM_CHARS) -> str:
    """``text`` as one summary item: whitespace collapsed, clipped to ``limit``."""
    return clip(" ".join(text.split()), limit)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def parse_sections(body: str, language: str) -> list[list[str]]:
    """The items (``- `` lines) of each known section of a summary body."""
    titles = SECTIONS[language]
    items: list[list[str]] = [[] for _ in titles]
    current = -1
    for line in body.splitlines():
        if line.startswith("## "):
            current = titles.index(line.strip()) if line.strip() in titles else -1
            continue
        if current >= 0 and line.startswith("- "):
            items[current].append(line[2:].strip())
    return items


_REQUEST = re.compile(
    r"\b(?:please|can you|could you|would you|will you|help me|i need|i want|i'd like|let'?s"
    r"|make sure|remember to|don'?t forget|need to|have to|todo|to-do)\b"
    r"|请|帮我|帮忙|能不能|能否|需要|记得|别忘了|麻烦",
    re.IGNORECASE,
)
# Metadata in front of a sentence: "(user) ", "[session 3 · 8 May] ", "Caroline: ".
_META = re.compile(
    r"^\s*(?:\((?:user|assistant|harness|summary|tool: [^()\n]{1,80})\)\s*)?"
    r"(?:\[[^\]]{0,80}\]\s*)?(?:[A-Z][\w.'-]{0,30}:\s)?"
)
_NUMBER = re.compile(r"\d+")
_WORDS = re.compile(r"[^\W\d_]+", re.UNICODE)
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'd|my|we|our|me)\b|我|我们")


# Words of greetings and small talk: a sentence made of these (and names) weighs nothing.
_SMALL_TALK_WORDS = """hey hi hello hiya yo thanks thank thx you your so much wow haha hahaha lol great awesome
    nice cool glad good see to hear that it is was this really too bye goodbye take care love
    amazing sounds sound oh yeah yes yep sure ok okay totally agree same me i i'm am how are
    doing what about catch up talk soon later and the a of for be been have has had all well
    fun happy for congrats congratulations wonderful lovely indeed glad day night morning
    evening again always here there just yay absolutely definitely appreciate it's that's
    you're we're keep going proud super fantastic incredible tell more let's let us we"""
_SMALL_TALK = frozenset(_SMALL_TALK_WORDS.split())


def is_small_talk(sentence: str) -> bool:
    """A greeting or pleasantry: only small-talk words and names, no number."""
    text = _META.sub("", sentence, count=1)
    if _NUMBER.search(text):
        return False
    words = [w for w in re.findall(r"[^\W\d_]+(?:'[a-z]+)?", text) if w != "I"]
    content = [
        w
        for k, w in enumerate(words)
        if w.lower() not in _SMALL_TALK and not (k and w[:1].isupper())  # a name after word 1
    ]
    return bool(words) and not content and not any("\u4e00" <= c <= "\u9fff" for c in text)


def salience(item: str) -> float:
    """How much an item is worth keeping: numbers, dates, names and first-person facts score,
    small talk nothing; from the text alone, so carried-over items rank the same way."""
    item = _META.sub("", item, count=1)
    if is_small_talk(item):
        return 0.0
    words = _WORDS.findall(item)
    if len(words) < 3 and not (_NUMBER.search(item) and len(words) >= 2):
        return 0.0  # "Q9?", "ok 2": a number alone is no fact
    names = sum(1 for w in words[1:] if w[:1].isupper() and w != "I")
    numbers = len(_NUMBER.findall(item))
    cjk = sum(1 for ch in item if "\u4e00" <= ch <= "\u9fff")
    score = 2.0 * numbers + 1.5 * names + 0.05 * (len(words) + cjk) + technical_weight(item)
    if _FIRST_PERSON.search(item):
        score += 1.0
    return score / (1.0 + len(item) / 200)


# A session stamp in front of a message: "[session 3 · 8 May, 2023] ", "[7:30 pm on 21 May, 2023] ".
_STAMP = re.compile(r"^\s*\[(?:session \d+\s*·\s*)?([^\]]{1,80})\]\s*")
_DATE = re.compile(
    r"\b(?:1[89]|20)\d\d\b|\b\d{1,2}[:/.-]\d{1,2}\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct"
    r"|nov|dec)[a-z]*\b|\d+\s*[年月日号]",
    re.IGNORECASE,
)


def date_stamp(text: str) -> str:
    """The date/time a message is stamped with ("8 May, 2023"), or ""."""
    match = _STAMP.match(text)
    if match is None or not _DATE.search(match.group(1)):
        return ""
    return match.group(1).strip()


def _statements(role: str, text: str, when: str) -> list[str]:
    """Salient sentences of a chat message, as findings; each keeps the date of its session."""
    out = []
    for sentence in _sentences(_STAMP.sub("", text, count=1) if when else text):
        if salience(sentence) >= 2.0:
            dated = f"[{when}] {sentence}" if when else sentence
            out.append(_item(f"({role}) {dated}", 200 + len(when)))
    return out


def _merge(new: Sequence[str], old: Sequence[str] = (), limit: int | None = None) -> list[str]:
    """``new`` then ``old``, each item once, empty ones left out, at most ``limit``."""
    return list(dict.fromkeys(filter(None, [*new, *old])))[:limit]


ASSISTANT = source_tag(Source.ASSISTANT)
USER = source_tag(Source.USER)


def _said(text: str, found: dict[str, list[str]]) -> None:
    """An assistant's text: its progress, and each sentence a dead end, done or a next step
    (each item tagged as the assistant's)."""
    said = [s for s in _sentences(text) if not _PLEASANTRY.search(s)]
    if said:
        found["progress"].append(_item(f"{ASSISTANT} {' '.join(said)}", 320))
    for sentence in said:
        for kind, pattern in (("dead_ends", _FAILURE), ("done", _DONE), ("next", _NEXT)):
            if pattern.search(sentence):
                found[kind].append(_item(f"{ASSISTANT} {sentence}"))
                break


def _tool_result(
    text: str, call: tuple[str, str], usage: dict[str, tuple[int, str]], found: dict[str, list[str]]
) -> None:
    """A tool result: the tool's usage line, a salient finding, a failure as a dead end —
    each tagged as the tool's (``(tool: web_fetch)``), never as the user's."""
    name, arguments = call
    tag = source_tag(Source.TOOL, name)
    finding = _item((_sentences(text) or [""])[0], 120)
    count = usage.pop(name, (0, ""))[0] + 1
    usage[name] = (count, f"{arguments} → {len(text)} chars: {finding}")
    if salience(finding) >= 2.0:
        found["findings"].append(f"{tag} {finding}")
    if _FAILURE.search(text[:400]):
        found["dead_ends"].append(_item(f"{tag} {arguments}: {finding}"))


def extract(material: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Section items from one stretch of conversation, newest first within each section."""
    found: dict[str, list[str]] = {
        kind: [] for kind in ("requests", "progress", "dead_ends", "done", "next", "findings")
    }
    usage: dict[str, tuple[int, str]] = {}  # tool name -> (calls, latest use), in order of use
    calls: dict[str, tuple[str, str]] = {}
    when = ""  # the date of the session being read: applies to its later sentences
    for message in material:
        role = message.get("role")
        text = text_of(message).strip()
        if role in ("user", "assistant"):
            text = prose(text).strip()  # a reply's code blocks and markup are no statements
        if role in ("user", "assistant") and text:
            when = date_stamp(text) or when
            found["findings"].extend(_statements(str(role), text, when))
        if role == "user" and text:
            asked = [s for s in _sentences(text) if _REQUEST.search(s) and not is_small_talk(s)]
            found["requests"].extend([_item(f"{USER} {' '.join(asked)}", 167)] if asked else [])
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                name, arguments = function.get("name") or "tool", function.get("arguments") or ""
                calls[call.get("id", "")] = (name, _item(arguments, 100))
            if text:
                _said(text, found)
        elif role == "tool":
            call = calls.get(message.get("tool_call_id", ""), ("tool", ""))
            _tool_result(text, call, usage, found)
    requests = found["requests"]
    usage_lines = [_usage_line(n, c, latest) for n, (c, latest) in reversed(usage.items())]
    return [
        list(reversed(requests[:-1])),
        requests[-1:],  # the latest request is the to-do; earlier ones are user requests
        found["next"][-1:] or requests[-1:],
        found["progress"][-1:],
        [*usage_lines, *reversed(found["findings"])],
        list(reversed(found["dead_ends"])),
        list(reversed(found["done"])),
    ]


# One line per tool used: "(tool: search_knowledge) ×12, latest: {"q": "x"} → 1408 chars: …"
# (summaries written before the tag read "search_knowledge ×12, latest: …").
_USAGE = re.compile(r"^(?:\(tool: ([^()\n]{1,80})\)|(\S+)) ×(\d+), latest: (.*)$", re.DOTALL)


def _usage_line(name: str, count: int, latest: str) -> str:
    return f"{source_tag(Source.TOOL, name)} ×{count}, latest: {latest}"


def _usage(items: Sequence[str]) -> tuple[dict[str, tuple[int, str]], list[str]]:
    """The tool record of one generation's findings — each tool's first usage line, as
    (calls, latest use) — and the other findings. A further usage line of the same tool (a
    copy the retention check restored to keep an identifier of an older call) is no count:
    it becomes an ordinary finding of that tool, so counts are never added twice."""
    usage: dict[str, tuple[int, str]] = {}
    others: list[str] = []
    for item in items:
        match = _USAGE.match(item)
        if match is None:
            others.append(item)
            continue
        name = match.group(1) or match.group(2)
        if name in usage:
            others.append(f"{source_tag(Source.TOOL, name)} earlier: {match.group(4)}")
        else:
            usage[name] = (int(match.group(3)), match.group(4))
    return usage, others


def _merge_findings(fresh: Sequence[str], earlier: Sequence[str]) -> list[str]:
    """Tool usage lines first (the two generations' counts added up, most recently used
    first), then the other findings, so shrinking sheds the least salient finding and the
    tool record last."""
    new, new_others = _usage(fresh)
    old, old_others = _usage(earlier)
    new_others, old_others = supersede(new_others, old_others)
    usage = dict(new)  # newer first: its "latest" wins; the older latest stays a finding
    for name, (count, latest) in old.items():
        known = usage.get(name)
        usage[name] = (count + known[0], known[1]) if known else (count, latest)
        if known and latest != known[1]:
            old_others.insert(0, f"{source_tag(Source.TOOL, name)} earlier: {latest}")
    lines = [_usage_line(name, count, latest) for name, (count, latest) in usage.items()]
    return lines + _interleave(new_others, old_others)


def _interleave(fresh: Sequence[str], earlier: Sequence[str]) -> list[str]:
    """Newer and older findings, each most salient first, taken in turn: when the section is
    cut, both keep their best items (older findings are merged, not pushed out wholesale)."""
    a = sorted(_merge(fresh), key=rank, reverse=True)
    b = sorted(_merge(earlier), key=rank, reverse=True)
    return _merge([item for pair in zip_longest(a, b) for item in pair if item])


# How much more the user's statement about themselves or their project ("I've set up…", "My
# deadline is…") ranks than a sentence as rich from the assistant or a tool. The user's
# requests and constraints are not weighted: the engine quotes them word for word.
USER_WEIGHT = 1.5
_STATED = re.compile(r"^(?:I|I'm|I've|I'd|I'll|My|We|We're|We've|Our|我|我们)\b|^我")


def rank(item: str) -> float:
    """A finding's place in its section: its salience, the user's own statements first."""
    stated = item.startswith(USER) and _STATED.match(_META.sub("", item, count=1).lstrip())
    return salience(item) * (USER_WEIGHT if stated else 1.0)


def render(items: Sequence[Sequence[str]], language: str) -> str:
    blocks = []
    for title, section in zip(SECTIONS[language], items, strict=True):
        lines = [f"- {item}" for item in section] or [EMPTY[language]]
        blocks.append("\n".join([title, *lines]))
    return "\n\n".join(blocks)


def summarize_offline(
    material: Sequence[Mapping[str, Any]], previous: str, language: str, max_chars: int
) -> str:
    """The merged, clamped summary body."""
    new = extract(material)
    old = parse_sections(previous, language)
    items = []
    for index, (fresh, earlier) in enumerate(zip(new, old, strict=True)):
        # Next step and current progress describe "now": the newer one replaces the older.
        if index in (2, 3):
            merged = list(fresh or earlier)
        elif index == FINDINGS:
            merged = _merge_findings(fresh, earlier)
        else:
            merged = _merge(fresh, earlier, MAX_ITEMS[index])
        items.append(merged[: MAX_ITEMS[index]])
    held = [len(fresh) + len(earlier) for fresh, earlier in zip(new, old, strict=True)]
    return _shrink(items, held, language, max_chars)


def _shrink(items: list[list[str]], held: Sequence[int], language: str, max_chars: int) -> str:
    """Cut the body to ``max_chars``: Done and Dead ends first, then the section using the most
    chars per item it was given yields its last item (space follows the material)."""

    def is_over() -> bool:
        return len(render(items, language)) > max_chars

    for index in SHRINK_ORDER[:2]:
        while items[index] and is_over():
            items[index].pop()
    rest = [i for i in SHRINK_ORDER[2:] if i not in (2, 3)]  # next step and progress: last
    while any(items[i] for i in rest) and is_over():
        index = max(
            (i for i in rest if items[i]),
            key=lambda i: (sum(map(len, items[i])) / max(1, held[i]), -rest.index(i)),
        )
        items[index].pop()
    for index in (3, 2):
        while items[index] and is_over():
            items[index].pop()
    return render(items, language)


class OfflineSummarizer:
    """The embedded default summarizer."""

    name = NAME

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        """Reads the material whole, or clipped like the model path's to fit
        ``request.input_chars``; ``material_chars`` is the transcript of what it read."""
        transcript = Transcript(request.material)
        clip = UNCLIPPED
        if request.input_chars is not None:
            clip = transcript.fit(max(request.input_chars - len(request.previous), 0), start=clip)
        material = request.material if clip == UNCLIPPED else transcript.clipped(clip)
        body = summarize_offline(material, request.previous, request.language, request.max_chars)
        return SummaryOutcome(
            validate_summary(body, max_chars=request.max_chars),
            NAME,
            0,
            material_chars=len(transcript.render(clip)),
            written_by="offline",
        )

    def close(self) -> None:
        return None
