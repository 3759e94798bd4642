r"""Periods a message names, in English and Chinese, resolved against the message's own time.

:func:`time_spans` finds absolute and relative time expressions and turns each into a
half-open period ``[start, end)`` in the time zone of ``now``:

==========================================  =========================================
English                                     Chinese
==========================================  =========================================
"May 3", "3rd of May", "May 3, 2023"        "5月3号", "5月3日", "五月三号", "2023年5月3日"
"in May", "last May", "May 2023"            "5月", "五月份", "去年5月"
"today", "yesterday", "the day before       "今天", "昨天", "前天", "大前天"
yesterday"
"3 days ago", "two weeks ago", "a month     "3天前", "两周前", "一个月前", "两年前"
ago", "a year ago"
"last week", "this week", "last weekend",   "上周", "这周", "上个月", "这个月", "去年",
"last month", "last year", "this year"      "前年", "今年", "上周末"
"last Saturday", "on Saturday"              "上周六", "上星期六", "这周六", "周六"
"last summer", "this spring"                "去年夏天", "今年春天", "夏天"
\                                           "民國112年5月3日", "民国一一二年" (ROC years)
\                                           "农历正月初五", "農曆八月十五", "除夕", "中秋"
==========================================  =========================================

Chinese is read in Simplified and Traditional characters alike ("上週六", "兩個禮拜前",
"這個月", "5月3號"), with digits in ASCII or full width and numerals in any position
("二〇二三年五月三日", "五月廿三"). An ROC year (民國/民国 N 年) is 1911 + N. A lunar date
(农历/農曆 month and day, or a festival: 春节, 元宵, 端午, 七夕, 中秋, 重阳, 腊八, 除夕) is
converted by ``lunardate`` to its most recent solar date not after ``now``; one that does not
exist in the lunar calendar (a 30th of a 29-day month) is no date, never a wrong one.

A date without a year is its most recent occurrence not after ``now`` ("5月3号" said on
2023-05-20 is 2023-05-03; said on 2023-04-01 it is 2022-05-03). "last May" is the most
recent May before the current month. "N weeks ago" is a seven-day period centred on that
day and "N months ago" a calendar month; a bare weekday ("on Saturday", "周六") is its
most recent occurrence before today. Seasons are the meteorological ones of the northern
hemisphere (spring March–May, summer June–August, autumn September–November, winter
December–February).

This is our own small parser: ``dateparser`` misread these phrases and was slow
(``docs/decisions/measurements.md#our-own-date-parser``); ``tests/test_recall.py`` pins its
readings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

__all__ = ["TimeSpan", "time_spans"]


@dataclass(frozen=True)
class TimeSpan:
    """A half-open period ``[start, end)``, time-zone aware like the ``now`` it came from."""

    start: datetime
    end: datetime
    text: str
    """The words that named it, as written."""


_CN_DIGITS = {
    "零": 0,
    "〇": 0,
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_CN_NUM = r"[0-9０-９零〇一二两三四五六七八九十廿卅]+"
_FOLD = str.maketrans(
    {
        **{chr(0xFF10 + i): str(i) for i in range(10)},  # full-width digits
        **{chr(0xFF21 + i): chr(0x41 + i) for i in range(26)},  # full-width letters
        **{chr(0xFF41 + i): chr(0x61 + i) for i in range(26)},
        **dict(zip("週個禮這兩幾國曆號後農臘節陽閏", "周个礼这两几国历号后农腊节阳闰", strict=True)),
    }
)
"""One character for one, so that positions in the folded text are the message's: Traditional
forms of the characters the rules read to Simplified, full-width digits and letters to ASCII."""
_EN_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for m in names
}
_EN_MONTH = r"(?P<month>january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_EN_WEEKDAYS = {
    d: i for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])
}
_CN_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6, "末": 7}
_EN_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "a couple of": 2,
    "couple of": 2,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a few": 3,
    "few": 3,
}
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12, "春": 3, "夏": 6, "秋": 9, "冬": 12}


def _cn_int(raw: str) -> int | None:
    """1–99 written in digits (ASCII or full width) or Chinese numerals (``廿`` 20, ``卅`` 30);
    ``None`` otherwise."""
    raw = raw.translate(str.maketrans("０１２３４５６７８９", "0123456789"))
    if raw.isdigit():
        return int(raw)
    if raw[:1] in ("廿", "卅"):
        raw = ("二十" if raw[0] == "廿" else "三十") + raw[1:]
    if "十" in raw:
        tens, _, ones = raw.partition("十")
        t = _CN_DIGITS.get(tens, None) if tens else 1
        o = _CN_DIGITS.get(ones, None) if ones else 0
        return None if t is None or o is None else 10 * t + o
    if len(raw) == 1 and raw in _CN_DIGITS:
        return _CN_DIGITS[raw]
    return None


def _cn_year(raw: str) -> int | None:
    """A year number in digits, digit by digit in numerals (``二〇二三``, ``一一二``), or with
    ``百``/``十`` (``一百一十二``); ``None`` otherwise."""
    raw = raw.translate(str.maketrans("０１２３４５６７８９", "0123456789"))
    if raw.isdigit():
        return int(raw)
    if raw and all(c in _CN_DIGITS for c in raw):
        return int("".join(str(_CN_DIGITS[c]) for c in raw))
    hundreds, sep, rest = raw.partition("百")
    if sep:
        h = _CN_DIGITS.get(hundreds) if hundreds else 1
        if h is None:
            return None
        rest = rest.lstrip("零〇")
        tail = _cn_int(rest) if rest else 0
        return None if tail is None else 100 * h + tail
    return _cn_int(raw)


_LUNAR_MONTHS = {
    "正": 1,
    "冬": 11,
    "腊": 12,
    **{n: i for i, n in enumerate("一二三四五六七八九十", start=1)},
    "十一": 11,
    "十二": 12,
}
_LUNAR_FESTIVALS = {
    "春节": (1, 1),
    "元宵": (1, 15),
    "端午": (5, 5),
    "七夕": (7, 7),
    "中秋": (8, 15),
    "重阳": (9, 9),
    "腊八": (12, 8),
}


def _lunar_day(raw: str) -> int | None:
    """A lunar day: ``初一``–``初十``, ``十一``–``三十``, ``廿一``–``廿九``."""
    if raw.startswith("初"):
        n = _cn_int(raw[1:])
        return n if n is not None and 1 <= n <= 10 else None
    n = _cn_int(raw)
    return n if n is not None and 1 <= n <= 30 else None


def _lunar(r: _Resolver, month: int, day: int, leap: bool, text: str) -> TimeSpan | None:
    """The most recent solar date not after today of lunar ``month``/``day`` (``day`` 0: the last
    day of the lunar year, 除夕), by ``lunardate``; ``None`` when no such lunar date exists."""
    from lunardate import LunarDate

    found = []
    for year in (r.today.year - 1, r.today.year):
        try:
            solar = (
                LunarDate(year + 1, 1, 1).to_solar_date() - timedelta(days=1)
                if day == 0
                else LunarDate(year, month, day, leap).to_solar_date()
            )
        except ValueError:  # a 30th of a 29-day month, a leap month the year does not have
            continue
        if solar <= r.today:
            found.append(solar)
    return r.days(max(found), 1, text) if found else None


def _en_int(raw: str) -> int | None:
    raw = raw.strip().lower()
    return int(raw) if raw.isdigit() else _EN_NUMBERS.get(raw)


class _Resolver:
    def __init__(self, now: datetime) -> None:
        self.now = now
        self.today = now.date()

    def at(self, d: date) -> datetime:
        return datetime.combine(d, time(), tzinfo=self.now.tzinfo)

    def days(self, first: date, count: int, text: str) -> TimeSpan:
        return TimeSpan(self.at(first), self.at(first + timedelta(days=count)), text)

    def month(self, year: int, month: int, text: str, months: int = 1) -> TimeSpan:
        end_year, end_month = year + (month - 1 + months) // 12, (month - 1 + months) % 12 + 1
        return TimeSpan(self.at(date(year, month, 1)), self.at(date(end_year, end_month, 1)), text)

    def year(self, year: int, text: str) -> TimeSpan:
        return TimeSpan(self.at(date(year, 1, 1)), self.at(date(year + 1, 1, 1)), text)

    def day(self, month: int, day: int, year: int | None, text: str) -> TimeSpan | None:
        """A month-day; without a year the most recent occurrence not after today."""
        try:
            if year is not None:
                return self.days(date(year, month, day), 1, text)
            d = date(self.today.year, month, day)
            if d > self.today:
                d = date(self.today.year - 1, month, day)
            return self.days(d, 1, text)
        except ValueError:  # 2月30日
            return None

    def month_past(
        self, month: int, text: str, *, strictly_before: bool = False, year_offset: int | None = None
    ) -> TimeSpan:
        if year_offset is not None:
            return self.month(self.today.year + year_offset, month, text)
        year = self.today.year
        if month > self.today.month or (strictly_before and month == self.today.month):
            year -= 1
        return self.month(year, month, text)

    def season(self, start_month: int, text: str, year_offset: int | None) -> TimeSpan:
        """The season starting in ``start_month``; ``year_offset`` relative to this year, or the most recent one begun."""
        if year_offset is None:
            year = self.today.year
            if self.at(date(year, start_month, 1)) > self.now:
                year -= 1
        else:
            year = self.today.year + year_offset
        return self.month(year, start_month, text, months=3)

    def weekday(self, weekday: int, week_offset: int | None, text: str) -> TimeSpan:
        """``weekday`` 0–6 (7: the weekend) of the week ``week_offset`` from this one, or the most recent before today."""
        monday = self.today - timedelta(days=self.today.weekday())
        if weekday == 7:
            start = monday + timedelta(days=5 + 7 * (week_offset if week_offset is not None else -1))
            return self.days(start, 2, text)
        if week_offset is None:
            back = (self.today.weekday() - weekday) % 7 or 7
            return self.days(self.today - timedelta(days=back), 1, text)
        return self.days(monday + timedelta(days=7 * week_offset + weekday), 1, text)

    def ago(self, n: int, unit: str, text: str) -> TimeSpan | None:
        if unit == "day":
            return self.days(self.today - timedelta(days=n), 1, text)
        if unit == "week":
            return self.days(self.today - timedelta(days=7 * n + 3), 7, text)
        if unit == "month":
            total = self.today.year * 12 + self.today.month - 1 - n
            return self.month(total // 12, total % 12 + 1, text)
        if unit == "year":
            return self.year(self.today.year - n, text)
        return None


_CN_RULES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"(?:农历|阴历)(?P<leap>闰)?(?P<month>十一|十二|正|冬|腊|[一二三四五六七八九十])月"
            r"(?P<day>初[一二三四五六七八九十]|廿[一二三四五六七八九]|二十|三十|十[一二三四五六七八九]|[一二三四五六七八九十])"
        ),
        "lunar",
    ),
    (re.compile(r"(?P<festival>春节|元宵|端午|七夕|中秋|重阳|腊八|除夕)"), "festival"),
    (
        re.compile(
            rf"民国\s*(?P<year>[0-9０-９零〇一二三四五六七八九十百]+)\s*年"
            rf"(?:(?P<month>{_CN_NUM})月(?:份)?(?:(?P<day>{_CN_NUM})[日号])?)?"
        ),
        "roc",
    ),
    (
        re.compile(
            rf"(?P<year>[零〇一二三四五六七八九]{{4}})年(?P<month>{_CN_NUM})月(?:份)?(?:(?P<day>{_CN_NUM})[日号])?"
        ),
        "cn_ymd",
    ),
    (re.compile(rf"(?P<year>\d{{4}})年(?P<month>{_CN_NUM})月(?:份)?(?:(?P<day>{_CN_NUM})[日号號])?"), "ymd"),
    (re.compile(rf"(?P<rel>去年|今年|前年)?(?P<month>{_CN_NUM})月(?:份)?(?:(?P<day>{_CN_NUM})[日号號])?"), "md"),
    (re.compile(r"(?P<rel>大前天|前天|昨天|今天)"), "dayword"),
    (re.compile(rf"(?P<n>{_CN_NUM}|几|半)(?P<unit>天|日|周|个?星期|个?礼拜|个月|年)(?:以)?前"), "ago"),
    (re.compile(r"(?P<rel>上上|上|这|本|下)?(?:个)?(?:周|星期|礼拜)(?P<wd>[一二三四五六日天末])"), "weekday"),
    (re.compile(r"(?P<rel>上上|上|这|本)(?:个)?(?P<unit>周|星期|礼拜|月)"), "this_last"),
    (re.compile(r"(?P<rel>去年|今年|前年)?(?P<season>[春夏秋冬])(?:天|季)"), "season"),
    (re.compile(r"(?P<rel>去年|今年|前年)"), "yearword"),
]
_EN_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"\b{_EN_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(?P<year>\d{{4}}))?", re.I), "md"),
    (
        re.compile(rf"\b(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_EN_MONTH}\b(?:,?\s+(?P<year>\d{{4}}))?", re.I),
        "md",
    ),
    (re.compile(rf"\b(?P<rel>last|this|in|during|since)\s+{_EN_MONTH}\b(?:\s+(?P<year>\d{{4}}))?", re.I), "month"),
    (re.compile(rf"\b{_EN_MONTH}\s+(?P<year>\d{{4}})\b", re.I), "month"),
    (re.compile(r"\b(?P<rel>the day before yesterday|yesterday|today|tonight|this morning)\b", re.I), "dayword"),
    (
        re.compile(
            r"\b(?P<n>\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|(?:a )?couple of|(?:a )?few)\s+(?P<unit>day|week|month|year)s?\s+ago\b",
            re.I,
        ),
        "ago",
    ),
    (
        re.compile(
            r"\b(?P<rel>last|this|on|past)\s+(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend)\b",
            re.I,
        ),
        "weekday",
    ),
    (re.compile(r"\b(?P<rel>last|this|past)\s+(?P<unit>week|month|year)\b", re.I), "this_last"),
    (re.compile(r"\b(?P<rel>last|this|in|during)\s+(?P<season>spring|summer|autumn|fall|winter)\b", re.I), "season"),
]
_CN_REL_YEAR = {"去年": -1, "今年": 0, "前年": -2}
_CN_REL_WEEK = {"上上": -2, "上": -1, "这": 0, "本": 0, "下": 1}


def _chinese(r: _Resolver, kind: str, m: re.Match[str], text: str) -> TimeSpan | None:
    g = m.groupdict()
    if kind == "lunar":
        day = _lunar_day(g["day"])
        return None if day is None else _lunar(r, _LUNAR_MONTHS[g["month"]], day, bool(g["leap"]), text)
    if kind == "festival":
        if g["festival"] == "除夕":
            return _lunar(r, 12, 0, False, text)
        return _lunar(r, *_LUNAR_FESTIVALS[g["festival"]], False, text)
    if kind in ("roc", "cn_ymd"):
        year = _cn_year(g["year"])
        if year is None or (kind == "roc" and not 1 <= year <= 300):
            return None
        year = year + 1911 if kind == "roc" else year
        month = _cn_int(g["month"]) if g["month"] else None
        day = _cn_int(g["day"]) if g["day"] else None
        if month is None:
            return r.year(year, text)
        if not 1 <= month <= 12:
            return None
        return r.day(month, day, year, text) if day else r.month(year, month, text)
    if kind == "ymd":
        month, day = _cn_int(g["month"]), _cn_int(g["day"]) if g["day"] else None
        if not month or not 1 <= month <= 12:
            return None
        return r.day(month, day, int(g["year"]), text) if day else r.month(int(g["year"]), month, text)
    if kind == "md":
        month, day = _cn_int(g["month"]), _cn_int(g["day"]) if g["day"] else None
        if not month or not 1 <= month <= 12:
            return None
        offset = _CN_REL_YEAR.get(g["rel"]) if g["rel"] else None
        if day:
            return r.day(month, day, None if offset is None else r.today.year + offset, text)
        return r.month_past(month, text, year_offset=offset)
    if kind == "dayword":
        back = {"今天": 0, "昨天": 1, "前天": 2, "大前天": 3}[g["rel"]]
        return r.days(r.today - timedelta(days=back), 1, text)
    if kind == "ago":
        n = {"几": 3, "半": 0}.get(g["n"]) if g["n"] in ("几", "半") else _cn_int(g["n"])
        unit = g["unit"]
        if g["n"] == "半" and unit == "年":
            return r.ago(6, "month", text)
        if n is None:
            return None
        return r.ago(n, {"天": "day", "日": "day", "个月": "month", "年": "year"}.get(unit, "week"), text)
    if kind == "weekday":
        offset = _CN_REL_WEEK.get(g["rel"]) if g["rel"] else None
        return r.weekday(_CN_WEEKDAYS[g["wd"]], offset, text)
    if kind == "this_last":
        offset = _CN_REL_WEEK[g["rel"]]
        if g["unit"] == "月":
            total = r.today.year * 12 + r.today.month - 1 + offset
            return r.month(total // 12, total % 12 + 1, text)
        monday = r.today - timedelta(days=r.today.weekday())
        return r.days(monday + timedelta(days=7 * offset), 7, text)
    if kind == "season":
        return r.season(_SEASONS[g["season"]], text, _CN_REL_YEAR.get(g["rel"]) if g["rel"] else None)
    if kind == "yearword":
        return r.year(r.today.year + _CN_REL_YEAR[g["rel"]], text)
    return None


def _english(r: _Resolver, kind: str, m: re.Match[str], text: str) -> TimeSpan | None:
    g = m.groupdict()
    if kind == "md":
        return r.day(_EN_MONTHS[g["month"].lower()], int(g["day"]), int(g["year"]) if g["year"] else None, text)
    if kind == "month":
        month = _EN_MONTHS[g["month"].lower()]
        if g.get("year"):
            return r.month(int(g["year"]), month, text)
        return r.month_past(month, text, strictly_before=(g.get("rel") or "").lower() == "last")
    if kind == "dayword":
        back = {"today": 0, "tonight": 0, "this morning": 0, "yesterday": 1, "the day before yesterday": 2}[
            g["rel"].lower()
        ]
        return r.days(r.today - timedelta(days=back), 1, text)
    if kind == "ago":
        n = _en_int(g["n"])
        return None if n is None else r.ago(n, g["unit"].lower(), text)
    if kind == "weekday":
        rel, wd = g["rel"].lower(), g["wd"].lower()
        if wd == "weekend":
            return r.weekday(7, 0 if rel == "this" else -1, text)
        return r.weekday(_EN_WEEKDAYS[wd], 0 if rel == "this" else None, text)
    if kind == "this_last":
        offset = 0 if g["rel"].lower() == "this" else -1
        unit = g["unit"].lower()
        if unit == "year":
            return r.year(r.today.year + offset, text)
        if unit == "month":
            total = r.today.year * 12 + r.today.month - 1 + offset
            return r.month(total // 12, total % 12 + 1, text)
        monday = r.today - timedelta(days=r.today.weekday())
        return r.days(monday + timedelta(days=7 * offset), 7, text)
    if kind == "season":
        rel = g["rel"].lower()
        start = _SEASONS[g["season"].lower()]
        span = r.season(start, text, None)
        if rel == "last" and span.end > r.now:  # the season under way is "this", not "last"
            span = r.season(start, text, span.start.year - r.today.year - 1)
        return span
    return None


def time_spans(message: str, *, now: datetime) -> list[TimeSpan]:
    """The periods ``message`` names, in the order written; ``[]`` when it names none.

    Args:
        message: the user's message, English or Chinese (or both).
        now: when the message was said (time-zone aware); relative expressions
            ("yesterday", "上周六") and dates without a year resolve against it.

    Each character of the message belongs to at most one expression: rules are tried
    most specific first ("2023年5月3日" before "5月", "上周六" before "上周").
    """
    resolver = _Resolver(now)
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, TimeSpan]] = []
    folded = message.translate(_FOLD)  # one character for one: a match's place is the message's
    for rules, read in ((_CN_RULES, _chinese), (_EN_RULES, _english)):
        for pattern, kind in rules:
            for m in pattern.finditer(folded):
                if any(m.start() < e and s < m.end() for s, e in taken):
                    continue
                span = read(resolver, kind, m, message[m.start() : m.end()])
                if span is not None:
                    taken.append((m.start(), m.end()))
                    found.append((m.start(), span))
    return [s for _, s in sorted(found, key=lambda x: x[0])]
