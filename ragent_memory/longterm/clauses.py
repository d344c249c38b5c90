"""Where the offline extractor looks for facts (docs/design.md §9): a user message cut into sentences
and clauses, lead-ins taken off ("Quick note:", "btw,", "Turn 3:", "Hi!", 另外), and whatever
states no durable fact about the user left out — questions, hypotheticals, reported speech,
quoted or pasted text, role play, transient states. Precision first: a sentence in doubt is
dropped whole."""

from __future__ import annotations

import re
from typing import Final

import attrs

# --------------------------------------------------------------------------- cutting up

_CODE_FENCE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_CODE_LINE = re.compile(
    r"^\s*(?:#|//|>>>|\$ |File \"|Traceback\b|at [\w.$]+\(|[\w.]*(?:Error|Exception)\b\s*:)"
)
# A quoted span with a first-person word in it is someone's words, not the user's statement.
_QUOTED = re.compile(r"[\"“「『](?P<q>[^\"”」』]*)[\"”」』]|(?<!\w)'(?P<s>[^']*)'(?!\w)")
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|me|my|we|our)\b|我", re.IGNORECASE)
# The user speaking of themselves (not "help me", 帮我: a request).
_SELF = re.compile(
    r"\b(?:i|i'm|im|i've|i'd|i'll|my|mine|we|we're|we've|our|ours)\b|(?<![帮给让替])我",
    re.IGNORECASE,
)
_SENTENCE_SPLIT = re.compile(
    r"(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bProf\.)(?<!\bSt\.)(?<=[.!?])\s+"
    r"|(?<=[。！？；;])|\n+"
)

# --------------------------------------------------------------------------- what to drop

_QUESTION_EN = re.compile(
    r"^(?:(?:hi|hey|ok|okay|so|and|also|btw|quick question)[\s,!:]+)*"
    r"(?:what|what's|whats|where|why|how|who|whom|which|whose|can|could|would|should|shall"
    r"|will|do|does|did|is|are|am|was|were|any idea|remind me|tell me|i wonder)\b",
    re.IGNORECASE,
)
_QUESTION_ZH = re.compile(
    r"[吗呢]$|什么|为什么|怎么|哪|几点|多少|是不是|要不要|能不能|可不可以|有没有"
)
_EVEN_IF = re.compile(
    r",?\s*\beven if\b.*$|,?\s*\bif (?:that|it|this) (?:matters|helps|is relevant)\b[^,.;]*",
    re.IGNORECASE,
)
_HYPOTHETICAL_EN = re.compile(
    r"\b(?:if|suppose|supposing|imagine|assume|assuming|pretend|pretending|hypothetically"
    r"|let's|lets|i wish|i might|i may|maybe|perhaps|someday|one day|thinking (?:about|of)"
    r"|considering|i'd like to|would like to|could|in theory|you be|you're the|you are the"
    r"|play the role|act as|role-?play)\b",
    re.IGNORECASE,
)
_HYPOTHETICAL_ZH = re.compile(
    r"如果|假如|假设|要是|万一|想象|可能|也许|或许|考虑|的话|就好了|想要|设想|角色扮演|扮演|你来当|你当"
)
# Someone else's words: a reporting verb whose subject is not "I".
_REPORTED_EN = re.compile(
    r"(?<!\bi )(?<!\bi've )(?<!\bas i )\b(?:said|says|say|told|tells|mentioned|mentions|wrote"
    r"|writes|thinks|think|thought|claims|claimed|reckons|believes|heard|asked|apparently"
    r"|according to)\b",
    re.IGNORECASE,
)
_REPORTED_ZH = re.compile(r"(?<![我小])说|告诉|听说|觉得|认为|反馈|提到|表示|写道|据说")
# What a colon's prefix says the rest is: someone's text, a task's input, a story.
_FRAMING_EN = re.compile(
    r"\b(?:says?|said|wrote|writes|told|e-?mail|mail|message|ticket|logs?|errors?|traceback"
    r"|output|translate|translation|fix|proofread|correct|rewrite|rephrase|check|sentence"
    r"|paragraph|text|quote|example|template|bio|character|novel|story|script|role-?play"
    r"|practi[cs]e|pretend|todo|customer|user|client|review|post|tweet|reply)\b",
    re.IGNORECASE,
)
_FRAMING_ZH = re.compile(
    r"说|写道|邮件|消息|报错|日志|翻译|检查|语病|这段|这句|例子|模板|小说|台词|角色|扮演|剧本|故事"
    r"|反馈|输出|错误|客户|用户|评论"
)
_TRANSIENT_EN = re.compile(
    r"\b(?:today|tonight|right now|at the moment|this (?:morning|afternoon|evening|week)"
    r"|for now|atm|lol|just now|for this (?:test|one|task|ticket|time)|in a (?:meeting|call)"
    r"|running late|still (?:failing|broken))\b",
    re.IGNORECASE,
)
_TRANSIENT_ZH = re.compile(
    r"今天|今晚|今早|刚刚|刚才|马上|这会儿|此刻|晚点|一会儿|这次|这一次|暂时"
)

