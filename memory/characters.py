"""The characters room: the only writer of ``characters``, ``character_revisions`` and ``character_avatars``.

Who sees a character (:meth:`Characters.visible`):

- the deployment's (``app_id`` ``NULL``: ``COMPANION_PERSONA``'s and ``companion characters add``'s):
  every app and every user; only the operator changes them (the command line);
- an app's (``owner_id`` ``NULL``): every user of that app;
- a user's own (``owner_id`` set): that user only.

Anything else is answered exactly as an unknown id (:class:`~errors.NotFoundError`, kind
``character``), so another app's or another user's ids do not leak. A card is stored as its
``data`` object (JSONB) per revision; editing adds a revision and moves ``characters.revision``,
so a session's next turn reads the newest one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, or_, text
from sqlmodel import Session, col, select

from errors import CharacterInUseError, CharacterReadOnlyError, InvalidRequestError, NotFoundError
from memory.database import autocommit_engine, storage_errors
from memory.tables import Character, CharacterRevision, ChatSession, utcnow
from memory.validation import check_id

MAX_PAGE = 200
"""The most characters one list page holds."""


@dataclass(frozen=True, kw_only=True)
class Viewer:
    """Who asks: an app and, optionally, one of its users (internal id). ``app_id`` ``None`` is the
    operator (the command line), who sees the deployment's characters and every app's."""

    app_id: str | None = None
    user_id: str | None = None


OPERATOR = Viewer()
"""The command line's view."""


@dataclass(frozen=True, kw_only=True)
class Avatar:
    """A character's image."""

    mime: str
    image: bytes


def character_not_found(character_id: str) -> NotFoundError:
    """The one answer for an unknown, another app's or another user's character."""
    return NotFoundError(f"No character {character_id!r}.", kind="character", resource_id=character_id)


