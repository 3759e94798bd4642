"""Our own persona files: TOML or YAML with the card's fields under our names.

::

    name = "Mira"                       # required
    system_prompt = "..."               # optional if description is given
    description = "..."
    personality = "..."
    scenario = "..."
    first_message = "..."
    alternate_greetings = ["...", "..."]  # greetings 1, 2, ... (0 is first_message)
    nickname = "..."                    # what {{char}} becomes, if not the name
    example_dialogues = ["{{user}}: hi\\n{{char}}: hello!", "..."]   # or one string split on <START>
    post_history_instructions = "..."
    creator_notes = "..."
    tags = ["..."]
    [character_book]                    # the V2 character_book shape
    entries = [{keys = ["..."], content = "..."}]
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from errors import PersonaError
from persona._fields import build_persona
from persona._model import Persona

DEFAULT_PERSONA_FILE = Path(__file__).resolve().parent / "default.toml"
"""The bundled default companion."""


def load_plain(file: Path, raw: bytes, kind: str) -> Persona:
    """The persona in a TOML (``kind="toml"``) or YAML file's bytes (UTF-8; a leading byte order mark is ignored).

    Raises:
        PersonaError: invalid UTF-8, TOML or YAML, or bad fields (named).
    """
    path = str(file)
    try:
        text = raw.decode("utf-8-sig")  # a leading byte order mark is dropped
    except UnicodeDecodeError as exc:
        raise PersonaError(f"Persona file {path!r} is not valid UTF-8 (byte {exc.start}).", path=path) from None
    if kind == "toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PersonaError(f"Persona file {path!r} is not valid TOML: {exc}", path=path) from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PersonaError(f"Persona file {path!r} is not valid YAML: {exc}", path=path) from exc
    if not isinstance(data, Mapping):
        raise PersonaError(f"Persona file {path!r} must hold a table of fields (name, system_prompt, ...).", path=path)
    return build_persona(
        data,
        path=path,
        prefix="",
        source=kind,
        names={"first_message": "first_message", "example_dialogues": "example_dialogues"},
        require_prompt=True,
    )
