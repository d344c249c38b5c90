"""Relative time in a dated message, anchored to its date: ``anchored`` writes what "yesterday",
"last week" or "two days ago" meant on the day the message was written, in brackets after the
words ("I went yesterday [7 May 2023]"), so an excerpt read months later still says when.

English only; a date stamp this module cannot read (``terms.date_stamp`` forms: "8 May, 2023",
"May 8, 2023", "2023-05-08") anchors nothing. A phrase with one meaning on a calendar becomes
that date, month or year; a phrase that names a span stays a span ("the week before 9 June
2023"), never a guessed day.
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
_STAMP = re.compile(
    r"(?P<d1>\d{1,2})(?:st|nd|rd|th)?\s+(?P<m1>[a-z]{3,9})\.?,?\s+(?P<y1>\d{4})"
    r"|(?P<m2>[a-z]{3,9})\.?\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<y2>\d{4})"
    r"|(?P<y3>\d{4})-(?P<m3>\d{2})-(?P<d3>\d{2})",
    re.IGNORECASE,
)


def stamp_date(dated: str) -> date | None:
    """The calendar date of a date stamp (``terms.date_stamp``), None when it is none."""
    match = _STAMP.search(dated)
    if match is None:
        return None
    groups = match.groupdict()
    try:
        if groups["y3"]:
            return date(int(groups["y3"]), int(groups["m3"]), int(groups["d3"]))
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


# A word every relative phrase holds: text without one is not scanned by ``_RELATIVE`` (most
# excerpt lines hold none, and the scan was most of recall's rendering time).
_TRIGGERS: Final = ("yesterday", "last", "tomorrow", "ago", "next", "this past")


def anchored(text: str, dated: str) -> str:
    """``text`` with each relative time phrase followed by what it meant on ``dated`` (the
    message's date stamp), in brackets; ``text`` itself when the stamp names no date."""
    if not dated:
        return text
    folded = text.casefold()
    if not any(word in folded for word in _TRIGGERS):
        return text
    on = stamp_date(dated)
    if on is None:
        return text
    return _RELATIVE.sub(lambda m: f"{m.group(0)} [{_meaning(m, on)}]", text)
