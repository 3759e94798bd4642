"""``load_persona``: one entry point for every persona file kind."""

from __future__ import annotations

from pathlib import Path

from errors import PersonaError
from persona._card import parse_card_json
from persona._model import Persona
from persona._plain import DEFAULT_PERSONA_FILE, load_plain
from persona._png import PNG_MAGIC, parse_card_png

SUFFIXES = (".json", ".png", ".toml", ".yaml", ".yml")


def load_persona(path: Path | str | None = None) -> Persona:
    """Read a persona file (``None``: the bundled default, ``persona/default.toml``).

    The kind is told by content first (PNG signature, a leading ``{``), then by suffix:
    ``.json`` Character Card V1/V2/V3; ``.png`` a card in a ``chara``/``ccv3`` chunk;
    ``.toml``, ``.yaml``/``.yml`` our plain format (see ``persona/_plain.py``).

    Raises:
        PersonaError: the file is missing or unreadable, of an unknown kind, or has a bad
            field; ``.path`` is the file and ``.field`` the field to fix (e.g. ``data.name``,
            ``spec``, ``chara chunk base64``).
    """
    file = Path(path) if path is not None else DEFAULT_PERSONA_FILE
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise PersonaError(f"Persona file {str(file)!r} does not exist.", path=str(file)) from None
    except OSError as exc:
        raise PersonaError(
            f"Persona file {str(file)!r} cannot be read ({exc.strerror or exc}).", path=str(file)
        ) from exc
    suffix = file.suffix.lower()
    if raw.startswith(PNG_MAGIC) or suffix == ".png":
        return parse_card_png(raw, path=str(file))
    if suffix == ".json" or (suffix not in SUFFIXES and raw.lstrip()[:1] == b"{"):
        return parse_card_json(raw, path=str(file))
    if suffix in (".yaml", ".yml"):
        return load_plain(file, raw, "yaml")
    if suffix == ".toml":
        return load_plain(file, raw, "toml")
    raise PersonaError(
        f"Persona file {str(file)!r}: unknown kind {suffix or '(no suffix)'!r}; use one of {', '.join(SUFFIXES)}.",
        path=str(file),
    )
