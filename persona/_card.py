"""Character Card V2/V3 JSON (the SillyTavern ecosystem's format).

- V2: ``{"spec": "chara_card_v2", "spec_version": "2.0", "data": {...}}``
  (github.com/malfoyslastname/character-card-spec-v2).
- V3: ``{"spec": "chara_card_v3", "spec_version": "3.0", "data": {...}}``
  (github.com/kwaroran/character-card-spec-v3); the fields we use are V2's plus
  ``nickname``, the lorebook's ``use_regex`` and its entries' decorators.
- V1 (a flat object with ``name``, ``description``, ``first_mes`` ... and no ``spec``)
  is read too, since it is the same fields one level up.

``data`` fields read: ``name``, ``description``, ``personality``, ``scenario``,
``first_mes``, ``mes_example``, ``system_prompt``, ``post_history_instructions``,
``creator_notes``, ``tags``, ``character_version``, ``alternate_greetings``,
``nickname``, ``character_book``. Others (``assets``, ``group_only_greetings``,
``extensions`` ...) are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from errors import PersonaError
from persona._fields import build_persona
from persona._model import Persona

SPECS = ("chara_card_v2", "chara_card_v3")
CARD_NAMES = {"first_message": "first_mes", "example_dialogues": "mes_example"}
_V1_MARKERS = ("first_mes", "mes_example", "personality", "scenario")


def parse_card_json(raw: bytes | str, *, path: str, where: str = "") -> Persona:
    """A persona from card JSON text (bytes are UTF-8; a leading byte order mark is ignored).

    ``where`` prefixes error fields (``chara chunk `` for PNGs).

    Raises:
        PersonaError: not JSON (field ``json``), an unknown ``spec``, no ``data`` object,
            or a bad field (named, e.g. ``data.name``).
    """
    try:
        # utf-8-sig / lstrip: a leading byte order mark is dropped (json.loads rejects it)
        data = json.loads(raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw.lstrip("\ufeff"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        field = f"{where}json".strip()
        raise PersonaError(
            f"Persona file {path!r}: {field} is not valid JSON ({exc}).", path=path, field=field
        ) from exc
    return parse_card(data, path=path)


def parse_card(data: Any, *, path: str) -> Persona:
    """A persona from a parsed card object. See :func:`parse_card_json`."""
    if not isinstance(data, Mapping):
        raise PersonaError(f"Persona file {path!r}: a character card must be a JSON object.", path=path, field="spec")
    spec = data.get("spec")
    if spec is None:
        if isinstance(data.get("name"), str) and any(k in data for k in _V1_MARKERS):
            return build_persona(data, path=path, prefix="", source="chara_card_v1", names=CARD_NAMES)
        raise PersonaError(
            f"Persona file {path!r} has no 'spec'; expected one of {SPECS} (Character Card V2/V3).",
            path=path,
            field="spec",
        )
    if spec not in SPECS:
        raise PersonaError(
            f"Persona file {path!r}: spec {spec!r} is not supported; expected one of {SPECS}.", path=path, field="spec"
        )
    body = data.get("data")
    if not isinstance(body, Mapping):
        raise PersonaError(f"Persona file {path!r}: a {spec} card needs a 'data' object.", path=path, field="data")
    return build_persona(body, path=path, prefix="data.", source=spec, names=CARD_NAMES)
