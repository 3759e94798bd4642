"""Users' pinned profiles: name, pronouns, facts set by the user or app (shared by every
character), and the facts each character learned from its summaries (``learned_facts``).

User-set facts change only by an explicit :meth:`Profiles.set`; merging learned facts
(:meth:`Profiles.learn`) never touches them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Engine, text
from sqlmodel import Session, select

from errors import InvalidFieldError
from memory.database import autocommit_engine, storage_errors
from memory.tables import UserProfile, utcnow
from memory.validation import check_id, check_text

MAX_LEARNED_FACTS = 30
"""Learned facts kept per user, newest; older ones leave first (our choice: a profile is short)."""
MAX_FACT_CHARS = 500
"""Longest fact accepted, characters."""


def _norm(fact: str) -> str:
    return " ".join(fact.split()).casefold().rstrip(".")


class Profiles:
    """Typed access to ``user_profiles`` on one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._one = autocommit_engine(engine)  # for one-statement reads (no BEGIN/ROLLBACK)

    def get(self, user_id: str) -> UserProfile | None:
        """The user's profile, or ``None`` if nothing was ever set or learned.

        Raises:
            InvalidFieldError: ``user_id`` is not a valid id (:func:`memory.validation.check_id`).
        """
        check_id(user_id, field="user_id")
        with storage_errors(), Session(self._one) as db:
            return db.get(UserProfile, user_id)

    def set(
        self,
        user_id: str,
        *,
        name: str | None = None,
        pronouns: str | None = None,
        facts: Sequence[str] | None = None,
        time_zone: str | None = None,
    ) -> UserProfile:
        """Set fields of the user's profile (creating the user and profile if missing).

        ``None`` leaves a field as it is; ``""`` clears ``name``, ``pronouns`` or ``time_zone``;
        ``facts`` replaces the user-set facts (blank ones dropped, duplicates merged);
        ``time_zone`` is an IANA zone name (``Asia/Shanghai``, ``Europe/Lisbon``).

        Raises:
            InvalidFieldError: a field with NUL or a lone surrogate, or over its length
                (``name`` 200, ``pronouns`` 100, each fact :data:`MAX_FACT_CHARS` characters), or a
                ``time_zone`` that is no IANA zone (reason ``unknown_time_zone``).
        """
        check_id(user_id, field="user_id")
        if name is not None:
            check_text(name, field="name", max_chars=200)
        if pronouns is not None:
            check_text(pronouns, field="pronouns", max_chars=100)
        for k, fact in enumerate(facts or []):
            check_text(fact, field=f"facts[{k}]", max_chars=MAX_FACT_CHARS)
        if time_zone:
            check_time_zone(time_zone)
        with storage_errors(), Session(self.engine) as db:
            db.execute(text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id))
            profile = db.exec(select(UserProfile).where(UserProfile.user_id == user_id).with_for_update()).first()
            profile = profile or UserProfile(user_id=user_id)
            if name is not None:
                profile.name = name.strip() or None
            if pronouns is not None:
                profile.pronouns = pronouns.strip() or None
            if facts is not None:
                profile.facts = dedupe_facts([f.strip() for f in facts if f.strip()])
            if time_zone is not None:
                profile.time_zone = time_zone.strip() or None
            profile.updated_at = utcnow()
            db.add(profile)
            db.commit()
            db.refresh(profile)
            return profile

    def learn(self, user_id: str, facts: Sequence[str], *, character_id: str) -> list[str] | None:
        """Merge facts from a summary's profile section into what ``character_id`` learned of the user.

        New facts are appended (one equal to a user-set fact or one the character knows, ignoring
        case, spaces and a final period, is skipped); at most :data:`MAX_LEARNED_FACTS` are kept,
        newest. Returns the character's learned facts, or ``None`` when nothing was added.
        """
        clean = [f.strip()[:MAX_FACT_CHARS] for f in facts if f and f.strip()]
        if not clean:
            return None
        with storage_errors(), Session(self.engine) as db:
            db.execute(text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id))
            db.execute(
                text(
                    "INSERT INTO learned_facts (user_id, character_id) VALUES (:u, :c) ON CONFLICT DO NOTHING"
                ).bindparams(u=user_id, c=character_id)
            )
            learned = list(
                db.execute(
                    text(
                        "SELECT facts FROM learned_facts WHERE user_id = :u AND character_id = :c FOR UPDATE"
                    ).bindparams(u=user_id, c=character_id)
                ).scalar_one()
            )
            profile = db.get(UserProfile, user_id)
            known = {_norm(f) for f in [*(profile.facts if profile is not None else []), *learned]}
            added = [f for f in dedupe_facts(clean) if _norm(f) not in known]
            if not added:
                db.rollback()
                return None
            learned = [*learned, *added][-MAX_LEARNED_FACTS:]
            db.execute(
                text(
                    "UPDATE learned_facts SET facts = CAST(:f AS jsonb), updated_at = now() "
                    "WHERE user_id = :u AND character_id = :c"
                ).bindparams(f=json.dumps(learned, ensure_ascii=False), u=user_id, c=character_id)
            )
            db.commit()
            return learned

    def learned_by_character(self, user_id: str) -> dict[str, list[str]]:
        """Character id → what that character learned of the user, oldest first."""
        with storage_errors(), Session(self._one) as db:
            rows = db.execute(
                text(
                    "SELECT character_id, facts FROM learned_facts WHERE user_id = :u ORDER BY character_id"
                ).bindparams(u=user_id)
            ).all()
        return {character_id: list(facts) for character_id, facts in rows}

    def learned(self, user_id: str, *, character_id: str | None = None) -> list[str]:
        """What ``character_id`` learned of the user, oldest first; ``None``: what every character
        did (each character's in the order they last learned, repeats left out)."""
        check_id(user_id, field="user_id")
        with storage_errors(), Session(self._one) as db:
            rows = db.execute(
                text(
                    "SELECT facts FROM learned_facts WHERE user_id = :u "
                    "AND (CAST(:c AS text) IS NULL OR character_id = :c) ORDER BY updated_at, character_id"
                ).bindparams(u=user_id, c=character_id)
            ).all()
        return dedupe_facts([f for (facts,) in rows for f in facts])


def dedupe_facts(facts: Sequence[str]) -> list[str]:
    """``facts`` without repeats (as :func:`_norm` compares them), first kept."""
    seen: set[str] = set()
    out = []
    for fact in facts:
        key = _norm(fact)
        if key not in seen:
            seen.add(key)
            out.append(fact)
    return out


def check_time_zone(name: str) -> None:
    """``name`` must be an IANA time zone the system knows (``zoneinfo``).

    Raises:
        InvalidFieldError: it is not (field ``time_zone``, reason ``unknown_time_zone``).
    """
    import zoneinfo

    check_text(name, field="time_zone", max_chars=100)
    try:
        zoneinfo.ZoneInfo(name.strip())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidFieldError(
            f"time_zone: {name!r} is not an IANA time zone (e.g. Asia/Shanghai, Europe/Lisbon, UTC).",
            field="time_zone",
            reason="unknown_time_zone",
        ) from exc