# --------------------------------------------------------------------------- lead-ins

_LEAD_EN = re.compile(
    r"^(?:(?:(?:hi|hello|hey) there|hi|hello|hey|hiya|good (?:morning|afternoon|evening)|ok so|ok|okay|so|well|oh and"
    r"|oh|also|and|but|btw|by the way|fyi|actually|anyway|anyways|quick note|side note|reminder"
    r"|remember that|remember|just so you know|for context|for the record|context for you"
    r"|speaking of which|in case it matters|one more thing|ps|as you know|as i said|like i said"
    r"|turn \d+|by day|for reference|heads up|currently|these days|nowadays|at work|at home|mostly|mainly|usually|generally"
    r"|professionally|personally)\b[\s,!:.\-–—]*)+",
    re.IGNORECASE,
)
_LEAD_ZH = re.compile(
    r"^(?:(?:你好|您好|嗨|哈喽|早上好|对了|另外|还有|顺便说一下|顺便说下|顺便提一下|顺便|补充一下背景"
    r"|补充一下|补充|请记住|记住|提醒一下|说一下|其实|嗯|哦|好的|业余时间|平时|而且|并且|同时)[，,！!：:\s]*)+"
)
_COLON = re.compile(r"^(?P<head>[^:：]{1,40}?)\s*[:：]\s*(?P<rest>.+)$", re.DOTALL)
_DASH = re.compile(r"^(?P<head>[^-–—]{1,30}?)\s+[-–—]\s+(?P<rest>.+)$")

# --------------------------------------------------------------------------- clauses

_CLAUSE_SPLIT_EN = re.compile(
    r",\s*(?:and\s+|but\s+|so\s+)?(?=(?:i|i'm|i've|i'd|im|my|our|we|we're|call me)\b)"
    r"|\s+(?:and|but|so)\s+(?=(?:i|i'm|i've|my|our|we|we're)\b)(?!i (?:are|both|were|have been)\b)"
    r"|\s+(?:and|but)\s+(?=(?:work|live|prefer|like|love|hate|speak|moved|have|use)\b)"
    r"|\s+and\s+(?=allergic\b)|,\s+(?=(?:living|based)\b)"
    r"|,\s+(?=an?\s)|,\s*so\s+"
    r"|\s+[-–—]\s+|;\s*",
    re.IGNORECASE,
)
_CLAUSE_SPLIT_ZH = re.compile(r"[，,；;]\s*")
# An adverb between the subject and its verb ("I'm slowly learning", "we live just outside").
_ADVERBS_EN = re.compile(
    r"^(?P<s>i|i'm|i am|im|i've|i have|we|we're|we are|we've)\s+(?:(?:currently|mostly|slowly"
    r"|really|usually|generally|actually|basically|primarily|mainly|already|both|all|definitely"
    r"|totally|pretty much|kind of|sort of)\s+)+",
    re.IGNORECASE,
)
_I_AM_EN = re.compile(r"(?:i'm|i am|im)\b", re.IGNORECASE)
_POLITE_EN = re.compile(r"^(?:could|can|would|will) you (?:please )?", re.IGNORECASE)
_IMPLICIT_I = re.compile(r"^(?:work|live|prefer|like|love|hate|speak|moved|have|use)\b", re.I)
_IMPLICIT_IM = re.compile(r"^(?:allergic\b|an?\s|living\b|based\b)", re.IGNORECASE)
_SUBJECT_ZH = re.compile(r"^(?:我|你|您|他|她|它|咱|请|别|不要|以后|今后|大家|有人)")
_CJK = re.compile(r"[\u4e00-\u9fff]")

