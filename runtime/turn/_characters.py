"""The characters an engine speaks as: each stored card parsed once per revision and process.

A session talks as its character (``sessions.character_id``); its turns read the character's newest
revision (the claim, or assembly's one read, returns it with what they read anyway) and take the
parsed :class:`~persona.Persona` from :class:`Cast`, which reads and parses a revision's card only
the first time that revision is asked for in this process.

The engine's own persona (``COMPANION_PERSONA``, or the one it was built with) is the deployment's
default character: stored as a deployment character of its name when the engine starts (a new
revision when the card changed), and its sessions speak as the engine's persona itself. A character
made from an old session's persona name (revision 0, no card) speaks as the default too, as such a
session did before characters were data.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cachetools import LRUCache

from errors import NotFoundError
from memory.characters import Characters
from persona import Persona, card_data, persona_from_card

CACHED_REVISIONS = 4096
"""Parsed revisions kept per process (least recently used dropped first)."""


@dataclass(frozen=True, kw_only=True)
class SessionCharacter:
    """Who a session talks as, at one revision."""

    id: str
    revision: int
    persona: Persona


class Cast:
    """The engine's characters: the default one, and every stored one parsed on first use.

    Args:
        characters: the characters room.
        default: the engine's persona, stored as the deployment character of its name.
    """

    def __init__(self, characters: Characters, default: Persona) -> None:
        self.characters = characters
        self._persona = default
        self._default: SessionCharacter | None = None
        self._parsed: LRUCache[tuple[str, int], Persona] = LRUCache(maxsize=CACHED_REVISIONS)
        self._lock = threading.Lock()

    @property
    def default(self) -> SessionCharacter:
        """The deployment's default character, speaking as the engine's persona: stored (or
        revised) on first use, so that building an engine needs no database.

        Raises:
            StorageError: the database failed (the next use tries again).
        """
        if self._default is None:
            persona = self._persona
            row, _ = self.characters.ensure_deployment(name=persona.name, spec=persona.source, card=card_data(persona))
            self._default = SessionCharacter(id=row.id, revision=row.revision, persona=persona)
        return self._default

    def at(self, character_id: str | None, revision: int) -> SessionCharacter:
        """The character ``character_id`` at ``revision`` (``None``: the default, for a session
        not stored yet). The card is read and parsed on the first ask of the revision only.

        Raises:
            NotFoundError: the character or that revision was deleted.
        """
        if character_id is None or character_id == self.default.id or revision <= 0:
            if character_id is None or character_id == self.default.id:
                return self.default
            return SessionCharacter(id=character_id, revision=0, persona=self.default.persona)
        key = (character_id, revision)
        with self._lock:
            persona = self._parsed.get(key)
        if persona is None:
            stored = self.characters.revision(character_id, revision)
            if stored is None:
                raise NotFoundError(f"No character {character_id!r}.", kind="character", resource_id=character_id)
            persona = persona_from_card(stored.card, kind=stored.spec, name=character_id)
            with self._lock:
                self._parsed[key] = persona
        return SessionCharacter(id=character_id, revision=revision, persona=persona)

    def newest(self, character_id: str) -> SessionCharacter:
        """The character at its newest revision (one read of its row).

        Raises:
            NotFoundError: no such character.
        """
        if character_id == self.default.id:
            return self.default
        row = self.characters.get(character_id)
        if row is None:
            raise NotFoundError(f"No character {character_id!r}.", kind="character", resource_id=character_id)
        return self.at(row.id, row.revision)
