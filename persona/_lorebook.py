"""Lorebook entries (a card's ``character_book``, "world info") as typed values.

Field names follow the Character Card V2 spec (``character_book.entries[]``:
``keys``, ``content``, ``enabled``, ``insertion_order``, ``case_sensitive``,
``name``, ``priority``, ``id``, ``comment``, ``selective``, ``secondary_keys``,
``constant``) and its V3 successor. ``selectiveLogic`` is SillyTavern's extension
(``extensions.selectiveLogic``: 0 AND_ANY, 1 NOT_ALL, 2 NOT_ANY, 3 AND_ALL, the
numbers of SillyTavern's ``world_info_logic``). Matching lives in
``runtime/context/_lorebook.py``; this module only reads and checks.

Matching options and placement, from the entry's fields, SillyTavern's entry
``extensions`` or V3 decorators in the content (a decorator wins over a field):

- ``case_sensitive`` and ``match_whole_words`` (top level or ``extensions``), ``use_regex``
  (V3); every key is compiled at load time (``persona/_keys.py``), so a regex key that
  does not compile is a :class:`PersonaError` naming the entry.
- Placement: V2 ``position`` (``before_char``/``after_char``), SillyTavern's
  ``extensions.position`` (0 before the character, 4 at a depth in the chat with
  ``extensions.depth`` and ``extensions.role`` 0 system/1 user/2 assistant, the others
  after the character), V3 ``@@depth``, ``@@role``, ``@@position`` (``before_desc`` is
  before the character, the other positions after it).
- Scan depth: ``extensions.scan_depth`` or ``@@scan_depth``.
- Decorators are taken out of the content (``persona/_decorators.py``); those without
  meaning here are logged once per name (``lorebook.decorator_ignored``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload

import structlog

from errors import PersonaError
from persona._decorators import ROLES, parse_decorators
from persona._keys import CompiledKey, InvalidKeyError, compiled, is_regex_form

log = structlog.get_logger("companion.persona")

PLACEMENTS = ("before_char", "after_char", "depth")
"""Where an entry goes: in the retrieval block, first or in order, or inserted among the recent turns."""
_ST_ROLES = {0: "system", 1: "user", 2: "assistant"}

MAX_ENTRY_CHARS = 200_000
"""The longest entry content, characters (about 50k tokens: far over any retrieval budget)."""

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
    """True: literal keys match case-sensitively (default: case-insensitive)."""
    match_whole_words: bool | None = None
    """False: literal keys match inside words too ("Hogwart" in "Hogwarts"); default True."""
    use_regex: bool | None = None
    """False: a ``/pattern/flags`` key is literal text too; otherwise it is a regular expression."""
    name: str = ""
    """The entry's name or comment, for reports only (never sent to the model)."""
    placement: str = "after_char"
    """One of :data:`PLACEMENTS`."""
    depth: int = 4
    """With placement ``depth``: messages before the newest one to insert at (0: after it)."""
    role: str = "system"
    """With placement ``depth``: the inserted message's role."""
    scan_depth: int | None = None
    """The entry's own scan depth (turns before the current message); ``None``: the book's."""
    additional_keys: tuple[str, ...] = ()
    """``@@additional_keys``: one of these must be in the scanned text too."""
    exclude_keys: tuple[str, ...] = ()
    """``@@exclude_keys``: none of these may be in the scanned text."""
    activate: bool = False
    """``@@activate``: fires in any case."""
    dont_activate: bool = False
    """``@@dont_activate``: never fires (unless ``activate``)."""
    ignore_on_max_context: bool = False
    """``@@ignore_on_max_context``: the first left out when the budget is short."""


