"""Characters as card data, and cards written back out: V2/V3 JSON, and PNG with both chunks.

A stored character is the ``data`` object of a Character Card (V2 and V3 share its fields) and
the kind it was read from. :func:`read_card` reads any card kind into that pair and the persona it
gives; :func:`card_data` writes a persona's fields as such an object (for our TOML/YAML files, which
are not cards); :func:`export_card` and :func:`export_png` give a stored card back.

What a card keeps across export and import: the ``data`` object is written as it was read (its
``extensions`` and fields the runtime does not use included), so a card read back gives the same
persona, and SillyTavern reads what we write. PNGs carry the card as SillyTavern writes it: a
``chara`` text chunk with the V2 card, base64, and a ``ccv3`` chunk with the V3 card (the V3 spec,
github.com/kwaroran/character-card-spec-v3: a reader prefers ``ccv3``).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from errors import PersonaError
from persona._card import CARD_NAMES, parse_card, parse_card_json
from persona._lorebook import SELECTIVE_LOGICS, Lorebook, LoreEntry
from persona._model import Persona
from persona._plain import load_plain
from persona._png import PNG_MAGIC, card_payload

_ROLE_NUMBERS = {"system": 0, "user": 1, "assistant": 2}
"""SillyTavern's role numbers in an entry's ``extensions.role``."""

CARD_KINDS = ("chara_card_v1", "chara_card_v2", "chara_card_v3", "toml", "yaml")
"""What a stored card was read from."""


@dataclass(frozen=True, kw_only=True)
class ReadCard:
    """A card read from an upload: its ``data`` object, its kind, the persona it gives, and the
    image it came in (a PNG card's, to be the character's avatar)."""

    data: dict[str, Any]
    """The Character Card ``data`` object (V2/V3 field names)."""
    kind: str
    """One of :data:`CARD_KINDS`."""
    persona: Persona
    image: bytes | None = None
    """The PNG's bytes, for a card that came as a PNG."""


def read_card(raw: bytes, *, name: str = "card") -> ReadCard:
    """Read a card from an upload's bytes: a PNG with a ``ccv3``/``chara`` chunk, Character Card
    V1/V2/V3 JSON, or our TOML/YAML (told by the content: PNG signature, a leading ``{``, else TOML,
    then YAML). ``name`` is what error messages call the upload (never a server path).

    Raises:
        PersonaError: not a card of any kind, or a bad field (``field`` names it, e.g.
            ``data.description``, ``data.character_book.entries[2].keys[0]``, ``spec``).
    """
    if raw.startswith(PNG_MAGIC):
        keyword, decoded = card_payload(raw, path=name)
        persona = parse_card_json(decoded, path=name, where=f"{keyword} chunk ")
        data = _card_object(json.loads(decoded.decode("utf-8-sig")), name)
        return ReadCard(data=data, kind=persona.source, persona=persona, image=raw)
    if raw.lstrip(b"\xef\xbb\xbf").lstrip()[:1] == b"{":
        persona = parse_card_json(raw, path=name)
        data = _card_object(json.loads(raw.decode("utf-8-sig")), name)
        return ReadCard(data=data, kind=persona.source, persona=persona)
    try:
        persona = load_plain(Path(name), raw, "toml")
    except PersonaError as toml_error:
        try:
            persona = load_plain(Path(name), raw, "yaml")
        except PersonaError:
            if toml_error.field is not None:
                raise toml_error from None
            raise PersonaError(
                f"{name!r} is not a character card: not a PNG card, card JSON, TOML or YAML ({toml_error}).",
                path=name,
                field="card",
            ) from None
    return ReadCard(data=card_data(persona), kind=persona.source, persona=persona)


def _card_object(card: Any, name: str) -> dict[str, Any]:
    """The ``data`` object of a parsed card (a V1 card is its own)."""
    if not isinstance(card, Mapping):
        raise PersonaError(f"Card {name!r} must be a JSON object.", path=name, field="spec")
    body = card.get("data") if card.get("spec") is not None else card
    if not isinstance(body, Mapping):
        raise PersonaError(f"Card {name!r} needs a 'data' object.", path=name, field="data")
    return {k: v for k, v in body.items() if k != "spec" and k != "spec_version"} if body is card else dict(body)


def persona_from_card(data: Mapping[str, Any], *, kind: str, name: str = "card") -> Persona:
    """The persona a stored card gives (``kind``: what it was read from, kept as the persona's ``source``).

    Raises:
        PersonaError: the card has a bad field (a card stored by :func:`read_card` has none).
    """
    persona = parse_card({"spec": "chara_card_v3", "data": dict(data)}, path=name)
    return persona if persona.source == kind else replace(persona, source=kind)