class Characters:
    """Characters and their revisions on one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._one = autocommit_engine(engine)

    # -- writes ---------------------------------------------------------------
    def create(
        self,
        *,
        name: str,
        spec: str,
        card: Mapping[str, Any],
        app_id: str | None = None,
        owner_id: str | None = None,
        avatar: Avatar | None = None,
    ) -> Character:
        """A new character with its first revision (and avatar), in one transaction.

        Raises:
            InvalidRequestError: a deployment character of that name exists already (field ``name``).
        """
        character = Character(id="ch_" + uuid.uuid4().hex, app_id=app_id, owner_id=owner_id, name=name, revision=1)
        with storage_errors(), Session(self.engine) as db:
            if app_id is None and db.exec(_deployment_named(name)).first() is not None:
                raise InvalidRequestError(
                    f"The deployment has a character named {name!r} already; revise it instead.", field="name"
                )
            db.add(character)
            db.flush()
            db.add(CharacterRevision(character_id=character.id, revision=1, spec=spec, card=dict(card)))
            if avatar is not None:
                _put_avatar(db, character.id, avatar)
            db.commit()
            db.refresh(character)
            return character

    def revise(
        self,
        character: Character,
        *,
        name: str,
        spec: str,
        card: Mapping[str, Any],
        avatar: Avatar | None = None,
    ) -> Character:
        """Add a revision with ``card`` (the character's name becomes ``name``), and replace the
        avatar when one is given, in one transaction. The character row is locked meanwhile, so two
        edits at once make two revisions, one after the other.

        Raises:
            NotFoundError: the character was deleted meanwhile.
        """
        with storage_errors(), Session(self.engine) as db:
            row = db.exec(select(Character).where(Character.id == character.id).with_for_update()).first()
            if row is None:
                raise character_not_found(character.id)
            row.revision += 1
            row.name, row.updated_at = name, utcnow()
            db.add(row)
            db.add(CharacterRevision(character_id=row.id, revision=row.revision, spec=spec, card=dict(card)))
            if avatar is not None:
                _put_avatar(db, row.id, avatar)
            db.commit()
            db.refresh(row)
            return row

    def ensure_deployment(self, *, name: str, spec: str, card: Mapping[str, Any]) -> tuple[Character, bool]:
        """The deployment character named ``name``, made or revised so that its newest card is
        ``card``; and whether a revision was written. A character of that name with the same newest
        card is returned as it is (one read). Two processes starting at once write one revision."""
        with storage_errors(), Session(self.engine) as db:
            db.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended('companion.character:' || :n, 0))"), {"n": name}
            )
            row = db.exec(_deployment_named(name)).first()
            if row is not None and row.revision > 0:
                newest = db.get(CharacterRevision, (row.id, row.revision))
                if newest is not None and newest.card == dict(card) and newest.spec == spec:
                    return row, False
            if row is None:
                row = Character(id="ch_" + uuid.uuid4().hex, name=name, revision=0)
                db.add(row)
                db.flush()
            row.revision += 1
            row.updated_at = utcnow()
            db.add(row)
            db.add(CharacterRevision(character_id=row.id, revision=row.revision, spec=spec, card=dict(card)))
            db.commit()
            db.refresh(row)
            return row, True

    def delete(self, character: Character) -> None:
        """Delete the character, its revisions, avatar, knowledge and learned facts.

        Raises:
            CharacterInUseError: sessions use it (checked under the row lock, so none is started meanwhile).
        """
        with storage_errors(), Session(self.engine) as db:
            db.execute(text("SELECT id FROM characters WHERE id = :c FOR UPDATE"), {"c": character.id})
            used = db.exec(
                select(func.count()).select_from(ChatSession).where(ChatSession.character_id == character.id)
            ).one()
            if used:
                raise in_use(character.id, used)
            db.execute(text("DELETE FROM characters WHERE id = :c"), {"c": character.id})
            db.commit()

    # -- reads ----------------------------------------------------------------
    def placeholder(self, name: str) -> Character:
        """The deployment character ``name``, made without a card if missing (:func:`placeholder`)."""
        with storage_errors(), Session(self.engine) as db:
            character_id = placeholder(db, name)
            db.commit()
            return db.get_one(Character, character_id)

    def named(self, name: str) -> Character | None:
        """The deployment character named ``name``, if there is one."""
        with storage_errors(), Session(self._one) as db:
            return db.exec(_deployment_named(name)).first()

    def get(self, character_id: str) -> Character | None:
        with storage_errors(), Session(self._one) as db:
            return db.get(Character, character_id)

    def visible(self, character_id: str, viewer: Viewer) -> Character:
        """The character, if ``viewer`` may see it.

        Raises:
            NotFoundError: no such character, or one the viewer may not see (the same answer).
            InvalidFieldError: an id that cannot exist (field ``character_id``).
        """
        check_id(character_id, field="character_id")
        row = self.get(character_id)
        if row is None or not can_see(row, viewer):
            raise character_not_found(character_id)
        return row

    def editable(self, character_id: str, viewer: Viewer) -> Character:
        """The character, if ``viewer`` may change it: the operator any, an app its own.

        Raises:
            NotFoundError: as :meth:`visible`.
            CharacterReadOnlyError: an app asked for a deployment character.
        """
        row = self.visible(character_id, viewer)
        if viewer.app_id is not None and row.app_id is None:
            raise CharacterReadOnlyError(
                f"Character {character_id!r} is the deployment's; its operator changes it "
                "(`companion characters add`), not an app.",
                character_id=character_id,
            )
        return row

    def revision(self, character_id: str, revision: int) -> CharacterRevision | None:
        with storage_errors(), Session(self._one) as db:
            return db.get(CharacterRevision, (character_id, revision))

    def revisions(self, character_id: str) -> list[tuple[int, str]]:
        """Every revision's number and time (ISO 8601), oldest first."""
        with storage_errors(), Session(self._one) as db:
            rows = db.exec(
                select(CharacterRevision.revision, CharacterRevision.created_at)
                .where(CharacterRevision.character_id == character_id)
                .order_by(col(CharacterRevision.revision))
            ).all()
        return [(r, at.isoformat()) for r, at in rows]

    def has_avatar(self, character_id: str) -> bool:
        """Whether the character has an image (its bytes are not read)."""
        with storage_errors(), Session(self._one) as db:
            return bool(
                db.execute(
                    text("SELECT EXISTS (SELECT 1 FROM character_avatars WHERE character_id = :c)"), {"c": character_id}
                ).scalar()
            )

    def avatar(self, character_id: str) -> Avatar | None:
        with storage_errors(), Session(self._one) as db:
            row = db.execute(
                text("SELECT mime, image FROM character_avatars WHERE character_id = :c"), {"c": character_id}
            ).first()
        return Avatar(mime=row.mime, image=bytes(row.image)) if row is not None else None

    def page(
        self, viewer: Viewer, *, name: str | None = None, limit: int = 50, after: str | None = None
    ) -> list[Character]:
        """The characters ``viewer`` sees, oldest first, at most ``limit`` after the one with id
        ``after``; ``name``: only those whose name contains it (any case)."""
        query = select(Character).where(_seen_by(viewer))
        if name:
            pattern = "%" + name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query = query.where(col(Character.name).ilike(pattern))
        with storage_errors(), Session(self._one) as db:
            if after is not None:
                mark = db.get(Character, after)
                if mark is None or not can_see(mark, viewer):
                    raise InvalidRequestError(f"after: no character {after!r} to list after.", field="after")
                query = query.where(
                    or_(
                        col(Character.created_at) > mark.created_at,
                        (col(Character.created_at) == mark.created_at) & (col(Character.id) > mark.id),
                    )
                )
            limit = max(1, min(int(limit), MAX_PAGE))
            return list(db.exec(query.order_by(col(Character.created_at), col(Character.id)).limit(limit)).all())

    def owned_cards(self, user_id: str) -> list[dict[str, Any]]:
        """The user's own characters, each with its newest card: ``id``, ``name``, ``revision``, ``card``."""
        with storage_errors(), Session(self._one) as db:
            rows = db.exec(
                select(Character, CharacterRevision)
                .join(
                    CharacterRevision,
                    (col(CharacterRevision.character_id) == Character.id)
                    & (col(CharacterRevision.revision) == Character.revision),
                )
                .where(Character.owner_id == user_id)
                .order_by(col(Character.created_at))
            ).all()
        return [{"id": c.id, "name": c.name, "revision": c.revision, "card": r.card} for c, r in rows]

    def session_count(self, character_id: str) -> int:
        with storage_errors(), Session(self._one) as db:
            return int(
                db.exec(
                    select(func.count()).select_from(ChatSession).where(ChatSession.character_id == character_id)
                ).one()
            )

    def sessions(self, character_id: str) -> list[tuple[str, str]]:
        """``(session id, user id)`` of every session of the character."""
        with storage_errors(), Session(self._one) as db:
            return [
                (s, u)
                for s, u in db.exec(
                    select(ChatSession.id, ChatSession.user_id).where(ChatSession.character_id == character_id)
                ).all()
            ]


def can_see(row: Character, viewer: Viewer) -> bool:
    """Whether ``viewer`` may see ``row`` (the module docstring's rule)."""
    if row.app_id is None or viewer.app_id is None:
        return True
    if row.app_id != viewer.app_id:
        return False
    return row.owner_id is None or row.owner_id == viewer.user_id


def _seen_by(viewer: Viewer) -> Any:
    if viewer.app_id is None:
        return col(Character.app_id).is_(None)
    mine = (col(Character.app_id) == viewer.app_id) & (
        col(Character.owner_id).is_(None) | (col(Character.owner_id) == viewer.user_id)
        if viewer.user_id is not None
        else col(Character.owner_id).is_(None)
    )
    return col(Character.app_id).is_(None) | mine


def _deployment_named(name: str) -> Any:
    return select(Character).where(col(Character.app_id).is_(None), Character.name == name)


def placeholder(db: Session, name: str) -> str:
    """In ``db``'s transaction: the id of the deployment character ``name``, made without a card
    (revision 0: it speaks as an engine's default character until it is given one) if missing."""
    db.execute(
        text(
            "INSERT INTO characters (id, name) VALUES ('ch_' || replace(CAST(gen_random_uuid() AS text), '-', ''), :n) "
            "ON CONFLICT (name) WHERE app_id IS NULL DO NOTHING"
        ),
        {"n": name},
    )
    return str(
        db.execute(text("SELECT id FROM characters WHERE app_id IS NULL AND name = :n"), {"n": name}).scalar_one()
    )


def _put_avatar(db: Session, character_id: str, avatar: Avatar) -> None:
    db.execute(
        text(
            "INSERT INTO character_avatars (character_id, mime, image) VALUES (:c, :m, :i) "
            "ON CONFLICT (character_id) DO UPDATE SET mime = excluded.mime, image = excluded.image"
        ),
        {"c": character_id, "m": avatar.mime, "i": avatar.image},
    )


def in_use(character_id: str, sessions: int) -> CharacterInUseError:
    return CharacterInUseError(
        f"Character {character_id!r} has {sessions} session(s); delete them with it "
        "(?cascade=true, `--cascade`) or keep it.",
        character_id=character_id,
        sessions=sessions,
    )
