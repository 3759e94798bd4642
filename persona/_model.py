"""The :class:`Persona` value and the ``{{char}}``/``{{user}}`` macros."""

from __future__ import annotations

import re
from dataclasses import dataclass

from persona._lorebook import Lorebook

_CHAR = re.compile(r"\{\{\s*char\s*\}\}|<BOT>", re.IGNORECASE)
_USER = re.compile(r"\{\{\s*user\s*\}\}|<USER>", re.IGNORECASE)


def apply_macros(text: str, *, char: str, user: str) -> str:
    """``text`` with ``{{char}}`` → ``char`` and ``{{user}}`` → ``user``.

    Case-insensitive and tolerant of inner spaces (``{{ User }}``), as SillyTavern
    reads them; the legacy ``<BOT>`` and ``<USER>`` of Pygmalion-era cards too.
    Other ``{{...}}`` macros are left as they are.
    """
    text = _CHAR.sub(lambda _: char, text)
    return _USER.sub(lambda _: user, text)


@dataclass(frozen=True, kw_only=True)
class Persona:
    """The character: its card fields. Text fields may hold ``{{char}}``/``{{user}}`` macros,
    replaced when the prompt is rendered (``runtime/persona_render.py``)."""

    name: str
    """Display name, e.g. ``Mira``; at most 200 characters. Scopes the knowledge base."""
    system_prompt: str = ""
    """The card's system prompt; empty: the runtime's default framing is used."""
    description: str = ""
    personality: str = ""
    scenario: str = ""
    first_message: str = ""
    """The character's opening line of a new session (card ``first_mes``)."""
    example_dialogues: tuple[str, ...] = ()
    """Whole example dialogues (card ``mes_example`` split on ``<START>``), in order."""
    post_history_instructions: str = ""
    """Sent after the recent turns, right before the reply."""
    creator_notes: str = ""
    """For humans only: never sent to the model."""
    tags: tuple[str, ...] = ()
    character_book: Lorebook | None = None
    """The embedded lorebook, if any."""
    source: str = "inline"
    """Where it came from: ``chara_card_v2``, ``chara_card_v3``, ``chara_card_v1``, ``toml``, ``yaml`` or ``inline``."""
