"""The offline extractor's vocabulary (docs/design.md §9): the kinds of fact people state about
themselves (slots, each worded per language) and the first-person patterns, en and zh, that
state them, tried in order on one clause at a time; the first that matches wins."""

from __future__ import annotations

import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Final

import attrs

from ragent_memory.longterm.vocabulary import normalised


@attrs.frozen
class Slot:
    """A kind of fact and how it is worded, per language."""

    key: str
    templates: dict[str, str]  # language → "Lives in {x}"
    is_single: bool = False
    opposite: str | None = None

    def render(self, language: str, value: str, thing: str = "") -> str:
        return self.templates[language].format(x=value, thing=thing)


def _slot(
    key: str, en: str | None, zh: str | None = None, *, single: bool = False, opposite: str = ""
) -> Slot:
    templates = {k: v for k, v in (("en", en), ("zh", zh)) if v is not None}
    return Slot(key, templates, single, opposite or None)


SLOTS: Final = MappingProxyType(
    {
        s.key: s
        for s in (
            _slot("name", "Is called {x}", "名叫{x}", single=True),
            _slot("address", "Goes by {x}", "希望被称呼为{x}", single=True),
            _slot("pronouns", "Uses the pronouns {x}", None, single=True),
            _slot("surname", None, "姓{x}", single=True),
            _slot("lives", "Lives in {x}", "住在{x}", single=True),
            _slot("from", "Is from {x}", "老家在{x}", single=True),
            _slot("timezone", "Timezone is {x}", "时区是{x}", single=True),
            _slot("employer", "Works at {x}", "在{x}工作", single=True),
            _slot("occupation", "Works as {x}", None, single=True),
            _slot("job", "Job is {x}", "工作：{x}", single=True),
            _slot("field", "Works in {x}"),
            _slot("teaches", "Teaches {x}"),
            _slot("owns", "Owns {x}", "开了{x}"),
            _slot("runs", "Runs {x}"),
            _slot("favourite", "Favourite {thing} is {x}", single=True),
            _slot("allergic", "Is allergic to {x}", "对{x}过敏"),
            _slot("prefers", "Prefers {x}", "偏好{x}"),
            _slot("rather", "Would rather {x}"),
            _slot("likes", "Likes {x}", "喜欢{x}", opposite="dislikes"),
            _slot("dislikes", "Does not like {x}", "不喜欢{x}", opposite="likes"),
            _slot("speaks", "Speaks {x}", "会说{x}"),
            _slot("plays", "Plays {x}"),
            _slot("doing", "Has been {x}", "最近在{x}"),  # before "Has {x}"
            _slot("has", "Has {x}", "养了{x}"),
            _slot("have", None, "有{x}"),
            _slot("with", None, "和{x}"),
            _slot("health", None, "身体情况：{x}"),
            _slot("family", "Their {x}", "自己的{x}"),
            _slot("plans", "Plans to {x}", "打算{x}"),
            _slot("target", "Goal is {x}", "目标是{x}"),
            _slot("project", "Side project is {x}"),
            _slot("team", "Team is {x}", "团队{x}"),
            _slot("uses", "Uses {x}", "使用{x}"),
            _slot("eats", "Eats {x}", "吃{x}"),
            _slot("keeps", "Keeps {x}"),
            _slot("follows", "Follows {x}"),
            _slot("birthday", "Birthday is {x}", "生日是{x}", single=True),
            _slot("born", "Was born in {x}", single=True),
            _slot("paid", "Gets paid {x}"),
            _slot("monthly", None, "每个月{x}"),
            _slot("wants", "Always wants {x}"),
            _slot("request", "Standing request: {x}", "长期要求：{x}"),
            _slot("not", "Does not {x}", "不{x}"),
            _slot("has not", "Has not {x}"),
            _slot("resigned", None, "已{x}"),
            _slot("no longer", "No longer {x}", "不再{x}"),
            _slot("is not", "Is no longer {x}"),
            _slot("stopped", "Stopped {x}"),
            _slot("quit", "Quit {x}", "戒了{x}"),
            _slot("gave up", "Gave up {x}"),
            _slot("left", None, "离开了{x}"),
            _slot("lacks", None, "没有{x}"),
            _slot("always", "Always {x}", None, opposite="never"),
            _slot("never", "Never {x}", "从不{x}", opposite="always"),
            _slot("identity", "Is {x}", "是{x}"),  # last: "Is called …" is a name
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


FACT_PATTERNS: Final = tuple(
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
    for slot, language, pattern in FACT_PATTERNS:
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
    is_negation: bool = False  # supersedes the positive fact it denies
    check: Check | None = None
    verb: bool = False  # the value starts with a verb to put in the third person


def _en(
    slot: str, regex: str, *, neg: bool = False, check: Check | None = None, verb: bool = False
) -> Pattern:
    """An English pattern, case-insensitive but where it asks for a capital (``[A-Z]``): there
    only the part before ``(?P<x>`` ignores case."""
    if "[A-Z" in regex:
        head, _, tail = regex.partition("(?P<x>")
        return Pattern(slot, "en", re.compile(f"(?i:{head})(?P<x>{tail}"), neg, check, verb)
    return Pattern(slot, "en", re.compile(regex, re.IGNORECASE), neg, check, verb)


def _zh(slot: str, regex: str, *, neg: bool = False, check: Check | None = None) -> Pattern:
    return Pattern(slot, "zh", re.compile(regex), neg, check)


_NAME_LIKE_WORDS = """sorry fine ok okay good great back here done new not from in on at the a an also just
    still so very really english american british canadian german french spanish italian
    chinese japanese indian korean dutch swiss irish scottish welsh australian mexican
    brazilian russian polish swedish danish norwegian finnish portuguese greek turkish jewish
    muslim christian hindu buddhist catholic vegan vegetarian"""
_NOT_NAMES: Final = frozenset(_NAME_LIKE_WORDS.split())


_DETERMINER_WORDS = "the a an this that these those it my your his her some any"
_DETERMINERS: Final = frozenset(_DETERMINER_WORDS.split())


def _has_predicate(value: str) -> bool:
    """ "Their husband" alone ("my husband too") says nothing about him."""
    return " " in value.strip()


def tool_value(value: str) -> bool:
    """A tool's name, not a thing ("vim", "a Windows laptop"; not "a hack", "the staging db")."""
    words = value.split()
    if words[0].casefold() in ("a", "an") and len(words) > 1:
        return words[1][:1].isupper()
    return words[0].casefold() not in _DETERMINERS


def is_name(value: str) -> bool:
    """One to three capitalised words that are not a nationality or a state ("I'm Priya")."""
    words = value.split()
    return (
        0 < len(words) <= 3
        and all(w[0].isupper() for w in words)
        and words[0].casefold().strip(".,") not in _NOT_NAMES
    )


_SHORT_NAME = re.compile(r"^\S+(?:\s+\S+){0,3}$")
_CAPITALISED = re.compile(r"^[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*){0,3}$")
_NAMED = r"(?P<x>[A-Z][\w'’-]+(?: [A-Z][\w'’-]+)?)"
_I_AM = r"(?:i'm|i am|im)"
_I_HAVE = r"(?:i've|i have|ive)"
_WE = r"(?:we|we're|we are|our team|my team|our company|the team)"
_LATELY = r"(?:now |currently |still |recently |just |also )?"
_ADVERB = r"(?:really |just |also |absolutely |genuinely |still |mostly |mainly |usually )?"
_NOT_DET = r"(?!(?:the|a|an|this|that|these|those|it|my|your|his|her|some|any)\b)"
_NOT_TASK = (
    r"(?!(?:the|this|that|these|those|it|my|your|some)\b|an? (?:e-?mail|message|reply|letter|note"
    r"|comment|review|ticket|test|query|function|script|fix|patch)\b)"
)
_RELATIVES = (
    r"(?:kids?|children|child|sons?|daughters?|wife|husband|partner|boyfriend|girlfriend"
    r"|mom|mum|mother|dad|father|parents|sisters?|brothers?|family|twins?|baby|grandparents"
    r"|dogs?|cats?|puppy|kitten|pets?|parrot|rabbit|hamster|horse|(?:wedding )?anniversary)"
)
_PETS_AND_KIDS = (
    r"(?:a|an|one|two|three|four|five|\d+) (?:[\w-]+ ){0,2}?"
    r"(?:dogs?|cats?|puppy|puppies|kittens?|birds?|parrots?|fish|hamsters?|rabbits?|horses?"
    r"|turtles?|kids?|children|sons?|daughters?|boys?|girls?|brothers?|sisters?|twins?"
    r"|newborn|baby|babies|grandchildren|collie|retriever|terrier|spaniel|poodle|labrador|lab"
    r"|shepherd|husky|beagle|bulldog|pug|corgi|dachshund|greyhound|tortoise|snake|lizard)\b"
)
_STATES = (
    r"vegetarian|vegan|pescatarian|lactose[- ]intolerant|gluten[- ]free|gluten[- ]intolerant"
    r"|[\w]+-free|plant-based|co?eliac|diabetic|pregnant|deaf|hard of hearing|blind|colou?r ?blind|dyslexic|autistic"
    r"|epileptic|asthmatic|sober|teetotal|left[- ]handed|right[- ]handed|retired|married"
    r"|divorced|widowed|engaged|a single (?:mum|mom|dad|parent|father|mother)"
)
_CONDITIONS = (
    r"diabetes|asthma|co?eliac|epilepsy|arthritis|migraines|adhd|autism|dyslexia|high blood"
    r" pressure|hypertension|bad (?:knee|back|hip|shoulder)|tinnitus|ibs|crohn's|anxiety"
    r"|depression|a pacemaker|allergies|eczema|psoriasis|a heart condition|long covid|allergy"
    r"|intolerance|disease|disorder|syndrome"
)
_GOALS = (
    r"training|learning|writing|building|renovating|saving|studying|preparing|practi[cs]ing"
    r"|developing|working towards|trying to (?:lose|gain|get|run|learn|quit|save)|pursuing|completing"
    r"|finishing|running for|campaigning"
)
_TOOL_THINGS = (
    r"laptop|computer|machine|pc|editor|ide|os|phone|shell|terminal|browser|setup|stack"
    r"|tech stack|ci|cd|ci/cd|backend|frontend|database|db|production db|production database"
    r"|infra|infrastructure|cloud|pipeline|main language|language|codebase|app|product|site"
    r"|website|api|service|platform"
)
_HABITS = r"eat|drink|smoke|use|own|have an?|live in|work (?:at|for)|watch|drive|code in|do|play"
_PLACE_ZH = r"\S{1,10}?(?:海岸|省|市|区|县|州|国|岛|湾区)"
_TOOLS_ZH = (
    r"(?P<x>[A-Za-z][\w.+#-]*(?: [\d.]+| [A-Z][\w.+#-]*)*|飞书|钉钉|企业微信|阿里云|腾讯云|华为云)"
)
_CONDITIONS_ZH = r"糖尿病|高血压|哮喘|乳糖不耐受|过敏性鼻炎|心脏病|抑郁症|焦虑症|胃病|颈椎病|腰椎间盘突出|痛风|癫痫|贫血"

NEGATIONS: Final = (
    _en("dislikes", rf"i {_ADVERB}(?:don't|do not|dont) (?:really )?(?:like|enjoy) (?P<x>.+)"),
    _en("no longer", r"(?:i|we) no longer (?P<x>.+)", neg=True, verb=True),
    _en("not", r"(?:i|we) (?:don't|do not|dont) (?P<x>\w+ .+?) any ?more$", neg=True),
    _en("not", r"i (?:can't|cannot|can not) (?P<x>(?:eat|drink|have|tolerate) .+)", neg=True),
    _en("has not", r"i (?:haven't|have not) (?P<x>\w+ .+? since .+)", neg=True),
    _en("not", rf"(?:i|we) (?:don't|do not|dont) (?P<x>(?:{_HABITS})\b.+)", neg=True),
    _en("is not", rf"{_I_AM} (?:not|no longer) (?P<x>.+?)(?: any ?more| these days)$", neg=True),
    _en("is not", rf"{_I_AM} no longer (?P<x>.+)", neg=True),
    _en(
        "stopped",
        r"(?:i|we) (?P<w>stopped|quit|gave up) (?P<x>(?:\w+ing|meat|sugar|alcohol|booze|coffee"
        r"|caffeine|dairy|gluten|carbs|cigarettes|tobacco|fish|social media|my job)\b.*)",
        neg=True,
    ),
    _en(
        "never",
        r"i never (?P<x>(?:use|eat|drink|watch|work|smoke|go|take|wear|code|cook|fly|drive)\b.+)",
        neg=True,
        verb=True,
    ),
    _zh("dislikes", r"我(?:很|真的|特别|非常|也)?(?:不喜欢|讨厌|不爱)(?P<x>.+)"),
    _zh("no longer", r"我(?:已经|早就|早已)?不(?:再)?在(?P<x>.{1,20}?(?:工作|上班))了?$", neg=True),
    _zh("no longer", r"我(?:已经|早就|早已)?不再(?P<x>.+?)了?$", neg=True),
    _zh("no longer", r"我(?:已经|早就|早已)不(?P<x>在\S{1,10})了$", neg=True),
    _zh(
        "no longer", r"我(?:已经|早就|早已)不(?P<x>(?:喝|吃|抽|用|住在|开|玩|养)\S+?)了$", neg=True
    ),
    _zh("no longer", r"我不(?P<x>(?:喝|吃|抽|用|住在|开|玩|养)\S+?)了$", neg=True),
    _zh("quit", r"我(?:已经)?戒(?:了|掉了)?(?P<x>烟|酒|糖|咖啡|奶茶|游戏)", neg=True),
    _zh("left", r"我(?:已经)?离开了?(?P<x>[^，。]{1,12})$", neg=True),
    _zh("lacks", r"我(?:还)?没有(?P<x>车|房子?|孩子|小孩|宠物|驾照|对象)", neg=True),
    _zh("never", r"我从(?:来)?不(?P<x>(?:喝|吃|抽|用|坐)\S+)", neg=True),
    _zh("not", r"我不(?P<x>(?:吃|喝|抽)\S+)", neg=True),
    _zh("not", r"我(?:不能|不可以|没法)(?P<x>(?:吃|喝)\S+)", neg=True),
    _zh(
        "resigned",
        r"我(?:去年|今年|前年|已经|早就|刚|刚刚|上个月)?(?P<x>辞职|退休|离职)了",
        neg=True,
    ),
)

IDENTITY: Final = (
    _en(
        "name",
        r"(?:my (?:first |full )?name is|my name's|(?:the )?name's|i'm called|i am called) (?P<x>.+)",
        check=_SHORT_NAME.match,
    ),
    _en("name", r"(?:you can |please |just )?call me (?P<x>.+)", check=_CAPITALISED.match),
    _en(
        "address",
        r"(?:please )?(?:address me as|refer to me as) (?P<x>.+)",
        check=_CAPITALISED.match,
    ),
    _en("address", r"i go by (?P<x>.+)", check=_CAPITALISED.match),
    _en(
        "address",
        r"(?:everyone|everybody|people|friends|my friends|most people) (?:calls?|knows?) me (?:as )?(?P<x>.+)",
        check=_CAPITALISED.match,
    ),
    _en("pronouns", r"my pronouns are (?P<x>.+)"),
    Pattern("name", "en", re.compile(rf"(?i:i'm|i am) {_NAMED}$"), check=is_name),
    Pattern("name", "en", re.compile(rf"{_NAMED} here$"), check=is_name),
    _zh(
        "address",
        r"(?:你可以|可以|以后|请|就)*(?:称呼我|叫我)(?:为)?(?P<x>[^，。了你他她它过去来]\S{0,8}?)(?:就行|就好|就可以|吧)?$",
    ),
    _zh("address", r"(?:大家|朋友们?|别人|同事们?)都?叫我(?P<x>\S{1,8}?)(?:就行|就好|吧)?$"),
    _zh("name", r"(?:我叫|我的名字是|我的名字叫)(?P<x>(?![了你他她它过])\S{1,20})"),
    _zh("surname", r"我姓(?P<x>\S{1,2})$"),
)

WORK_AND_HOME: Final = (
    _en(
        "lives",
        r"(?:i (?:now |currently )?live in|i'm (?:now )?(?:living|based) (?:in|out of)"
        r"|i am (?:now )?(?:living|based) (?:in|out of)|i(?:'ve| have) been living in"
        r"|(?:we|we're|we are) (?:now |currently )?(?:live|living|based) (?:in|out of|near|outside|just outside)"
        r"|i (?:now |currently )?live (?:near|outside|just outside)|my home (?:base )?is"
        r"|i(?:'ve| have) lived in"
        r"|home is|(?:i|i've|i have|we|we've) (?:just |recently |finally )?(?:moved|relocated) to) (?P<x>.+)",
    ),
    _en("lives", rf"{_I_AM} (?:now |currently )?in {_NAMED}$"),
    _en("lives", r"i (?:now |currently )?live (?:[\w ]{0,30}? )?in (?P<x>[A-Z][\w ,-]*)"),
    _en("from", r"(?:i was )?born and raised in (?P<x>.+)"),
    _en("from", rf"{_I_AM} (?:originally )?from (?P<x>.+)"),
    _en(
        "timezone",
        r"(?:my (?:time ?zone|tz) is|i'm in the|i am in the) (?P<x>.+?)(?: time ?zone)?$",
    ),
    _en("timezone", rf"{_I_AM} on (?P<x>[\w+:-]+ time)$"),
    _en(
        "timezone", r"(?:so )?(?P<x>(?:gmt|utc|cet|cest|est|pst|ist)(?:\s?[+-]\d{1,2}(?::\d\d)?)?)$"
    ),
    _en(
        "employer",
        rf"(?:i {_LATELY}(?:work|am working)|i'm {_LATELY}working|{_I_HAVE} (?:been working|worked)"
        rf"|i {_LATELY}(?:started|began) (?:working|a (?:new )?job)) (?:at|for) (?P<x>.+)",
    ),
    _en("employer", rf"{_I_AM} {_LATELY}employed (?:at|by) (?P<x>.+)"),
    _en("employer", rf"i {_LATELY}(?:got|took|landed) a (?:new )?job (?:at|with) (?P<x>.+)"),
    _en("employer", rf"i {_LATELY}joined (?P<x>[A-Z].+)"),
    _en(
        "occupation",
        rf"(?:i {_LATELY}(?:work|am working)|i'm {_LATELY}working|{_I_HAVE} been working)"
        r" as (?P<x>.+)",
    ),
    _en("field", rf"i {_LATELY}work in (?P<x>.+)"),
    _en("job", r"my (?:job|day job|role) is (?P<x>.+)"),
    _en("teaches", r"i teach (?P<x>.+)"),
    _en("owns", r"i (?:own|co-own) (?P<x>(?:a|an|the|my) .+)"),
    _en(
        "runs",
        r"i (?:run|lead|manage|head) (?P<x>.*\b(?:team|company|business|shop|store|bakery"
        r"|startup|agency|department|lab|restaurant|caf[eé]|blog|podcast|channel|club|clinic"
        r"|practice|farm)\b.*)",
    ),
    _en("identity", r"as (?P<x>an? [\w -]{2,40})$"),
    _en("identity", rf"{_I_HAVE} been (?P<x>an? (?!bit\b|little\b|lot\b)[\w -]+)"),
    _en(
        "identity",
        rf"{_I_AM} {_LATELY}(?P<x>the (?:\w+ ){{0,2}}?(?:cto|ceo|cfo|coo|founder|co-founder|head|lead|manager|owner|director|editor|chair|president)\b.*)",
    ),
    _zh(
        "lives",
        r"(?:我(?:现在|目前|一直|从小)?住在|我(?:(?!不|没|想|(?<!主)要|会|能)[^，。搬]){0,8}?搬到了?|我(?:现在)?定居在|我常驻|我人在|我家(?:住)?在|我们(?:一家(?:人)?|全家)?住在)(?P<x>.+)",
    ),
    _zh("lives", r"我(?:现在|目前)?在(?P<x>\S{1,10}?)(?:生活|定居|常驻)"),
    _zh("lives", rf"我(?:现在|目前)?在(?P<x>{_PLACE_ZH})$"),
    _zh("from", r"我(?:的)?老家(?:是|在)(?P<x>.+?)的?$"),
    _zh("timezone", r"我(?:的)?时区是(?P<x>.+)"),
    _zh("timezone", r"我.*?按(?P<x>\S{1,8}时间)算"),
    _zh(
        "employer",
        r"我(?:是)?(?:现在|(?!不|没|想|(?<!主)要|会|能)[^，。在]){0,6}?在(?P<x>.{1,30}?)(?:工作|上班|任职)",
    ),
    _zh("job", r"我(?:现在|目前|最近)?在(?P<x>.{1,20}?(?:做|当)\S+)"),
    _zh("employer", r"我(?:刚|已经)?(?:入职|加入)了?(?P<x>\S{1,20})$"),
    _zh("job", r"我(?:的)?(?:岗位|职位|工作|职业)是(?P<x>.+)"),
    _zh("job", r"我(?:现在|目前)?(?:在)?(?P<x>自己创业|创业|做自由职业|自由职业)"),
    _zh("owns", r"我开了(?P<x>一家.+)"),
    _zh("identity", r"作为(?:一名|一个|一位)?(?P<x>[^，。]{1,12})$"),
)

LIFE: Final = (
    _en("allergic", rf"{_I_AM} (?:very |severely |really |highly |mildly )?allergic to (?P<x>.+)"),
    _en(
        "identity",
        rf"(?:{_I_AM}|we're|we are) (?P<x>(?:an? )?(?:(?!not\b)[\w-]+ ){{0,2}}?(?:{_STATES}))\b",
    ),
    _en("identity", rf"{_I_AM} (?P<x>\d\d(?: years old| yrs old)?(?: and an? .+)?)$"),
    _en("identity", rf"{_I_AM} (?P<x>(?:the|their|our) (?:only|main|sole|lead|head|resident) .+)"),
    _en("identity", rf"{_I_AM} (?:fairly |quite |very |pretty )?(?P<x>new to .+)"),
    _en(
        "has",
        rf"(?:i have|i've got|i've had|i suffer from|i live with) (?P<x>(?:\w+ ){{0,3}}?(?:{_CONDITIONS})\b.*)",
    ),
    _en(
        "eats",
        r"i (?:only )?eat (?P<x>(?:only )?(?:halal|kosher|vegan|vegetarian|plant-based|organic|fish|meat)\b.*)",
    ),
    _en("keeps", r"i keep (?P<x>kosher|halal)"),
    _en("follows", rf"(?:i follow|{_I_AM} on) (?P<x>an? [\w -]*\bdiet\b.*)"),
    _en("family", rf"(?:my|our) (?:\w+ )?(?P<x>{_RELATIVES}\b.+)", check=_has_predicate),
    _en(
        "family",
        rf"i (?P<x>(?:look after|care for|live with|support|raise) (?:my|our) (?:\w+ )?{_RELATIVES}\b.*)",
        verb=True,
    ),
    _en("has", rf"(?:i (?:have|own)|{_I_HAVE} got|we have|we've got) (?P<x>{_PETS_AND_KIDS}.*)"),
    _en("has", rf"(?:i have|{_I_HAVE} got|we have) (?P<x>an? [\w -]+ (?:called|named) [A-Z].*)"),
    _en("birthday", r"my (?:birthday is|birthday's|birthday falls) (?P<x>.+)"),
    _en("born", r"i was born (?:in|on) (?P<x>.+)"),
    _en("paid", r"i get paid (?P<x>.+)"),
    _zh("allergic", r"我对(?P<x>.{1,30}?)过敏"),
    _zh("health", r"我(?P<x>(?:腰|膝盖|胃|心脏|颈椎|眼睛|视力|睡眠|肠胃)(?:不好|不太好))"),
    _zh("have", rf"我(?:有|患有|得了)(?P<x>\S*(?:{_CONDITIONS_ZH})\S*)"),
    _zh("eats", r"我(?:只|一直|长期)?(?:吃|是)?(?P<x>素食?|清真\S*|全素|纯素)"),
    _zh(
        "family",
        r"我(?:的)?(?P<x>(?:孩子|儿子|女儿|妻子|老婆|丈夫|老公|先生|太太|爱人|媳妇|父母|爸妈|妈妈|爸爸|哥哥|姐姐|弟弟|妹妹|狗|猫)\S+)",
    ),
    _zh("family", r"我们的(?P<x>结婚纪念日\S+)"),
    _zh("with", r"我和(?P<x>(?:父母|爸妈|家人|妻子|老婆|丈夫|老公|孩子)\S*)"),
    _zh("identity", r"我(?:已经)?(?P<x>结婚|离婚|订婚)了?$"),
    _zh("have", r"我们?(?:家)?(?:里)?有(?P<x>(?:一|两|二|三|四|五|\d+)(?:个|只|条|位)\S+)"),
    _zh("has", r"我(?:家)?(?:里)?(?:养了|养着)(?P<x>.+)"),
    _zh("birthday", r"我(?:的)?生日(?:是|在)?(?P<x>.+)"),
    _zh("monthly", r"我每(?:个)?月(?P<x>.+)"),
)

STACK: Final = (
    _en("timezone", rf"{_I_AM} on (?P<x>\w+ time)\b"),
    _en(
        "uses",
        rf"(?:i|we|{_WE}) {_ADVERB}(?:use|uses|are using|is using) (?P<x>.+)",
        check=tool_value,
    ),
    _en("uses", r"(?:i'm|i am|we're|we are) (?:on|running) (?P<x>(?:an? )?[A-Z0-9].+)"),
    _en("uses", rf"my (?:{_TOOL_THINGS}) (?:is|runs|runs on) (?P<x>.+)"),
    _en("uses", rf"our (?:\w+ )?(?:{_TOOL_THINGS}) (?:is|are|runs on|uses|lives on) (?P<x>.+)"),
    _en("uses", r"i (?:code|program|write code|develop) (?:mostly |mainly |only )?in (?P<x>.+)"),
    _en("uses", r"i do (?:all )?my (?:\w+ ){0,2}in (?P<x>[A-Z].*)"),
    _en(
        "uses",
        r"we (?:deploy|host|run)(?: everything| it all| our \w+)? (?:on|to|with) (?P<x>[A-Z].+)",
    ),
    _en("uses", r"(?:i|we) (?:switched|moved|migrated) (?:over )?(?:from .+? )?to (?P<x>[A-Z].+)"),
    _en("uses", r"i (?:write|code in|program in) (?P<x>[A-Z][\w#+.-]*.*)"),
    _en(
        "uses",
        r"(?:my|our) (?:team|company|office|org|whole team) (?:is|are) (?:all |mostly )?(?:on|using) (?P<x>.+)",
    ),
    _en("uses", r"we're an? (?P<x>[A-Z]\w+) (?:store|shop|company|house|team)\b"),
    _en("uses", rf"{_I_AM} stuck on (?P<x>[A-Z]\w* \d[\d.]*.*)"),
    _zh(
        "uses",
        rf"我们?(?:团队|公司|组)?(?:的)?\S{{0,6}}?(?:用的是|使用的是|采用的是)(?:\S{{0,4}}?){_TOOLS_ZH}",
    ),
    _zh(
        "uses",
        rf"我们?(?:(?!不|没|想|(?<!主)要|会|能)[^，。用写]){{0,6}}?(?:用|使用|采用|写){_TOOLS_ZH}",
    ),
    _zh(
        "uses",
        rf"(?:我的|我们的|公司的)(?:电脑|笔记本|手机|编辑器|系统|数据库|技术栈|服务器)是{_TOOLS_ZH}",
    ),
    _zh("uses", r"我们?(?:的)?\S{0,6}?部署在(?P<x>\S+?)上?$"),
)

WANTS: Final = (
    _en("likes", rf"i {_ADVERB}(?:like|love|prefer) it when (?P<x>.+)"),
    _en(
        "prefers", r"i (?:always |generally |usually |much |really |would |still )?prefer (?P<x>.+)"
    ),
    _en("rather", r"i'd (?:much )?rather (?P<x>.+)"),
    _en("wants", r"i always (?:want|need|expect) (?P<x>.+)"),
    _en("dislikes", rf"i {_ADVERB}(?:hate|dislike|detest|can't stand|cannot stand) (?P<x>.+)"),
    _en("dislikes", rf"{_I_AM} not (?:a|the biggest) fan of (?P<x>.+)"),
    _en(
        "likes",
        rf"i {_ADVERB}(?:like|love|enjoy|adore) (?!(?:this|that|these|those|it)\b)(?P<x>.+)",
    ),
    _en("likes", r"my (?:hobby is|hobbies are|hobbies include) (?P<x>.+)"),
    _en("likes", rf"{_I_AM} {_ADVERB}(?:into|passionate about|a (?:big |huge )?fan of) (?P<x>.+)"),
    _en("favourite", r"my favou?rite (?P<thing>[a-z][\w -]{0,30}?) is (?P<x>.+)"),
    _en("plans", r"(?:i plan|i'm planning|i am planning|i intend|i hope) to (?P<x>.+)"),
    _en("identity", rf"{_I_AM} {_LATELY}(?P<x>(?:{_GOALS}) {_NOT_TASK}.+)"),
    _en(
        "team",
        rf"(?:we're|we are) {_LATELY}(?P<x>(?:migrating|moving|rewriting|rebuilding|switching|building) .+)",
    ),
    _en(
        "project",
        r"my (?:side|pet|hobby|passion|long-term|main|current|personal) project is (?P<x>.+)",
    ),
    _en("target", r"my (?:main |big )?goal(?: this year| for \w+)? is (?P<x>.+)"),
    _en(
        "identity",
        rf"{_I_HAVE} been (?:working on|building) (?P<x>.+? as an? (?:long-term |side |hobby )+project)",
    ),
    _en("doing", rf"{_I_HAVE} been (?:really )?(?P<x>[a-z]+ing\b.+)"),
    _en("plays", rf"i {_ADVERB}play (?P<x>.+)"),
    _en("speaks", r"i (?:can )?speak (?P<x>.+)"),
    _en("always", r"(?:please )?(?P<w>always|never) (?P<x>.+?) for me$"),
    _zh("prefers", r"我(?:更喜欢|偏好|倾向于|比较喜欢|习惯)(?P<x>.+)"),
    _zh("likes", r"我的爱好是(?P<x>.+)"),
    _zh("likes", r"我(?:一直|很|最|特别|非常|真的|也|都)*(?:喜欢|热爱)(?P<x>.+)"),
    _zh("speaks", r"我会说(?P<x>.+)"),
    _zh("doing", r"我(?:最近|这段时间)(?:一直)?在(?P<x>.+)"),
    _zh(
        "doing", r"我(?:正|一直)?在(?P<x>(?:准备|备考|学|写一|攒钱|做一个|减肥|练|筹备|备孕|考)\S*)"
    ),
    _zh("plans", r"我(?:打算|计划|准备)(?P<x>.+)"),
    _zh("target", r"我(?:的)?(?:今年的|今年|人生的?|长期)?目标是(?P<x>.+)"),
    _zh("team", r"我们(?:团队|公司|组)?(?:今年|明年|最近|正在)?(?:要|在|计划|准备)(?P<x>.+)"),
)

LAST: Final = (
    _en(
        "identity",
        rf"{_I_AM} {_LATELY}(?P<x>(?:a|an) (?!bit\b|little\b|lot\b|moment\b|second\b|minute\b|sec\b|few\b|customer\b|tourist\b).+)",
    ),
    _zh(
        "identity",
        r"我是(?:一名|一个|一位|个|名)?(?P<x>(?![说不想在来要问因觉指从怎什谁否的])[^，。！？]{1,20})",
    ),
)

PATTERNS: Final = (*NEGATIONS, *IDENTITY, *WORK_AND_HOME, *LIFE, *STACK, *WANTS, *LAST)


def third_person(phrase: str) -> str:
    """``phrase`` with its first word, a verb, in the third person ("work at" → "works at")."""
    verb, _, rest = phrase.partition(" ")
    lower = verb.casefold()
    if lower in ("have", "be", "do", "go"):
        verb = {"have": "has", "be": "is", "do": "does", "go": "goes"}[lower]
    elif lower.endswith(("s", "sh", "ch", "x", "z", "o")):
        verb += "es"
    elif lower.endswith("y") and lower[-2:-1] not in "aeiou":
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    return f"{verb} {rest}".strip()
