"""Lorebook decorators (Character Card V3): ``@@name value`` lines in an entry's content.

A decorator is a line that starts with ``@@`` and a name (latin letters, digits and
``_``), then optionally a space and a value. A line starting with ``@@@`` is a
fallback for the decorator line above it: it is used only when that one is not
recognized (chains of fallbacks are read top to bottom). Only the first decorator of
a name counts, except ``@@additional_keys`` and ``@@exclude_keys``, which add up.
Every decorator line, recognized or not, is removed from the content, with the
blank lines around the decorator block, so none reaches the prompt.

Decorators the runtime acts on (see :class:`Decorators`): ``activate``,
``dont_activate``, ``depth``, ``role``, ``position``, ``scan_depth``,
``additional_keys``, ``exclude_keys``, ``ignore_on_max_context``. The spec's others
have no meaning here and are ignored (reported, so the loader logs each name once):
``instruct_depth``, ``reverse_depth``, ``reverse_instruct_depth`` and
``instruct_scan_depth`` are for prompts that are not chat logs, which the spec says
a chat-based application ignores; ``activate_only_after``, ``activate_only_every``,
``keep_activate_after_match`` and ``dont_activate_after_match`` need a record of
earlier activations the runtime does not keep; ``is_greeting``, ``is_user_icon`` and
``disable_ui_prompt`` concern greetings, icons and UI prompts the lorebook cannot see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LINE = re.compile(r"^(@@@?)([A-Za-z_][A-Za-z0-9_]*)(?:[ \t]+(.*?))?[ \t]*$")
ROLES = ("system", "user", "assistant")
POSITIONS = ("before_desc", "after_desc", "personality", "scenario")
"""``@@position`` values of the V3 spec."""
_FLAGS = ("activate", "dont_activate", "ignore_on_max_context")
_NUMBERS = ("depth", "scan_depth")
_LISTS = ("additional_keys", "exclude_keys")
KNOWN = (*_FLAGS, *_NUMBERS, *_LISTS, "role", "position")
"""Decorators the runtime acts on."""


@dataclass(frozen=True, kw_only=True)
class Decorators:
    """The decorators of one entry the runtime acts on (``None``/``False``/empty: not set)."""

    activate: bool = False
    """Fires in any case."""
    dont_activate: bool = False
    """Never fires, unless ``activate`` is set too."""
    depth: int | None = None
    """Insert the content among the recent turns, this many messages before the newest (0: after it)."""
    role: str | None = None
    """Role of the inserted message: ``system``, ``user`` or ``assistant``."""
    position: str | None = None
    """One of :data:`POSITIONS`."""
    scan_depth: int | None = None
    """This entry's own scan depth (turns before the current message)."""
    additional_keys: tuple[str, ...] = ()
    """The entry fires only if one of these is in the scanned text too."""
    exclude_keys: tuple[str, ...] = ()
    """The entry never fires if one of these is in the scanned text."""
    ignore_on_max_context: bool = False
    """Left out first when the budget is short."""
    ignored: tuple[str, ...] = field(default=())
    """Names of decorators present but not acted on (unknown, without meaning here, or with a bad value)."""


def _value(name: str, raw: str | None) -> object | None:
    """The parsed value of a known decorator, or ``None`` when the value is not valid for it."""
    if name in _FLAGS:
        return True
    if raw is None:
        return None
    raw = raw.strip()
    if name in _NUMBERS:
        try:
            return int(float(raw))
        except ValueError:
            return None
    if name in _LISTS:
        keys = tuple(k.strip() for k in raw.split(",") if k.strip())
        return keys or None
    if name == "role":
        return raw.lower() if raw.lower() in ROLES else None
    if name == "position":
        return raw if raw in POSITIONS else None
    return None


def parse_decorators(content: str) -> tuple[str, Decorators]:
    """``content`` without its decorator lines, and the decorators it held."""
    lines = content.splitlines()
    kept: list[str] = []
    values: dict[str, object] = {}
    ignored: list[str] = []
    group_done = True  # whether the current @@ line (and its fallbacks so far) found a decorator we use
    for line in lines:
        found = _LINE.match(line.strip()) if line.lstrip().startswith("@@") else None
        if found is None:
            kept.append(line)
            continue
        marks, name, raw = found.group(1), found.group(2).lower(), found.group(3)
        if marks == "@@":
            group_done = False
        elif group_done:  # a fallback whose original was used
            continue
        value = _value(name, raw) if name in KNOWN else None
        if value is None:
            ignored.append(name)
            continue
        group_done = True
        if name in _LISTS:
            values[name] = (*values.get(name, ()), *value)  # type: ignore[misc]
        elif name not in values:
            values[name] = value
    text = "\n".join(kept).strip("\n")
    used = set(values)
    return text, Decorators(**values, ignored=tuple(dict.fromkeys(n for n in ignored if n not in used)))  # type: ignore[arg-type]
