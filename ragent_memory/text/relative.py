"""Relative time in a dated message, anchored to its date: ``anchored`` writes what "yesterday",
"last week" or "two days ago" meant on the day the message was written, in brackets after the
words ("I went yesterday [7 May 2023]"), so an excerpt read months later still says when.

English and Chinese ("我昨天去了 [2023年5月7日]", "上个月 [2023年4月]", "三天前"), each anchored in
its own language's form; a date stamp this module cannot read (``terms.date_stamp`` forms:
"8 May, 2023", "May 8, 2023", "2023-05-08", "2023年5月8日") anchors nothing. A phrase with one
meaning on a calendar becomes that date, month or year; a phrase that names a span stays a
span ("the week before 9 June 2023", "2023年6月9日的前一周"), never a guessed day. Chinese has
no word breaks, so only phrases that cannot be part of another word are read: "上周" but not
"上周五" (the Friday of last week: a day this module does not guess), "上个月" but not "上月"
(the end of "晚上" before "月亮").
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Final

_MONTHS: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NUMBERS: Final = ("a", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_COUNT: Final = (
    r"(?P<n>\d{1,2}|a|one|two|three|four|five|six|seven|eight|nine|ten|a few|a couple of)"
)
_WEEKDAY: Final = r"(?P<day>mon|tues?|wed|thu(?:rs?)?|fri|sat|sun)(?:day|nesday|urday)?\b\.?"
_RELATIVE = re.compile(
    r"(?<!the )\b(?:"
    r"(?P<yesterday>yesterday|last night|the day before yesterday)"
    r"|(?P<tomorrow>tomorrow)"
    r"|(?P<ago>" + _COUNT + r"\s+(?P<unit>day|week|weekend|month|year)s?\s+ago)"
    r"|(?P<near>(?P<which>last|this past|next)\s+(?:(?P<span>week|weekend|month|year)\b"
    r"|" + _WEEKDAY + r"))"
    r")",
    re.IGNORECASE,
)
_ZH_COUNT: Final = r"(?P<zn>\d{1,2}|[一二两三四五六七八九十]{1,3}|几)"
_ZH_RELATIVE = re.compile(
    r"(?P<zday>大前天|前天|昨天|昨晚|昨日|明天|明日|后天)"
    r"|(?P<zago>" + _ZH_COUNT + r"\s*(?P<zunit>天|个星期|星期|个礼拜|礼拜|周|个月|年)前)"
    r"|(?P<znear>(?P<zwhich>[上下])(?:个)?(?P<zspan>周末|星期|礼拜|周)(?![一二三四五六日天])"
    r"|(?P<zmonth>[上下])个月)"
    r"|(?P<zyear>前年|去年|明年)"
)
_ZH_DIGITS: Final = "零一二三四五六七八九"
_STAMP = re.compile(
    r"(?P<d1>\d{1,2})(?:st|nd|rd|th)?\s+(?P<m1>[a-z]{3,9})\.?,?\s+(?P<y1>\d{4})"
    r"|(?P<m2>[a-z]{3,9})\.?\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<y2>\d{4})"
    r"|(?P<y3>\d{4})-(?P<m3>\d{2})-(?P<d3>\d{2})"
    r"|(?P<y4>\d{4})\s*年\s*(?P<m4>\d{1,2})\s*月\s*(?P<d4>\d{1,2})\s*[日号]",
    re.IGNORECASE,
)


def stamp_date(dated: str) -> date | None:
    """The calendar date of a date stamp (``terms.date_stamp``), None when it is none."""
    match = _STAMP.search(dated)
    if match is None:
        return None
    groups = match.groupdict()
    try:
        for y, m, d in (("y3", "m3", "d3"), ("y4", "m4", "d4")):
            if groups[y]:
                return date(int(groups[y]), int(groups[m]), int(groups[d]))
        name = (groups["m1"] or groups["m2"]).casefold()
        month = next(i for i, m in enumerate(_MONTHS, 1) if m.casefold().startswith(name))
        return date(int(groups["y1"] or groups["y2"]), month, int(groups["d1"] or groups["d2"]))
    except (StopIteration, ValueError):  # "Maybe 3, 2023", 31 June
        return None


def _day(when: date) -> str:
    return f"{when.day} {_MONTHS[when.month - 1]} {when.year}"


def _month(year: int, month: int) -> str:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return f"{_MONTHS[month - 1]} {year}"


def _count(word: str) -> int | None:
    word = word.casefold()
    if word.isdigit():
        return int(word)
    return _NUMBERS.index(word) or 1 if word in _NUMBERS else (10 if word == "ten" else None)


def _ago(match: re.Match[str], on: date) -> str:
    unit, n = match["unit"].casefold(), _count(match["n"])
    if n is None:  # "a few days ago": a span before the day
        return f"{match['n']} {unit}s before {_day(on)}"
    if unit == "day":
        return _day(on - timedelta(days=n))
    if unit == "month":
        return _month(on.year, on.month - n)
    if unit == "year":
        return str(on.year - n)
    return f"{'the' if n == 1 else match['n']} {unit}{'s' if n > 1 else ''} before {_day(on)}"


def _near(match: re.Match[str], on: date) -> str:
    which = match["which"].casefold()
    step = 1 if which == "next" else -1
    span = (match["span"] or "").casefold()
    if span == "month":
        return _month(on.year, on.month + step)
    if span == "year":
        return str(on.year + step)
    if span:  # week, weekend
        return f"the {span} {'after' if step > 0 else 'before'} {_day(on)}"
    day = next(d for d in _DAYS if d.casefold().startswith(match["day"].casefold()[:3]))
    return f"the {day} {'after' if step > 0 else 'before'} {_day(on)}"


def _meaning(match: re.Match[str], on: date) -> str:
    if match["yesterday"]:
        back = 2 if match["yesterday"].casefold().startswith("the") else 1
        return _day(on - timedelta(days=back))
    if match["tomorrow"]:
        return _day(on + timedelta(days=1))
    return _ago(match, on) if match["ago"] else _near(match, on)


def _zh_day(when: date) -> str:
    return f"{when.year}年{when.month}月{when.day}日"


def _zh_count(word: str) -> int | None:
    """A count in digits or Chinese numerals up to 99 ("两" 2, "十二" 12, "二十" 20); None
    for "几" (a few)."""
    if word.isdigit():
        return int(word)
    if word == "几":
        return None
    digits = [2 if c == "两" else _ZH_DIGITS.index(c) if c != "十" else -1 for c in word]
    if -1 not in digits:
        return digits[0] if len(digits) == 1 else None
    tens, _, ones = word.partition("十")
    high = 1 if not tens else _zh_count(tens)
    low = 0 if not ones else _zh_count(ones)
    return None if high is None or low is None else high * 10 + low


def _zh_month(on: date, step: int) -> str:
    year, month = divmod(on.month - 1 + step, 12)
    return f"{on.year + year}年{month + 1}月"


def _zh_ago(match: re.Match[str], on: date) -> str:
    n, unit = _zh_count(match["zn"]), match["zunit"]
    if n is not None and unit == "天":
        return _zh_day(on - timedelta(days=n))
    if n is not None and unit == "个月":
        return _zh_month(on, -n)
    if n is not None and unit == "年":
        return f"{on.year - n}年"
    return f"{_zh_day(on)}之前{match['zn']}{unit}"  # weeks, or "几天": a span


def _zh_meaning(match: re.Match[str], on: date) -> str:
    if match["zday"]:
        shift = {"大前天": -3, "前天": -2, "明天": 1, "明日": 1, "后天": 2}.get(match["zday"], -1)
        return _zh_day(on + timedelta(days=shift))
    if match["zyear"]:
        return f"{on.year + {'前年': -2, '去年': -1}.get(match['zyear'], 1)}年"
    if match["zmonth"]:
        return _zh_month(on, 1 if match["zmonth"] == "下" else -1)
    if match["znear"]:
        after = match["zwhich"] == "下"
        if match["zspan"] == "周末":
            return f"{_zh_day(on)}{'之后' if after else '之前'}的周末"
        return f"{_zh_day(on)}的{'后' if after else '前'}一周"
    return _zh_ago(match, on)


# A word every relative phrase holds: text without one is not scanned by ``_RELATIVE`` (most
# excerpt lines hold none, and the scan was most of recall's rendering time).
_TRIGGERS: Final = ("yesterday", "last", "tomorrow", "ago", "next", "this past")
_ZH_TRIGGERS: Final = ("昨", "前", "明", "后天", "上", "下", "去年")


def anchored(text: str, dated: str) -> str:
    """``text`` with each relative time phrase followed by what it meant on ``dated`` (the
    message's date stamp), in brackets; ``text`` itself when the stamp names no date."""
    if not dated:
        return text
    folded = text.casefold()
    english = any(word in folded for word in _TRIGGERS)
    chinese = not text.isascii() and any(word in text for word in _ZH_TRIGGERS)
    if not english and not chinese:
        return text
    on = stamp_date(dated)
    if on is None:
        return text
    if english:
        text = _RELATIVE.sub(lambda m: f"{m.group(0)} [{_meaning(m, on)}]", text)
    if chinese:
        text = _ZH_RELATIVE.sub(lambda m: f"{m.group(0)} [{_zh_meaning(m, on)}]", text)
    return text
