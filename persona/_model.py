"""The :class:`Persona` value (its macros are in ``persona/_macros.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from persona._lorebook import Lorebook
from persona._macros import apply_macros

__all__ = ["Persona", "apply_macros"]


@dataclass(frozen=True, kw_only=True)
class Persona:
    """The character: its card fields. Text fields may hold ``{{char}}``/``{{user}}`` macros,
    replaced when the prompt is rendered (``runtime/context/_persona.py``)."""

    name: str
    """Display name, e.g. ``Mira``; at most 200 characters. Scopes the knowledge base."""
    nickname: str = ""
    """V3 ``nickname``: when set, what ``{{char}}`` becomes in the prompt instead of ``name``."""
    system_prompt: str = ""
    """The card's system prompt; empty: the runtime's default framing is used."""
    description: str = ""
    personality: str = ""
    scenario: str = ""
    first_message: str = ""
    """The character's opening line of a new session (card ``first_mes``)."""
    alternate_greetings: tuple[str, ...] = ()
    """Other opening lines to choose from (card ``alternate_greetings``); greeting 1 is the first of them."""
    example_dialogues: tuple[str, ...] = ()
    """Whole example dialogues (card ``mes_example`` split on ``<START>``), in order."""
    post_history_instructions: str = ""
    """Sent after the recent turns, right before the reply."""
    creator_notes: str = ""
    """For humans only: never sent to the model."""
    tags: tuple[str, ...] = ()
    character_version: str = ""
    character_book: Lorebook | None = None
    """The embedded lorebook, if any."""
    source: str = "inline"
    """Where it came from: ``chara_card_v2``, ``chara_card_v3``, ``chara_card_v1``, ``toml``, ``yaml`` or ``inline``."""

    @property
    def char_name(self) -> str:
        """What the character is called in the prompt (``{{char}}``): the nickname if set, else the name."""
        return self.nickname or self.name

    @property
    def greetings(self) -> tuple[str, ...]:
        """The first message, then the alternate greetings: greeting ``i`` is ``greetings[i]``
        (the V3 spec's greeting index, as ``@@is_greeting`` counts)."""
        return (self.first_message, *self.alternate_greetings)
