"""Turning a mapping of card fields into a checked :class:`Persona` (shared by cards and plain files)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import structlog

from errors import PersonaError
from persona._lorebook import parse_lorebook
from persona._model import Persona

log = structlog.get_logger("companion.persona")

MAX_NAME_CHARS = 200
MAX_TEXT_CHARS = 200_000
"""The longest text field a card may have, characters (about 50k tokens: far over any persona budget)."""
_START = re.compile(r"^\s*<START>\s*$", re.IGNORECASE | re.MULTILINE)

TEXT_FIELDS = ("system_prompt", "description", "personality", "scenario", "post_history_instructions", "creator_notes")


def split_examples(text: str) -> tuple[str, ...]:
    """A card's ``mes_example`` as whole examples: split on lines that are ``<START>``, blanks dropped."""
    return tuple(part.strip() for part in _START.split(text) if part.strip())


def _text(data: Mapping[str, Any], key: str, *, where: str, path: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PersonaError(
            f"Persona file {path!r}: {where} must be a string, got {type(value).__name__}.", path=path, field=where
        )
    if "\x00" in value:
        raise PersonaError(f"Persona file {path!r}: {where} contains a NUL character.", path=path, field=where)
    if len(value) > MAX_TEXT_CHARS:
        raise PersonaError(
            f"Persona file {path!r}: {where} is {len(value):,} characters; at most {MAX_TEXT_CHARS:,} are allowed.",
            path=path,
            field=where,
        )
    return value.strip()


def _strings(value: Any, *, where: str, path: str, split: str | None) -> list[str]:
    """A list of strings, read tolerantly where card tools write it otherwise: ``null`` is an empty
    list; one string is a list of that string (cut at ``split`` when given: tags written
    ``"a, b"``); numbers are their text. Anything else is refused. Each tolerant reading is logged
    (``persona.field_coerced``).

    Raises:
        PersonaError: a value that is none of those (``field`` is ``where``)."""
    if value is None:
        return []
    if isinstance(value, str):
        log.warning("persona.field_coerced", field=where, reading="a string as a list of strings")
        return [v.strip() for v in value.split(split)] if split else [value]
    if isinstance(value, list) and all(
        isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool)) or v is None for v in value
    ):
        if not all(isinstance(v, str) for v in value):
            log.warning("persona.field_coerced", field=where, reading="numbers and nulls in a list of strings")
        return [str(v) for v in value if v is not None]
    raise PersonaError(f"Persona file {path!r}: {where} must be a list of strings.", path=path, field=where)


def build_persona(
    data: Mapping[str, Any],
    *,
    path: str,
    prefix: str,
    source: str,
    names: Mapping[str, str],
    require_prompt: bool = False,
) -> Persona:
    """A persona from ``data``.

    Args:
        prefix: how ``data`` is reached in the file, for error messages (``"data."`` in a V2/V3 card).
        names: file keys of ``first_message`` and ``example_dialogues`` (cards: ``first_mes``, ``mes_example``).
        require_prompt: our plain files need a ``system_prompt`` or a ``description``.

    Raises:
        PersonaError: a missing or empty ``name``, a field of the wrong type; ``field`` is the
            field's path in the file (e.g. ``data.name``).
    """
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PersonaError(
            f"Persona file {path!r} needs a non-empty string field {prefix + 'name'!r}.",
            path=path,
            field=prefix + "name",
        )
    if len(name.strip()) > MAX_NAME_CHARS:
        raise PersonaError(
            f"Persona name in {path!r} is longer than {MAX_NAME_CHARS} characters.", path=path, field=prefix + "name"
        )
    if "\x00" in name:
        raise PersonaError(
            f"Persona file {path!r}: {prefix}name contains a NUL character.", path=path, field=prefix + "name"
        )
    texts = {key: _text(data, key, where=prefix + key, path=path) for key in TEXT_FIELDS}
    if require_prompt and not (texts["system_prompt"] or texts["description"]):
        raise PersonaError(
            f"Persona file {path!r} needs a non-empty string field 'system_prompt' (or a 'description').",
            path=path,
            field="system_prompt",
        )
    first = _text(data, names["first_message"], where=prefix + names["first_message"], path=path)
    raw_examples = data.get(names["example_dialogues"])
    where = prefix + names["example_dialogues"]
    if raw_examples is None:
        examples: tuple[str, ...] = ()
    elif isinstance(raw_examples, str):
        examples = split_examples(raw_examples)
    elif isinstance(raw_examples, list) and all(isinstance(e, str) for e in raw_examples):
        examples = tuple(e.strip() for e in raw_examples if e.strip())
    else:
        raise PersonaError(
            f"Persona file {path!r}: {where} must be a string or a list of strings.", path=path, field=where
        )
    nickname = _text(data, "nickname", where=prefix + "nickname", path=path)
    version = data.get("character_version")
    version = str(version).strip() if isinstance(version, (str, int, float)) and not isinstance(version, bool) else ""
    where = prefix + "alternate_greetings"
    raw_greetings = _strings(data.get("alternate_greetings"), where=where, path=path, split=None)
    tags = _strings(data.get("tags"), where=prefix + "tags", path=path, split=",")
    return Persona(
        name=name.strip(),
        nickname=nickname,
        first_message=first,
        alternate_greetings=tuple(g.strip() for g in raw_greetings if g.strip()),
        character_version=version,
        example_dialogues=examples,
        tags=tuple(tags),
        character_book=parse_lorebook(data.get("character_book"), field=prefix + "character_book", path=path),
        source=source,
        **texts,
    )