@dataclass(frozen=True, kw_only=True)
class Lorebook:
    """A character's lorebook."""

    entries: tuple[LoreEntry, ...]
    """Entries in the order the card lists them."""
    name: str = ""
    scan_depth: int | None = None
    """The card's own scan depth (turns before the current message); ``None``: the runtime's setting."""
    token_budget: int | None = None
    """The card's cap on its fired entries, tokens; ``None``: only the ``retrieval`` budget applies."""
    ignored_decorators: tuple[str, ...] = ()
    """Decorator names in the entries that the runtime does not act on (logged once each at load)."""


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
    """A whole number; ``null`` is ``default``, and a number written as a string (``"10"``,
    ``" 4.0 "``) is read as that number (logged, ``persona.field_coerced``).

    Raises:
        PersonaError: anything else (a word, a boolean, a list)."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            log.warning("persona.field_coerced", field=field, reading="a number written as a string")
            return int(number)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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
    if raw_entries is None:
        raw_entries = []
    if isinstance(raw_entries, Mapping):  # SillyTavern's world-info shape: entries keyed by uid
        log.warning("persona.field_coerced", field=f"{field}.entries", reading="an object keyed by uid as a list")
        raw_entries = [raw_entries[k] for k in sorted(raw_entries, key=_uid_order)]
    if not isinstance(raw_entries, list):
        raise PersonaError(
            f"Persona file {path!r}: {field}.entries must be a list.", path=path, field=f"{field}.entries"
        )
    entries = []
    ignored: Counter[str] = Counter()
    for i, raw in enumerate(raw_entries):
        entry, ignored_here = _entry(raw, where=f"{field}.entries[{i}]", path=path)
        entries.append(entry)
        ignored.update(ignored_here)
    for name, count in sorted(ignored.items()):
        log.warning("lorebook.decorator_ignored", decorator=name, entries=count, book=str(book.get("name") or ""))
    return Lorebook(
        entries=tuple(entries),
        name=str(book.get("name") or ""),
        scan_depth=_int(book.get("scan_depth"), field=f"{field}.scan_depth", path=path, default=None),
        token_budget=_budget(book.get("token_budget"), field=f"{field}.token_budget", path=path),
        ignored_decorators=tuple(sorted(ignored)),
    )


def _uid_order(uid: Any) -> tuple[int, float, str]:
    """Entries keyed by uid in number order (``"2"`` before ``"10"``), other keys after them as written."""
    try:
        return (0, float(uid), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(uid))


def _budget(value: Any, *, field: str, path: str) -> int | None:
    budget = _int(value, field=field, path=path, default=None)
    if budget is not None and budget <= 0:  # editors write 0 for "no budget of its own"
        return None
    return budget


def _bool(raw: Mapping[str, Any], ext: Mapping[str, Any], name: str) -> bool | None:
    value = raw.get(name, ext.get(name))
    return value if isinstance(value, bool) else None


def _placement(raw: Mapping[str, Any], ext: Mapping[str, Any], *, where: str, path: str) -> tuple[str, int, str]:
    """``(placement, depth, role)`` from the V2 ``position`` field and SillyTavern's extensions."""
    st_position = ext.get("position")
    depth = _int(ext.get("depth"), field=f"{where}.extensions.depth", path=path, default=4)
    raw_role = ext.get("role")
    role = (
        raw_role.lower()
        if isinstance(raw_role, str)
        else _ST_ROLES.get(raw_role if isinstance(raw_role, int) else -1, "system")
    )
    if role not in ROLES:
        role = "system"
    if isinstance(st_position, int) and not isinstance(st_position, bool):
        if st_position == 4:
            return "depth", max(depth or 0, 0), role
        return ("before_char" if st_position == 0 else "after_char"), 4, role
    return ("before_char" if raw.get("position") == "before_char" else "after_char"), 4, role


def _entry(raw: Any, *, where: str, path: str) -> tuple[LoreEntry, tuple[str, ...]]:
    """One entry and the names of its decorators that are not acted on."""
    if not isinstance(raw, Mapping):
        raise PersonaError(f"Persona file {path!r}: {where} must be an object.", path=path, field=where)
    content = raw.get("content")
    if not isinstance(content, str):
        raise PersonaError(
            f"Persona file {path!r}: {where}.content must be a string.", path=path, field=f"{where}.content"
        )
    if len(content) > MAX_ENTRY_CHARS:
        raise PersonaError(
            f"Persona file {path!r}: {where}.content is {len(content):,} characters; at most {MAX_ENTRY_CHARS:,}.",
            path=path,
            field=f"{where}.content",
        )
    found = raw.get("extensions")
    ext: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    content, deco = parse_decorators(content)
    keys = _str_list(raw.get("keys", raw.get("key")), field=f"{where}.keys", path=path)
    constant = bool(raw.get("constant", False))
    if not keys and not constant and not deco.activate:
        raise PersonaError(
            f"Persona file {path!r}: {where}.keys is empty and the entry is not constant, so it could never fire.",
            path=path,
            field=f"{where}.keys",
        )
    comment = raw.get("name") or raw.get("comment") or ""
    placement, depth, role = _placement(raw, ext, where=where, path=path)
    if deco.position is not None:
        placement = "before_char" if deco.position == "before_desc" else "after_char"
    if deco.depth is not None and deco.position is None:  # the spec: @@position wins over @@depth
        placement, depth = "depth", max(deco.depth, 0)
    scan_depth = (
        deco.scan_depth
        if deco.scan_depth is not None
        else _int(ext.get("scan_depth"), field=f"{where}.extensions.scan_depth", path=path, default=None)
    )
    entry = LoreEntry(
        keys=keys,
        content=content.strip(),
        secondary_keys=_str_list(
            raw.get("secondary_keys", raw.get("keysecondary")), field=f"{where}.secondary_keys", path=path
        ),
        selective=bool(raw.get("selective", False)),
        selective_logic=_logic(raw, field=where, path=path),
        constant=constant,
        enabled=bool(raw["enabled"]) if raw.get("enabled") is not None else not raw.get("disable"),
        insertion_order=_int(
            raw.get("insertion_order", raw.get("order")), field=f"{where}.insertion_order", path=path, default=100
        ),
        priority=_int(raw.get("priority"), field=f"{where}.priority", path=path, default=None),
        case_sensitive=_bool(raw, ext, "case_sensitive"),
        match_whole_words=_bool(raw, ext, "match_whole_words"),
        use_regex=_bool(raw, ext, "use_regex"),
        name=str(comment),
        placement=placement,
        depth=depth,
        role=deco.role or role,
        scan_depth=max(scan_depth, 0) if scan_depth is not None else None,
        additional_keys=deco.additional_keys,
        exclude_keys=deco.exclude_keys,
        activate=deco.activate,
        dont_activate=deco.dont_activate,
        ignore_on_max_context=deco.ignore_on_max_context,
    )
    for kind, values in (
        ("keys", entry.keys),
        ("secondary_keys", entry.secondary_keys),
        ("@@additional_keys", entry.additional_keys),
        ("@@exclude_keys", entry.exclude_keys),
    ):
        for j, key in enumerate(values):
            if entry.use_regex is False or not is_regex_form(key):
                continue  # a literal key is escaped: it always compiles, and compiles when first needed
            try:
                entry_keys(entry, (key,))
            except InvalidKeyError as exc:
                label = f"lorebook entry {entry.name!r}" if entry.name else "a lorebook entry"
                at = f"{where}.{kind.lstrip('@')}[{j}]"
                raise PersonaError(
                    f"Persona file {path!r}: {label} has a key that cannot be used, {at} = {key!r}: {exc}.",
                    path=path,
                    field=at,
                ) from exc
    return entry, deco.ignored