STANDING_EN: Final = re.compile(
    r"\b(?:always|never|from now on|going forward|in (?:the )?future|every (?:time|answer|reply"
    r"|response)|in every|any ?more|ever|for me|by default|for anything|all (?:your|the)"
    r" (?:answers|replies|responses))\b",
    re.IGNORECASE,
)
_IMPERATIVE_EN = re.compile(
    r"^(?:please\s+)?(?:(?:from now on|going forward|in (?:the )?future|by default)[\s,]+)?"
    r"(?:please\s+)?(?:always|never|don't|do not|dont|stop|keep|use|answer|reply|respond|write"
    r"|give|show|format|avoid|no more|include|add|put|when you)\b"
    r"|^(?:dates|answers|replies|responses|code|prices|numbers|units|examples|times|amounts"
    r"|explanations)\b.*\b(?:should|must)\b"
    r"|^i(?:'d like| would like| want| need) (?:all |every |your )",
    re.IGNORECASE,
)
_ONE_OFF_EN = re.compile(
    r"\b(?:this (?:one|time|answer|reply|email|message|question|account|project|task|ticket"
    r"|customer|order|case|chat|conversation|session|thread)|just this|only this|for now"
    r"|today|here|only once)\b",
    re.IGNORECASE,
)
STANDING_ZH: Final = re.compile(
    r"^(?:回答|回复)请|以后|今后|往后|从现在起|一直|一律|统一|始终|每次|总是|永远|都用|别再|不要再|回复里|回答里|回复中|回答中"
)
_IMPERATIVE_ZH = re.compile(r"请|用|不要|别|回答|回复|给我")


@attrs.frozen
class Sentence:
    """One sentence that may state facts: its clauses (filler off, subject restored) and the
    whole of it (for a standing instruction); ``whole`` when no clause of it was left out (a
    transient one, "I'm tired today")."""

    language: str
    text: str
    clauses: tuple[str, ...]
    whole: bool = True


def language_of(text: str) -> str:
    return "zh" if _CJK.search(text) else "en"


def _unquoted(text: str) -> str:
    """``text`` without code, pasted log lines and quoted first-person speech."""
    text = re.sub(r"\b(?:pls|plz)\b", "please", _CODE_FENCE.sub("\n", text), flags=re.IGNORECASE)
    text = "\n".join(line for line in text.splitlines() if not _CODE_LINE.match(line))

    def drop(match: re.Match[str]) -> str:
        quoted = match.group("q") if match.group("q") is not None else match.group("s")
        return "" if _FIRST_PERSON.search(quoted or "") else match.group(0)

    return _QUOTED.sub(drop, text)


def _is_standing_ask(sentence: str) -> bool:
    """ "Could you always reply in bullet points from now on?": a standing request, asked."""
    return bool(_POLITE_EN.match(sentence) and STANDING_EN.search(sentence))


def _is_out(sentence: str, language: str) -> bool:
    """A question, hypothetical, reported or transient sentence: no fact in it."""
    if language == "en" and _is_standing_ask(sentence):
        return bool(_ONE_OFF_EN.search(sentence))
    if sentence.endswith(("?", "？")):
        return True
    if language == "en":
        sentence = _EVEN_IF.sub("", sentence)
        checks = (_QUESTION_EN.match, _HYPOTHETICAL_EN.search, _REPORTED_EN.search)
    else:
        checks = (_QUESTION_ZH.search, _HYPOTHETICAL_ZH.search, _REPORTED_ZH.search)
    return any(check(sentence) for check in checks)


def _strip_lead(sentence: str, language: str) -> str | None:
    """``sentence`` without its lead-ins, or None when a colon's prefix frames what follows
    as someone else's text (an email, a log, a story)."""
    lead, framing = (_LEAD_EN, _FRAMING_EN) if language == "en" else (_LEAD_ZH, _FRAMING_ZH)
    sentence = lead.sub("", sentence.strip()).strip()
    for pattern in (_COLON, _DASH):
        match = pattern.match(sentence)
        if match is None:
            continue
        head = match.group("head")
        if framing.search(head):
            return None
        short = len(head.split()) <= 5 if language == "en" else len(head) <= 8
        if short and not _FIRST_PERSON.search(head):
            sentence = lead.sub("", match.group("rest")).strip()
    return sentence


