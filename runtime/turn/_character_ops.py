"""Characters as data: adding, revising, exporting and deleting them, for the API and the command line.

A card comes as bytes (Character Card V1/V2/V3 JSON, a PNG with a ``chara``/``ccv3`` chunk, or our
TOML/YAML), is read and checked in full (:func:`persona.read_card`, then the persona budget) before
anything is stored, and is stored as its ``data`` object, one revision per edit. A PNG card's image
becomes the character's avatar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import structlog

from errors import CharacterReadOnlyError, ConfigurationError, InvalidRequestError, PersonaError
from memory.characters import Avatar, Characters
from memory.tables import Character
from persona import Persona, ReadCard, export_card, export_png, read_card
from runtime.accounting import TokenCounter
from runtime.context import render_persona
from runtime.turn._characters import Cast
from runtime.turn._sessions import SessionOps

log = structlog.get_logger("companion.characters")

EXPORT_FORMATS = ("v2", "v3", "png")
"""What :meth:`CharacterOps.export` writes: Character Card V2 or V3 JSON, or a PNG with both chunks."""

_NEVER_CUT = ("system_prompt", "description", "personality", "scenario", "post_history_instructions")
AVATAR_TYPES = {"image/png", "image/jpeg", "image/webp", "image/gif"}
"""Avatar images accepted besides a PNG card's own."""


@dataclass(frozen=True, kw_only=True)
class Exported:
    """A card written out."""

    body: bytes
    media_type: str
    filename: str


class CharacterOps:
    """What an engine does with stored characters.

    Args:
        characters: the characters room.
        cast: the engine's parsed characters.
        sessions: the engine's session operations (a deletion with ``cascade`` deletes the sessions).
        persona_cap: the ``persona`` budget, tokens: a card whose never-cut parts exceed it is refused.
        counter: the engine's token counter.
    """

    def __init__(
        self, *, characters: Characters, cast: Cast, sessions: SessionOps, persona_cap: int, counter: TokenCounter
    ) -> None:
        self.characters, self.cast, self.sessions = characters, cast, sessions
        self.persona_cap, self.counter = persona_cap, counter

    def read(self, raw: bytes, *, name: str = "card") -> ReadCard:
        """Read and check a card: every field (:func:`persona.read_card`), and its never-cut parts
        within the ``persona`` budget.

        Raises:
            PersonaError: a bad card (``field`` names the field to fix; ``data`` for a card whose
                never-cut parts exceed the budget, the longest of them named in the message).
        """
        if not raw:
            raise PersonaError("The card is empty.", path=name, field="card")
        card = read_card(raw, name=name)
        self.check_fits(card.persona)
        return card

    def check_fits(self, persona: Persona) -> None:
        """Raises PersonaError when the persona's never-cut parts exceed the ``persona`` budget."""
        try:
            render_persona(persona, cap=self.persona_cap, counter=self.counter)
        except ConfigurationError as exc:
            longest = max(_NEVER_CUT, key=lambda f: len(getattr(persona, f)))
            raise PersonaError(
                f"{exc} The longest part is data.{longest}.", path=persona.name, field=f"data.{longest}"
            ) from exc

    def add(
        self,
        card: ReadCard,
        *,
        app_id: str | None = None,
        owner_id: str | None = None,
        avatar: Avatar | None = None,
    ) -> Character:
        """Store a checked card as a new character (the app's, a user's own with ``owner_id``, or
        the deployment's with neither); a PNG card's image is its avatar unless ``avatar`` is given.

        Raises:
            InvalidRequestError: a deployment character of that name exists (field ``name``).
        """
        row = self.characters.create(
            name=card.persona.name,
            spec=card.kind,
            card=card.data,
            app_id=app_id,
            owner_id=owner_id,
            avatar=avatar or _own_image(card),
        )
        log.info("character.added", character_id=row.id, scope=scope_of(row), revision=row.revision)
        return row

    def revise(self, row: Character, card: ReadCard, *, avatar: Avatar | None = None) -> Character:
        """A new revision of ``row`` with a checked card: the next turn of each of its sessions uses it."""
        revised = self.characters.revise(
            row, name=card.persona.name, spec=card.kind, card=card.data, avatar=avatar or _own_image(card)
        )
        log.info("character.revised", character_id=row.id, revision=revised.revision)
        return revised

    def remove(self, row: Character, *, cascade: bool = False) -> int:
        """Delete the character; with ``cascade``, its sessions first (each with everything of it).
        Returns how many sessions were deleted.

        Raises:
            CharacterInUseError: it has sessions and ``cascade`` is false (nothing is deleted).
            ConflictError: it is the engine's default character.
        """
        if row.id == self.cast.default.id:
            raise CharacterReadOnlyError(
                f"Character {row.id!r} is the deployment's default (COMPANION_PERSONA); it cannot be deleted.",
                character_id=row.id,
            )
        deleted = 0
        if cascade:
            for session_id, user_id in self.characters.sessions(row.id):
                self.sessions.delete_session(user_id=user_id, session_id=session_id)
                deleted += 1
        self.characters.delete(row)
        log.info("character.deleted", character_id=row.id, sessions_deleted=deleted)
        return deleted

    def export(self, row: Character, fmt: str, *, revision: int | None = None) -> Exported:
        """The card of ``row`` (its newest revision, or ``revision``) as V2 or V3 JSON or a PNG.

        Raises:
            InvalidRequestError: an unknown format (field ``format``) or revision (field ``revision``).
        """
        if fmt not in EXPORT_FORMATS:
            raise InvalidRequestError(
                f"format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}.", field="format"
            )
        number = row.revision if revision is None else revision
        stored = self.characters.revision(row.id, number) if number > 0 else None
        if stored is None:
            raise InvalidRequestError(f"Character {row.id!r} has no revision {number}.", field="revision")
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in row.name)[:80] or "character"
        if fmt == "png":
            avatar = self.characters.avatar(row.id)
            return Exported(
                body=export_png(stored.card, avatar.image if avatar else None),
                media_type="image/png",
                filename=f"{stem}.png",
            )
        body = json.dumps(export_card(stored.card, fmt), ensure_ascii=False, indent=2).encode("utf-8")
        return Exported(body=body, media_type="application/json", filename=f"{stem}.{fmt}.json")


def scope_of(row: Character) -> str:
    """``deployment``, ``app`` or ``user``: who sees the character."""
    if row.app_id is None:
        return "deployment"
    return "user" if row.owner_id is not None else "app"


def _own_image(card: ReadCard) -> Avatar | None:
    return Avatar(mime="image/png", image=card.image) if card.image is not None else None
