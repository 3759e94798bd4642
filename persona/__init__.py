"""Personas: the character the runtime speaks as.

A persona is read from a plain TOML file with a ``name`` and a ``system_prompt``
(Character Card V2/V3 support comes with a later issue). ``persona`` imports only
``memory.errors`` (for the shared exception hierarchy).
"""

from persona._plain import DEFAULT_PERSONA_FILE, Persona, load_persona

__all__ = ["DEFAULT_PERSONA_FILE", "Persona", "load_persona"]