def card_data(persona: Persona) -> dict[str, Any]:
    """The persona's fields as a Character Card ``data`` object (V2/V3 names), which
    :func:`persona_from_card` reads back into an equal persona (its lorebook's ignored
    decorators aside: they were dropped on the first read)."""
    data: dict[str, Any] = {
        "name": persona.name,
        "description": persona.description,
        "personality": persona.personality,
        "scenario": persona.scenario,
        CARD_NAMES["first_message"]: persona.first_message,
        CARD_NAMES["example_dialogues"]: "".join(f"<START>\n{e}\n" for e in persona.example_dialogues),
        "system_prompt": persona.system_prompt,
        "post_history_instructions": persona.post_history_instructions,
        "creator_notes": persona.creator_notes,
        "alternate_greetings": list(persona.alternate_greetings),
        "tags": list(persona.tags),
        "character_version": persona.character_version,
        "extensions": {},
    }
    if persona.nickname:
        data["nickname"] = persona.nickname
    if persona.character_book is not None:
        data["character_book"] = book_data(persona.character_book)
    return data


def book_data(book: Lorebook) -> dict[str, Any]:
    """A lorebook as a card's ``character_book`` object."""
    out: dict[str, Any] = {"name": book.name, "entries": [_entry_data(e, i) for i, e in enumerate(book.entries)]}
    if book.scan_depth is not None:
        out["scan_depth"] = book.scan_depth
    if book.token_budget is not None:
        out["token_budget"] = book.token_budget
    out["extensions"] = {}
    return out


def _entry_data(entry: LoreEntry, index: int) -> dict[str, Any]:
    decorators = [
        *(["@@activate"] if entry.activate else []),
        *(["@@dont_activate"] if entry.dont_activate else []),
        *(["@@ignore_on_max_context"] if entry.ignore_on_max_context else []),
        *([f"@@additional_keys {','.join(entry.additional_keys)}"] if entry.additional_keys else []),
        *([f"@@exclude_keys {','.join(entry.exclude_keys)}"] if entry.exclude_keys else []),
    ]
    ext: dict[str, Any] = {
        "selectiveLogic": SELECTIVE_LOGICS.index(entry.selective_logic),
        "role": _ROLE_NUMBERS.get(entry.role, 0),
    }
    if entry.placement == "depth":
        ext["position"], ext["depth"] = 4, entry.depth
    if entry.scan_depth is not None:
        ext["scan_depth"] = entry.scan_depth
    out: dict[str, Any] = {
        "id": index,
        "keys": list(entry.keys),
        "secondary_keys": list(entry.secondary_keys),
        "content": "\n".join([*decorators, entry.content]),
        "enabled": entry.enabled,
        "insertion_order": entry.insertion_order,
        "constant": entry.constant,
        "selective": entry.selective,
        "name": entry.name,
        "comment": entry.name,
        "position": "before_char" if entry.placement == "before_char" else "after_char",
        "extensions": ext,
    }
    if entry.priority is not None:
        out["priority"] = entry.priority
    for option in ("case_sensitive", "match_whole_words", "use_regex"):
        if getattr(entry, option) is not None:
            out[option] = getattr(entry, option)
    return out


def export_card(data: Mapping[str, Any], spec: str) -> dict[str, Any]:
    """A stored card as a whole V2 (``spec`` ``v2``) or V3 (``v3``) card object.

    V3 adds the fields its spec requires that a V2 ``data`` lacks (``group_only_greetings``,
    ``creation_date``, ``modification_date`` as Unix seconds), keeping any the card has.

    Raises:
        ValueError: ``spec`` is neither ``v2`` nor ``v3``.
    """
    body = dict(data)
    body.setdefault("extensions", {})
    if spec == "v2":
        return {"spec": "chara_card_v2", "spec_version": "2.0", "data": body}
    if spec == "v3":
        now = int(datetime.now(UTC).timestamp())
        body.setdefault("group_only_greetings", [])
        body.setdefault("creation_date", now)
        body.setdefault("modification_date", now)
        return {"spec": "chara_card_v3", "spec_version": "3.0", "data": body}
    raise ValueError(f"spec must be 'v2' or 'v3', got {spec!r}")


def export_png(data: Mapping[str, Any], image: bytes | None) -> bytes:
    """The card as a PNG: ``image`` (any format Pillow reads; a plain 400×600 square when ``None``)
    with its own text chunks replaced by ``chara`` (the V2 card) and ``ccv3`` (the V3 card), base64
    of UTF-8 JSON, as SillyTavern writes them.

    Raises:
        PersonaError: ``image`` is not an image Pillow can read (field ``avatar``).
    """
    from PIL import Image, PngImagePlugin, UnidentifiedImageError

    try:
        picture = Image.open(io.BytesIO(image)) if image else Image.new("RGB", (400, 600), (235, 231, 225))
        picture.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PersonaError("The character's avatar is not an image that can be read.", field="avatar") from exc
    info = PngImagePlugin.PngInfo()
    for keyword, spec in (("chara", "v2"), ("ccv3", "v3")):
        payload = json.dumps(export_card(data, spec), ensure_ascii=False).encode("utf-8")
        info.add_text(keyword, base64.b64encode(payload).decode("ascii"))
    if picture.mode not in ("RGB", "RGBA", "L", "LA", "P"):
        picture = picture.convert("RGBA")
    out = io.BytesIO()
    picture.save(out, format="PNG", pnginfo=info)
    return out.getvalue()