def entry_keys(entry: LoreEntry, keys: tuple[str, ...]) -> list[CompiledKey]:
    """``keys`` compiled under ``entry``'s options (see ``persona/_keys.py``).

    Raises:
        InvalidKeyError: a key that does not compile.
    """
    return [
        compiled(
            key,
            case_sensitive=bool(entry.case_sensitive),
            whole_words=entry.match_whole_words is not False,
            regex_allowed=entry.use_regex is not False,
        )
        for key in keys
    ]


_WORLD_INFO_EXTENSIONS = {
    "position": "position",
    "depth": "depth",
    "role": "role",
    "scanDepth": "scan_depth",
    "matchWholeWords": "match_whole_words",
}
"""SillyTavern World Info entry fields that a card's entry keeps in its ``extensions``."""


def world_info_entries(data: Any, *, path: str) -> list[dict[str, Any]]:
    """The entries of a SillyTavern World Info JSON (``{"entries": {"0": {...}, ...}}``: ``key``,
    ``keysecondary``, ``comment``, ``order``, ``disable``, ``position``, ``depth``, ...) in the
    shape of a card's ``character_book`` entries, in uid order.

    Raises:
        PersonaError: no ``entries`` object or list, or an entry that is not an object.
    """
    entries = data.get("entries") if isinstance(data, Mapping) else None
    if isinstance(entries, Mapping):
        entries = [entries[k] for k in sorted(entries, key=_uid_order)]
    if not isinstance(entries, list):
        raise PersonaError(
            f"World Info file {path!r} needs an 'entries' object (SillyTavern's World Info JSON).",
            path=path,
            field="entries",
        )
    converted = []
    for i, raw in enumerate(entries):
        if not isinstance(raw, Mapping):
            raise PersonaError(
                f"World Info file {path!r}: entries[{i}] must be an object.", path=path, field=f"entries[{i}]"
            )
        ext = {ours: raw[theirs] for theirs, ours in _WORLD_INFO_EXTENSIONS.items() if raw.get(theirs) is not None}
        entry: dict[str, Any] = {
            "keys": raw.get("key", raw.get("keys")),
            "secondary_keys": raw.get("keysecondary", raw.get("secondary_keys")),
            "comment": raw.get("comment") or "",
            "content": raw.get("content"),
            "constant": bool(raw.get("constant")),
            "selective": bool(raw.get("selective")),
            "selectiveLogic": raw.get("selectiveLogic"),
            "insertion_order": raw.get("order", raw.get("insertion_order")),
            "enabled": not raw.get("disable"),
            "case_sensitive": raw.get("caseSensitive"),
            "extensions": ext,
        }
        converted.append({k: v for k, v in entry.items() if v is not None})
    return converted


def load_world_info(path: str) -> tuple[Lorebook, dict[str, Any]]:
    """A SillyTavern World Info JSON file as a lorebook, checked as a card's book is, and as the
    ``character_book`` object a V2/V3 card holds (to put into a card).

    Raises:
        PersonaError: the file is missing, not JSON, or not World Info; a malformed entry (named).
    """
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise PersonaError(f"Cannot read World Info file {path!r}: {exc.strerror or exc}.", path=path) from exc
    except ValueError as exc:
        raise PersonaError(f"World Info file {path!r} is not valid JSON ({exc}).", path=path) from exc
    book = {
        "name": str(data.get("name") or "") if isinstance(data, Mapping) else "",
        "entries": world_info_entries(data, path=path),
    }
    return parse_lorebook(book, field="world_info", path=path) or Lorebook(entries=()), book
