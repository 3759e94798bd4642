"""Plain persona files: TOML with ``name`` and ``system_prompt``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from memory.errors import PersonaError

DEFAULT_PERSONA_FILE = Path(__file__).resolve().parent / "default.toml"
"""The bundled default companion."""


@dataclass(frozen=True, kw_only=True)
class Persona:
    """The character: a display name and the system prompt it speaks under."""

    name: str
    """Display name, e.g. ``Mira``; at most 200 characters."""
    system_prompt: str
    """The system message that opens every assembled context."""


def load_persona(path: Path | str | None = None) -> Persona:
    """Read a persona from a TOML file (``None``: the bundled default).

    The file needs two string keys::

        name = "Mira"
        system_prompt = \"\"\"You are Mira, a warm and curious companion...\"\"\"

    Raises:
        PersonaError: the file is missing, is not valid TOML, or lacks a non-empty
            ``name`` or ``system_prompt``; the message names the file and the field.
    """
    file = Path(path) if path is not None else DEFAULT_PERSONA_FILE
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PersonaError(f"Persona file {str(file)!r} does not exist.", path=str(file)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PersonaError(f"Persona file {str(file)!r} is not valid UTF-8 TOML: {exc}", path=str(file)) from exc
    for field in ("name", "system_prompt"):
        value = data.get(field)
        if not isinstance(value, str) or not value.strip():
            raise PersonaError(
                f"Persona file {str(file)!r} needs a non-empty string field {field!r}.", path=str(file), field=field
            )
    if len(data["name"]) > 200:
        raise PersonaError(f"Persona name in {str(file)!r} is longer than 200 characters.", path=str(file), field="name")
    if "\x00" in data["name"] + data["system_prompt"]:
        raise PersonaError(f"Persona file {str(file)!r} contains a NUL character.", path=str(file))
    return Persona(name=data["name"].strip(), system_prompt=data["system_prompt"].strip())
