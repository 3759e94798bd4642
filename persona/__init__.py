"""Personas: the character the runtime speaks as.

A persona is read by :func:`load_persona` from a Character Card V1/V2/V3 (JSON, or a
PNG with the card in a ``chara``/``ccv3`` text chunk) or from our own TOML/YAML file.
Its lorebook (``character_book``) comes as typed :class:`LoreEntry` values.
``persona`` imports only ``errors`` (for the shared exception hierarchy).
"""

from persona._lorebook import SELECTIVE_LOGICS, LoreEntry, Lorebook
from persona._load import SUFFIXES, load_persona
from persona._model import Persona, apply_macros
from persona._plain import DEFAULT_PERSONA_FILE

__all__ = [
    "DEFAULT_PERSONA_FILE",
    "SELECTIVE_LOGICS",
    "SUFFIXES",
    "LoreEntry",
    "Lorebook",
    "Persona",
    "apply_macros",
    "load_persona",
]
