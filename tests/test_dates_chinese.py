"""Dates as Chinese-speaking users write them: Traditional characters, ROC years, lunar dates,
full-width digits and numerals in every position. A date that cannot be read is no date; a
wrong one would send recall to the wrong day."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from memory.dates import time_spans

NOW = datetime(2023, 5, 20, 20, 0, tzinfo=UTC)
"""A Saturday evening."""


def _day(d: date) -> tuple[datetime, datetime]:
    start = datetime.combine(d, datetime.min.time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _period(first: date, last: date) -> tuple[datetime, datetime]:
    return _day(first)[0], _day(last)[1]


TRADITIONAL = [
    # every relative expression read in Simplified, in Traditional characters (and its Simplified twin)
    ("上週六我做了什麼？", "上周六", _day(date(2023, 5, 13))),
    ("上星期六", "上星期六", _day(date(2023, 5, 13))),
    ("上禮拜三", "上礼拜三", _day(date(2023, 5, 10))),
    ("這週日", "这周日", _day(date(2023, 5, 21))),
    ("週六", "周六", _day(date(2023, 5, 13))),
    ("上週末", "上周末", _period(date(2023, 5, 13), date(2023, 5, 14))),
    ("上個月", "上个月", _period(date(2023, 4, 1), date(2023, 4, 30))),
    ("這個月", "这个月", _period(date(2023, 5, 1), date(2023, 5, 31))),
    ("上上週", "上上周", _period(date(2023, 5, 1), date(2023, 5, 7))),
    ("這個禮拜", "这个礼拜", _period(date(2023, 5, 15), date(2023, 5, 21))),
    ("兩週前", "两周前", _period(date(2023, 5, 3), date(2023, 5, 9))),
    ("兩個禮拜前", "两个礼拜前", _period(date(2023, 5, 3), date(2023, 5, 9))),
    ("三個月前", "三个月前", _period(date(2023, 2, 1), date(2023, 2, 28))),
    ("幾天前", "几天前", _day(date(2023, 5, 17))),
    ("5月3號", "5月3号", _day(date(2023, 5, 3))),
    ("去年5月", "去年5月", _period(date(2022, 5, 1), date(2022, 5, 31))),
]


@pytest.mark.parametrize("traditional, simplified, period", [pytest.param(*c, id=c[0]) for c in TRADITIONAL])
def test_traditional_and_simplified_forms_name_the_same_period(traditional, simplified, period):
    (span,) = time_spans(traditional, now=NOW)
    (twin,) = time_spans(simplified, now=NOW)
    assert (span.start, span.end) == (twin.start, twin.end) == period
    assert span.text in traditional  # the words as the user wrote them


@pytest.mark.parametrize(
    "message, period",
    [
        pytest.param("民國112年5月3日", _day(date(2023, 5, 3)), id="roc-full"),
        pytest.param("民国112年5月3号", _day(date(2023, 5, 3)), id="roc-simplified"),
        pytest.param("民國一一二年五月三日", _day(date(2023, 5, 3)), id="roc-numerals-digit-by-digit"),
        pytest.param("民國一百一十二年五月", _period(date(2023, 5, 1), date(2023, 5, 31)), id="roc-numerals-hundreds"),
        pytest.param("民國 111 年", _period(date(2022, 1, 1), date(2022, 12, 31)), id="roc-year-alone"),
        pytest.param("民國１１２年５月３日", _day(date(2023, 5, 3)), id="roc-full-width"),
        pytest.param("２０２３年５月３日", _day(date(2023, 5, 3)), id="full-width-digits"),
        pytest.param("５月３号", _day(date(2023, 5, 3)), id="full-width-month-day"),
        pytest.param("二〇二二年五月三日", _day(date(2022, 5, 3)), id="numeral-year"),
        pytest.param("五月廿三号", _day(date(2022, 5, 23)), id="nian-twenty"),
        pytest.param("十二月三十一日", _day(date(2022, 12, 31)), id="numerals-tens"),
        pytest.param("Ｍａｙ ３", _day(date(2023, 5, 3)), id="full-width-english"),
    ],
)
def test_roc_years_full_width_digits_and_numerals(message, period):
    (span,) = time_spans(message, now=NOW)
    assert (span.start, span.end) == period


@pytest.mark.parametrize(
    "message, now, day",
    [
        pytest.param("农历正月初五", datetime(2024, 3, 1, tzinfo=UTC), date(2024, 2, 14), id="lunar-first-month"),
        pytest.param("農曆八月十五", datetime(2023, 10, 1, tzinfo=UTC), date(2023, 9, 29), id="lunar-traditional"),
        pytest.param("中秋那天", datetime(2023, 10, 1, tzinfo=UTC), date(2023, 9, 29), id="mid-autumn"),
        pytest.param("除夕晚上", datetime(2024, 3, 1, tzinfo=UTC), date(2024, 2, 9), id="new-years-eve"),
        pytest.param("春节", datetime(2024, 1, 20, tzinfo=UTC), date(2023, 1, 22), id="spring-festival-last-year"),
        pytest.param("端午节", datetime(2023, 7, 1, tzinfo=UTC), date(2023, 6, 22), id="dragon-boat"),
        pytest.param("农历腊月廿三", datetime(2024, 3, 1, tzinfo=UTC), date(2024, 2, 2), id="lunar-nian"),
    ],
)
def test_lunar_dates_are_converted_to_their_most_recent_solar_day(message, now, day):
    (span,) = time_spans(message, now=now)
    assert (span.start, span.end) == _day(day)


def test_a_lunar_date_that_does_not_exist_is_no_date_not_a_wrong_one():
    # the first lunar month has 29 days in 2023 and 2024 (checked by lunardate): no 30th
    assert time_spans("农历正月三十", now=datetime(2024, 3, 1, tzinfo=UTC)) == []
    assert time_spans("民國999年", now=NOW) == []  # not an ROC year
