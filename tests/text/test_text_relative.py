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


ZH_STAMP = "2023年5月8日"  # a Monday


@pytest.mark.parametrize(
    ("said", "meant"),
    [
        ("我昨天去了互助小组。", "昨天 [2023年5月7日]"),
        ("昨晚的音乐会", "昨晚 [2023年5月7日]"),
        ("前天下雨了", "前天 [2023年5月6日]"),
        ("明天见", "明天 [2023年5月9日]"),
        ("三天前我们见过", "三天前 [2023年5月5日]"),
        ("十二天前", "十二天前 [2023年4月26日]"),
        ("3天前", "3天前 [2023年5月5日]"),
        ("两个月前搬的家", "两个月前 [2023年3月]"),
        ("上个月", "上个月 [2023年4月]"),
        ("下个月出发", "下个月 [2023年6月]"),
        ("去年夏天", "去年 [2022年]"),
        ("上周很忙", "上周 [2023年5月8日的前一周]"),
        ("下周末见", "下周末 [2023年5月8日之后的周末]"),
        ("两周前", "两周前 [2023年5月8日之前两周]"),
        ("几天前", "几天前 [2023年5月8日之前几天]"),
    ],
)
def test_chinese_relative_phrases_are_anchored_in_chinese(said: str, meant: str) -> None:
    assert meant in anchored(said, ZH_STAMP)


def test_chinese_words_that_only_look_relative_are_left_alone() -> None:
    """No word breaks in Chinese: "上周五" is a day this module does not guess, and the "上月"
    at the end of "晚上" before "月亮" is no month."""
    for text in ("上周五我去了书店", "晚上月亮很美", "以前的事"):
        assert anchored(text, ZH_STAMP) == text


def test_months_and_years_roll_over() -> None:
    assert anchored("last month", "3 January, 2023") == "last month [December 2022]"
    assert anchored("next month", "December 20, 2022") == "next month [January 2023]"
    assert anchored("yesterday", "2024-03-01") == "yesterday [29 February 2024]"


def test_what_is_not_relative_time_is_left_alone() -> None:
    """A span named with "the" ("over the last year") is no point in time; text without a
    readable date stamp is returned as it was."""
    for text in ("Over the last year I learned a lot.", "The last week of June.", "Hi there"):
        assert anchored(text, STAMP) == text
    for stamp in ("", "2023年5月", "Maybe 31, 2023", "31 June, 2023"):
        assert anchored("yesterday", stamp) == "yesterday"


def test_stamp_forms_read_as_dates() -> None:
    assert stamp_date("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert stamp_date("May 8th, 2023") == date(2023, 5, 8)
    assert stamp_date("2023-05-08") == date(2023, 5, 8)
    assert stamp_date("2023年5月8日 下午1:56") == date(2023, 5, 8)
    assert anchored("yesterday", "2023年5月8日") == "yesterday [7 May 2023]"
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


@given(
    st.text(alphabet="昨前明后天大上下个周末星期礼拜月年去两三十几一二我的了 a[]", max_size=60),
    st.dates(min_value=date(1900, 2, 1), max_value=date(2999, 11, 30)),
)
def test_chinese_anchoring_only_adds_brackets(text: str, day: date) -> None:
    out = anchored(text, f"{day.year}年{day.month}月{day.day}日")
    if "[" not in text:
        assert re.sub(r" \[[^\]]*\]", "", out) == text
