"""The user's own clock: the time zone a user's dates are read and shown in. Pure."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta, timezone, tzinfo


def user_zone(time_zone: str | None, offset_minutes: int | None) -> tzinfo:
    """The user's zone: their profile's IANA ``time_zone`` when set (and known), else the UTC
    offset of their last message that carried one (``offset_minutes``), else UTC."""
    if time_zone:
        try:
            return zoneinfo.ZoneInfo(time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    if offset_minutes is not None:
        return timezone(timedelta(minutes=offset_minutes))
    return UTC


def local_date(at: datetime, zone: tzinfo) -> str:
    """``at`` (a naive ``at`` is UTC) as the ISO date it was in ``zone``."""
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(zone).date().isoformat()
