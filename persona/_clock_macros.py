"""The clock macros of cards (SillyTavern's): ``{{time}}``, ``{{date}}``, ``{{weekday}}``,
``{{isodate}}``, ``{{isotime}}``, ``{{datetimeformat FORMAT}}``, ``{{idle_duration}}``. Pure.

Their values are the turn's time on the user's clock (:class:`persona.MacroContext`'s ``now``,
aware, in the user's zone) and the time since the user's message before it (``idle``), written
as SillyTavern writes them (moment.js's ``LT``, ``LL``, ``dddd`` and ``humanize``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

CLOCK_MACROS = ("time", "date", "weekday", "isodate", "isotime", "datetimeformat", "idle_duration")

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_TOKENS = re.compile(r"\[([^\]]*)\]|YYYY|YY|MMMM|MMM|MM|M|Do|DD|D|dddd|ddd|HH|H|hh|h|mm|m|ss|s|A|a|ZZ|Z")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _offset(at: datetime, sep: str) -> str:
    offset = at.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}{sep}{abs(minutes) % 60:02d}"


def format_moment(at: datetime, pattern: str) -> str:
    """``at`` written with moment.js format tokens (``YYYY-MM-DD HH:mm``, ``dddd, MMMM Do``, ``h:mm A``,
    text in ``[brackets]`` kept as it is); any other character is kept."""
    hour12 = at.hour % 12 or 12

    def token(found: re.Match[str]) -> str:
        if found.group(1) is not None:
            return found.group(1)
        return {
            "YYYY": f"{at.year:04d}",
            "YY": f"{at.year % 100:02d}",
            "MMMM": _MONTHS[at.month - 1],
            "MMM": _MONTHS[at.month - 1][:3],
            "MM": f"{at.month:02d}",
            "M": str(at.month),
            "Do": _ordinal(at.day),
            "DD": f"{at.day:02d}",
            "D": str(at.day),
            "dddd": _DAYS[at.weekday()],
            "ddd": _DAYS[at.weekday()][:3],
            "HH": f"{at.hour:02d}",
            "H": str(at.hour),
            "hh": f"{hour12:02d}",
            "h": str(hour12),
            "mm": f"{at.minute:02d}",
            "m": str(at.minute),
            "ss": f"{at.second:02d}",
            "s": str(at.second),
            "A": "AM" if at.hour < 12 else "PM",
            "a": "am" if at.hour < 12 else "pm",
            "ZZ": _offset(at, ""),
            "Z": _offset(at, ":"),
        }[found.group(0)]

    return _TOKENS.sub(token, pattern)


def humanize(idle: timedelta) -> str:
    """A duration as moment.js's ``humanize`` writes it: ``a few seconds``, ``5 minutes``,
    ``an hour``, ``3 hours``, ``a day``, ``2 months``, ``a year``."""
    seconds = abs(idle.total_seconds())
    minutes, hours, days = seconds / 60, seconds / 3600, seconds / 86400
    if seconds < 45:
        return "a few seconds"
    if seconds < 90:
        return "a minute"
    if minutes < 45:
        return f"{round(minutes)} minutes"
    if minutes < 90:
        return "an hour"
    if hours < 22:
        return f"{round(hours)} hours"
    if hours < 36:
        return "a day"
    if days < 26:
        return f"{round(days)} days"
    if days < 45:
        return "a month"
    if days < 320:
        return f"{round(days / 30.4)} months"
    if days < 548:
        return "a year"
    return f"{round(days / 365.25)} years"


def clock_value(name: str, args: list[str], now: datetime, idle: timedelta | None) -> str | None:
    """The value of clock macro ``name`` (``None``: leave it as written)."""
    if name == "idle_duration":
        return humanize(idle) if idle is not None and not args else None
    if name == "datetimeformat":
        return format_moment(now, " ".join(args)) if args else None
    if args:
        return None
    return {
        "time": format_moment(now, "h:mm A"),
        "date": format_moment(now, "MMMM D, YYYY"),
        "weekday": format_moment(now, "dddd"),
        "isodate": format_moment(now, "YYYY-MM-DD"),
        "isotime": format_moment(now, "HH:mm"),
    }.get(name)
