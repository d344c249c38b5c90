"""Relative time anchored to a message's date (``text.relative``): what "yesterday" or "last
week" meant on the day the message was written, written after the words."""

from __future__ import annotations

import re
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragent_memory.text.relative import anchored, stamp_date

STAMP = "8 May, 2023"  # a Monday


@pytest.mark.parametrize(
    ("said", "meant"),
    [
        ("I went to a support group yesterday.", "yesterday [7 May 2023]"),
        ("Last night was amazing!", "Last night [7 May 2023]"),
        ("the day before yesterday", "the day before yesterday [6 May 2023]"),
        ("3 days ago", "3 days ago [5 May 2023]"),
        ("two days ago", "two days ago [6 May 2023]"),
        ("Last Fri I took the kids", "Last Fri [the Friday before 8 May 2023]"),
        ("joined last Tues. It was", "last Tues. [the Tuesday before 8 May 2023]"),
        ("my school event last week", "last week [the week before 8 May 2023]"),
        ("this past weekend", "this past weekend [the weekend before 8 May 2023]"),
        ("two weekends ago we camped", "two weekends ago [two weekends before 8 May 2023]"),
        ("a week ago", "a week ago [the week before 8 May 2023]"),
        ("last month", "last month [April 2023]"),
        ("next month", "next month [June 2023]"),
        ("We had a blast last year", "last year [2022]"),
        ("10 years ago", "10 years ago [2013]"),
        ("a few days ago", "a few days ago [a few days before 8 May 2023]"),
        ("see you next Saturday", "next Saturday [the Saturday after 8 May 2023]"),
    ],
)
def test_relative_phrases_are_anchored(said: str, meant: str) -> None:
    assert meant in anchored(said, STAMP)


def test_months_and_years_roll_over() -> None:
    assert anchored("last month", "3 January, 2023") == "last month [December 2022]"
    assert anchored("next month", "December 20, 2022") == "next month [January 2023]"
    assert anchored("yesterday", "2024-03-01") == "yesterday [29 February 2024]"


def test_what_is_not_relative_time_is_left_alone() -> None:
    """A span named with "the" ("over the last year") is no point in time; text without a
    readable date stamp is returned as it was."""
    for text in ("Over the last year I learned a lot.", "The last week of June.", "Hi there"):
        assert anchored(text, STAMP) == text
    for stamp in ("", "2023年5月8日", "Maybe 31, 2023", "31 June, 2023"):
        assert anchored("yesterday", stamp) == "yesterday"


def test_stamp_forms_read_as_dates() -> None:
    assert stamp_date("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert stamp_date("May 8th, 2023") == date(2023, 5, 8)
    assert stamp_date("2023-05-08") == date(2023, 5, 8)
    assert stamp_date("no date here") is None


@given(st.text(max_size=200), st.dates(min_value=date(1900, 2, 1), max_value=date(2999, 11, 30)))
def test_anchoring_only_adds_brackets(text: str, day: date) -> None:
    """Whatever the text, the anchored text is the text with bracketed insertions: removing
    them gives it back, and a text without relative phrases is unchanged."""
    stamp = f"{day.day} {day.strftime('%B')}, {day.year}"
    out = anchored(text, stamp)
    assert len(out) >= len(text)
    if "[" not in text:
        assert re.sub(r" \[[^\]]*\]", "", out) == text