def _clauses(sentence: str, language: str) -> tuple[list[str], bool]:
    """The clauses of ``sentence`` that may state a fact, and whether none was left out."""
    split = _CLAUSE_SPLIT_EN if language == "en" else _CLAUSE_SPLIT_ZH
    transient = _TRANSIENT_EN if language == "en" else _TRANSIENT_ZH
    lead = _LEAD_EN if language == "en" else _LEAD_ZH
    out: list[str] = []
    whole = True
    for index, raw in enumerate(split.split(sentence)):
        part = lead.sub("", raw.strip()).strip()
        if not part or transient.search(part):
            whole = whole and not part
            continue
        if index and language == "en":
            part = _subject_en(part, out)
        elif index and not _SUBJECT_ZH.match(part):
            part = f"我{part}"
        if part and language == "en":
            part = _ADVERBS_EN.sub(lambda m: f"{m.group('s')} ", part)
        if part:
            out.append(part)
        whole = whole and bool(part)
    return out, whole


def _subject_en(part: str, before: list[str]) -> str:
    """A clause's subject restored from the clause before ("… and live in Porto")."""
    if _IMPLICIT_I.match(part):
        return f"I {part}"
    if _IMPLICIT_IM.match(part):  # "I'm Dana, a UX designer"; "vegan and allergic to nuts"
        after_mine = bool(before) and _I_AM_EN.match(before[-1]) is not None
        is_mine = after_mine or part.casefold().startswith(("living", "based"))
        return f"I'm {part}" if is_mine else ""
    return part


def sentences(text: str) -> list[Sentence]:
    """The sentences of a user message that may state a fact about the user, in order."""
    out: list[Sentence] = []
    for raw in _SENTENCE_SPLIT.split(_unquoted(text)):
        raw = raw.strip()
        if not raw:
            continue
        language = language_of(raw)
        sentence = _strip_lead(raw, language)
        if not sentence or _is_out(sentence, language):
            continue
        parts, whole = _clauses(sentence, language)
        out.append(Sentence(language, sentence, tuple(parts), whole))
    return out


def clauses(text: str) -> list[str]:
    """The clauses of ``text`` that may state a fact, filler taken off, in order."""
    return [clause for sentence in sentences(text) for clause in sentence.clauses]


def is_conjecture(text: str) -> bool:
    """``text`` (a fact as a model worded it) asks or supposes rather than states: a question
    or a hypothetical by the same patterns that keep such sentences from the offline
    extractor. (A question's opening word is not checked: a fact has no subject, and "Is a
    nurse" or "Does not drink" are statements.)"""
    text = text.strip()
    if text.endswith(("?", "？")):
        return True
    if language_of(text) == "en":
        return _HYPOTHETICAL_EN.search(_EVEN_IF.sub("", text)) is not None
    return bool(_QUESTION_ZH.search(text) or _HYPOTHETICAL_ZH.search(text))


def speaks_of_self(sentence: Sentence) -> bool:
    """The user speaks of themselves (a first-person subject or owner) or gives a standing
    instruction: the only sentences the offline patterns read a fact in. A one-off request
    ("Convert 5 miles to km", 帮我总结一下这段讨论) or small talk ("lmao ok") is neither."""
    return _SELF.search(sentence.text) is not None or standing_instruction(sentence) is not None


def standing_instruction(sentence: Sentence) -> str | None:
    """The sentence as a standing instruction ("Please always answer in Spanish", 请以后都用
    中文回答), without its "please"; None for anything else, a one-off request included."""
    text = _POLITE_EN.sub("", sentence.text.rstrip(" .!?。！"))
    if sentence.language == "en":
        if _TRANSIENT_EN.search(text) or _ONE_OFF_EN.search(text):
            return None
        if not (_IMPERATIVE_EN.search(text) and STANDING_EN.search(text)):
            return None
        text = re.sub(r"\bplease\b[\s,]*", "", text, flags=re.IGNORECASE).strip(" ,")
        return text[:1].lower() + text[1:] if text else None
    if _TRANSIENT_ZH.search(text) or not (STANDING_ZH.search(text) and _IMPERATIVE_ZH.search(text)):
        return None
    return text.replace("请", "") or None
