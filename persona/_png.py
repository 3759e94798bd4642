"""Character cards embedded in PNG text chunks.

Card tools write the card JSON, base64-encoded, in a ``tEXt`` (or ``iTXt``) chunk:
keyword ``chara`` for V2 (and V1), ``ccv3`` for V3. When both are present, ``ccv3``
wins, as the V3 spec asks. Read with Pillow (``Image.text``).
"""

from __future__ import annotations

import base64
import binascii
import io

from errors import PersonaError
from persona._card import parse_card_json
from persona._model import Persona

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KEYWORDS = ("ccv3", "chara")
"""Chunk keywords in order of preference."""


def parse_card_png(raw: bytes, *, path: str) -> Persona:
    """A persona from a PNG's ``ccv3`` or ``chara`` chunk.

    Raises:
        PersonaError: not a readable PNG (field ``png``), no card chunk (field ``chara``),
            broken base64 (``chara chunk base64``), or a bad card inside (its field).
    """
    keyword, decoded = card_payload(raw, path=path)
    return parse_card_json(decoded, path=path, where=f"{keyword} chunk ")


def card_payload(raw: bytes, *, path: str) -> tuple[str, bytes]:
    """The keyword of a PNG's card chunk (``ccv3`` before ``chara``) and the card JSON it holds,
    base64-decoded (UTF-8 bytes).

    Raises:
        PersonaError: as :func:`parse_card_png`, but for the card inside.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.load()
            chunks = dict(getattr(image, "text", {}) or {})
    except UnidentifiedImageError as exc:  # its message names an in-memory buffer, not the file
        raise PersonaError(
            f"Persona file {path!r} is not a readable PNG (not an image format Pillow knows).", path=path, field="png"
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise PersonaError(f"Persona file {path!r} is not a readable PNG ({exc}).", path=path, field="png") from exc
    keyword = next((k for k in KEYWORDS if k in chunks), None)
    if keyword is None:
        raise PersonaError(
            f"Persona file {path!r} is a PNG without a character card: no 'chara' or 'ccv3' text chunk.",
            path=path,
            field="chara",
        )
    encoded = chunks[keyword]
    try:
        decoded = base64.b64decode("".join(str(encoded).split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PersonaError(
            f"Persona file {path!r}: {keyword} chunk base64 is not valid ({exc}).",
            path=path,
            field=f"{keyword} chunk base64",
        ) from exc
    return keyword, decoded
