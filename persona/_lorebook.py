"""Lorebook entries (a card's ``character_book``, "world info") as typed values.

Field names follow the Character Card V2 spec (``character_book.entries[]``:
``keys``, ``content``, ``enabled``, ``insertion_order``, ``case_sensitive``,
``name``, ``priority``, ``id``, ``comment``, ``selective``, ``secondary_keys``,
``constant``) and its V3 successor. ``selectiveLogic`` is SillyTavern's extension
(``extensions.selectiveLogic``: 0 AND_ANY, 1 NOT_ALL, 2 NOT_ANY, 3 AND_ALL, the
numbers of SillyTavern's ``world_info_logic``). Matching lives in
``runtime/lorebook.py``; this module only reads and checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, overload

from errors import PersonaError

SELECTIVE_LOGICS = ("AND_ANY", "NOT_ALL", "NOT_ANY", "AND_ALL")
"""Secondary-key logics, indexed by SillyTavern's numbers (0..3)."""


@dataclass(frozen=True, kw_only=True)
class LoreEntry:
    """One lorebook entry."""

    keys: tuple[str, ...]
    """Primary keys: the entry fires when one of them appears in the scanned text."""
    content: str
    """The text inserted into the prompt (macros not yet replaced)."""
    secondary_keys: tuple[str, ...] = ()
    """With ``selective``: keys checked under :attr:`selective_logic`."""
    selective: bool = False
    """True: a primary key alone is not enough; the secondary keys must agree too."""
    selective_logic: str = "AND_ANY"
    """One of :data:`SELECTIVE_LOGICS`."""
    constant: bool = False
    """True: always inserted, keys or not."""
    enabled: bool = True
    """False: never inserted."""
    insertion_order: int = 100
    """Lower comes first in the prompt (V2 spec)."""
    priority: int | None = None
    """When the budget is short, entries with a lower priority are left out first (V2 spec)."""
    case_sensitive: bool | None = None
    """True: Latin keys match case-sensitively (default: case-insensitive)."""
    name: str = ""
    """The entry's name or comment, for reports only (never sent to the model)."""


@dataclass(frozen=True, kw_only=True)
class Lorebook:
    """A character's lorebook."""

    entries: tuple[LoreEntry, ...]
    """Entries in the order the card lists them."""
    name: str = ""
    scan_depth: int | None = None
    """The card's own scan depth (turns before the current message); ``None``: the runtime's setting."""


def _str_list(value: Any, *, field: str, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # some editors write one key as a string, or comma-separated
        value = [v for v in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PersonaError(f"Persona file {path!r}: {field} must be a list of strings.", path=path, field=field)
    return tuple(v.strip() for v in value if v.strip())


@overload
def _int(value: Any, *, field: str, path: str, default: int) -> int: ...
@overload
def _int(value: Any, *, field: str, path: str, default: None) -> int | None: ...
def _int(value: Any, *, field: str, path: str, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PersonaError(f"Persona file {path!r}: {field} must be a number, got {value!r}.", path=path, field=field)
    return int(value)


def _logic(entry: Mapping[str, Any], *, field: str, path: str) -> str:
    extensions = entry.get("extensions")
    ext: Mapping[str, Any] = extensions if isinstance(extensions, Mapping) else {}
    raw = entry.get("selectiveLogic", ext.get("selectiveLogic", ext.get("selective_logic")))
    if raw is None:
        return "AND_ANY"
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(SELECTIVE_LOGICS):
        return SELECTIVE_LOGICS[raw]
    if isinstance(raw, str) and raw.upper() in SELECTIVE_LOGICS:
        return raw.upper()
    raise PersonaError(
        f"Persona file {path!r}: {field}.selectiveLogic must be 0-3 or one of {SELECTIVE_LOGICS}, got {raw!r}.",
        path=path,
        field=f"{field}.selectiveLogic",
    )


def parse_lorebook(book: Any, *, field: str, path: str) -> Lorebook | None:
    """Read a ``character_book`` object (``None`` → ``None``).

    Raises:
        PersonaError: a malformed book or entry; ``field`` names it, e.g.
            ``data.character_book.entries[3].keys``.
    """
    if book is None:
        return None
    if not isinstance(book, Mapping):
        raise PersonaError(f"Persona file {path!r}: {field} must be an object.", path=path, field=field)
    raw_entries = book.get("entries", [])
    if not isinstance(raw_entries, list):
        raise PersonaError(f"Persona file {path!r}: {field}.entries must be a list.", path=path, field=f"{field}.entries")
    entries = []
    for i, raw in enumerate(raw_entries):
        where = f"{field}.entries[{i}]"
        if not isinstance(raw, Mapping):
            raise PersonaError(f"Persona file {path!r}: {where} must be an object.", path=path, field=where)
        content = raw.get("content")
        if not isinstance(content, str):
            raise PersonaError(f"Persona file {path!r}: {where}.content must be a string.", path=path, field=f"{where}.content")
        keys = _str_list(raw.get("keys", raw.get("key")), field=f"{where}.keys", path=path)
        constant = bool(raw.get("constant", False))
        if not keys and not constant:
            raise PersonaError(
                f"Persona file {path!r}: {where}.keys is empty and the entry is not constant, so it could never fire.",
                path=path,
                field=f"{where}.keys",
            )
        comment = raw.get("name") or raw.get("comment") or ""
        entries.append(
            LoreEntry(
                keys=keys,
                content=content.strip(),
                secondary_keys=_str_list(raw.get("secondary_keys", raw.get("keysecondary")), field=f"{where}.secondary_keys", path=path),
                selective=bool(raw.get("selective", False)),
                selective_logic=_logic(raw, field=where, path=path),
                constant=constant,
                enabled=bool(raw.get("enabled", not raw.get("disable", False))),
                insertion_order=_int(raw.get("insertion_order", raw.get("order")), field=f"{where}.insertion_order", path=path, default=100),
                priority=_int(raw.get("priority"), field=f"{where}.priority", path=path, default=None),
                case_sensitive=raw.get("case_sensitive") if isinstance(raw.get("case_sensitive"), bool) else None,
                name=str(comment),
            )
        )
    return Lorebook(
        entries=tuple(entries),
        name=str(book.get("name") or ""),
        scan_depth=_int(book.get("scan_depth"), field=f"{field}.scan_depth", path=path, default=None),
    )
