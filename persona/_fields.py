"""Turning a mapping of card fields into a checked :class:`Persona` (shared by cards and plain files)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from errors import PersonaError
from persona._lorebook import parse_lorebook
from persona._model import Persona

MAX_NAME_CHARS = 200
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
    return value.strip()


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
    raw_greetings = data.get("alternate_greetings") or []
    where = prefix + "alternate_greetings"
    if not isinstance(raw_greetings, list) or not all(isinstance(g, str) for g in raw_greetings):
        raise PersonaError(f"Persona file {path!r}: {where} must be a list of strings.", path=path, field=where)
    tags = data.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise PersonaError(
            f"Persona file {path!r}: {prefix}tags must be a list of strings.", path=path, field=prefix + "tags"
        )
    return Persona(
        name=name.strip(),
        nickname=nickname,
        first_message=first,
        alternate_greetings=tuple(g.strip() for g in raw_greetings),
        character_version=version,
        example_dialogues=examples,
        tags=tuple(tags),
        character_book=parse_lorebook(data.get("character_book"), field=prefix + "character_book", path=path),
        source=source,
        **texts,
    )
