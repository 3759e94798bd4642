"""Personas: the character the runtime speaks as.

A persona is read by :func:`load_persona` from a Character Card V1/V2/V3 (JSON, or a
PNG with the card in a ``chara``/``ccv3`` text chunk) or from our own TOML/YAML file.
Its lorebook (``character_book``) comes as typed :class:`LoreEntry` values.
``persona`` imports only ``errors`` (for the shared exception hierarchy) and
third-party packages (``regex`` for lorebook keys).
"""

from persona._clock_macros import CLOCK_MACROS, format_moment, humanize
from persona._export import CARD_KINDS, ReadCard, card_data, export_card, export_png, persona_from_card, read_card
from persona._keys import CompiledKey, is_regex_form, normalize, search
from persona._load import SUFFIXES, load_persona
from persona._lorebook import PLACEMENTS, SELECTIVE_LOGICS, Lorebook, LoreEntry, entry_keys, load_world_info
from persona._macros import MacroContext, apply_macros, expand
from persona._model import Persona
from persona._plain import DEFAULT_PERSONA_FILE

__all__ = [
    "CARD_KINDS",
    "ReadCard",
    "card_data",
    "export_card",
    "export_png",
    "persona_from_card",
    "read_card",
    "CLOCK_MACROS",
    "format_moment",
    "humanize",
    "DEFAULT_PERSONA_FILE",
    "PLACEMENTS",
    "SELECTIVE_LOGICS",
    "CompiledKey",
    "MacroContext",
    "SUFFIXES",
    "LoreEntry",
    "Lorebook",
    "Persona",
    "apply_macros",
    "entry_keys",
    "expand",
    "load_persona",
    "normalize",
    "is_regex_form",
    "load_world_info",
    "search",
]
