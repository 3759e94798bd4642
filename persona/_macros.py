"""Macros (``{{...}}``) in a card's own fields: what the Character Card V2/V3 specs and
SillyTavern's documented macro set define for them.

Syntax (SillyTavern's): names are case-insensitive and spaces around names and
separators are ignored; arguments follow ``::`` (``{{random::a::b}}``), a single ``:``
(legacy, ``{{random:a,b}}``; with a ``:`` and no ``::`` the list is split on commas,
``\\,`` keeping a comma, as the V3 spec writes it) or a space (``{{roll 1d20}}``). Inner
macros are replaced first (``{{random::{{user}}::{{char}}}}``). ``\\{\\{`` and ``\\}\\}``
stand for literal braces. A macro not listed here, or with arguments that do not fit,
is left exactly as written.

=========================================  ==================================================
``{{char}}``, ``<BOT>``, ``<CHAR>``         the card's ``nickname`` if set, else its ``name`` (V3)
``{{user}}``, ``<USER>``                    the user's name
``{{group}}``, ``{{groupNotMuted}}``,        the character (a chat here has one character)
``{{charIfNotGroup}}``
``{{notChar}}``                             the user (everyone but the character)
``{{original}}``                            in ``system_prompt``: the framing the runtime uses when a
                                            card has none; elsewhere nothing (V2 spec)
``{{description}}``, ``{{personality}}``,    the card's field of that name (its macros replaced)
``{{scenario}}``, ``{{charPrompt}}``,
``{{charInstruction}}``,
``{{charCreatorNotes}}``, ``{{charVersion}}``,
``{{mesExamples}}``, ``{{mesExamplesRaw}}``
``{{charFirstMessage}}`` (``::N``)          the first message, or alternate greeting N (1-based)
``{{random::a::b}}``, ``{{random:a,b}}``    one of the options, drawn anew at each use
``{{pick::a::b}}``                          one of the options, the same every time in one session
                                            for the same field and place (a hash of both)
``{{roll:d6}}``, ``{{roll::2d6+3}}``        a dice roll: N (= 1dN), dM, NdM, with + or - K
``{{reverse:A}}``                           ``A`` reversed (V3)
``{{// A}}``, ``{{comment: A}}``,            nothing (V3: never shown to the model); the block form
``{{hidden_key: A}}``, ``{{noop}}``          ``{{//}} ... {{///}}`` too
``{{newline}}`` (``::N``), ``{{space}}``    a newline, a space (N of them)
(``::N``)
``{{trim}}``                                nothing, and the newlines around it go too
=========================================  ==================================================

Clock macros (``{{time}}``, ``{{date}}``, ``{{weekday}}``, ``{{isodate}}``, ``{{isotime}}``,
``{{datetimeformat FORMAT}}``, ``{{idle_duration}}``: :mod:`persona._clock_macros`) become the
turn's time on the user's clock when the context has one (``now``); with ``clock_note`` they
become a stable pointer to a short clock note instead, and their names are recorded, so that the
text they sit in stays the same from turn to turn (the prompt-cache rule of
``docs/personas.md``). Without ``now`` they are left as written.

Left as written on purpose: chat-state macros (``{{lastMessage}}``, ``{{input}}``,
variables, ``{{if}}``) and runtime-state macros (``{{model}}``, ``{{maxPrompt}}``, ...): their
values are not part of the card.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from persona._clock_macros import CLOCK_MACROS, clock_value

_INNER = re.compile(r"\{\{((?:(?!\{\{|\}\}).)*)\}\}", re.DOTALL)
"""A macro with no macro inside it."""
_BLOCK_COMMENT = re.compile(r"\{\{\s*//\s*\}\}.*?\{\{\s*///\s*\}\}", re.DOTALL)
_LEGACY_CHAR = re.compile(r"<(?:BOT|CHAR)>", re.IGNORECASE)
_LEGACY_USER = re.compile(r"<USER>", re.IGNORECASE)
_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*(.*)$", re.DOTALL)
_DICE = re.compile(r"^\s*(\d*)\s*(?:[dD]\s*(\d+))?\s*(?:([+-])\s*(\d+))?\s*$")
# placeholders while expanding (private-use characters, never in card text we keep)
_KEEP = "\ue000"
"""Marks a macro left as written, by index."""
_KEPT = re.compile(_KEEP + r"(\d+)" + _KEEP)
_TRIM = "\ue001"
_LBRACE, _RBRACE = "\ue002", "\ue003"
_TRIM_AROUND = re.compile(r"(?:\r?\n)*" + _TRIM + r"(?:\r?\n)*")
MAX_DEPTH = 4
"""How deep field macros (``{{description}}`` inside ``system_prompt`` ...) are followed."""
MAX_REPEAT = 1000
"""Most newlines or spaces one ``{{newline::N}}``/``{{space::N}}`` writes."""
MAX_DICE = 1000
"""Most dice and sides one ``{{roll}}`` takes; larger rolls are left as written."""


class _Rng(Protocol):
    def choice(self, seq: Sequence[str]) -> str: ...
    def randint(self, a: int, b: int) -> int: ...


@dataclass(frozen=True, kw_only=True)
class MacroContext:
    """What the macros of one card resolve to."""

    char: str
    """What ``{{char}}`` becomes: the card's nickname, else its name."""
    user: str
    """What ``{{user}}`` becomes."""
    session: str = ""
    """Seeds ``{{pick}}``: the same session, field and place give the same choice."""
    original: str = ""
    """What ``{{original}}`` becomes in ``system_prompt``."""
    fields: Mapping[str, str] = field(default_factory=dict)
    """Raw card fields by macro name in lower case (``description``, ``charprompt``, ...)."""
    greetings: tuple[str, ...] = ()
    """The first message, then the alternate greetings (for ``{{charFirstMessage::N}}``)."""
    rng: random.Random | None = None
    """For ``{{random}}`` and ``{{roll}}``; ``None``: the module's shared generator."""
    now: datetime | None = None
    """The turn's time on the user's clock (aware, in their zone), for the clock macros; ``None``:
    they are left as written."""
    idle: timedelta | None = None
    """Time since the user's message before this one, for ``{{idle_duration}}``."""
    clock_note: bool = False
    """Clock macros become a stable pointer to the clock note (their names go to ``clock_used``)."""
    clock_used: list[str] = field(default_factory=list)
    """Clock macros met with ``clock_note`` set, in order (filled while expanding)."""


def apply_macros(text: str, *, char: str, user: str, **context: Any) -> str:
    """``text`` with its macros replaced (see the module docstring for the set).

    ``{{char}}`` becomes ``char`` and ``{{user}}`` becomes ``user``; the other
    keyword arguments are :class:`MacroContext` fields, and ``field`` (keyword) names
    the card field ``text`` comes from (``system_prompt``, ``lore:3`` ...), which
    decides ``{{original}}`` and seeds ``{{pick}}``.
    """
    where = context.pop("field", "")
    return expand(text, MacroContext(char=char, user=user, **context), field=where)


def expand(text: str, ctx: MacroContext, *, field: str = "", depth: int = 0) -> str:
    """``text`` with its macros replaced under ``ctx``; ``field`` as in :func:`apply_macros`."""
    if "{{" not in text and "<" not in text and "\\{" not in text:
        return text
    text = text.replace("\\{\\{", _LBRACE + _LBRACE).replace("\\}\\}", _RBRACE + _RBRACE)
    text = _BLOCK_COMMENT.sub("", text)
    text = _LEGACY_CHAR.sub(lambda _: ctx.char, text)
    text = _LEGACY_USER.sub(lambda _: ctx.user, text)
    kept: list[str] = []
    rng: _Rng = ctx.rng or random
    seen = [0]  # macros met so far: a place in the field that random values before it do not move

    def one(found: re.Match[str]) -> str:
        seen[0] += 1
        value = _resolve(found.group(1), ctx, field=field, depth=depth, at=seen[0], rng=rng)
        if value is None:
            kept.append(found.group(0))
            return f"{_KEEP}{len(kept) - 1}{_KEEP}"
        return value

    while True:
        replaced = _INNER.sub(one, text)
        if replaced == text:
            break
        text = replaced
    for _ in range(len(kept)):  # macros left as written; an outer one may hold inner ones
        restored = _KEPT.sub(lambda m: kept[int(m.group(1))], text)
        if restored == text:
            break
        text = restored
    text = _TRIM_AROUND.sub("", text)
    return text.replace(_LBRACE, "{").replace(_RBRACE, "}")


def _args(rest: str) -> list[str]:
    """The arguments after a macro's name: ``::a::b``, ``:a,b`` or `` a``."""
    rest = rest.strip()
    if rest.startswith("::"):
        body = rest[2:]
        return [a.strip() for a in body.split("::")] if "::" in body else _commas(body)
    if rest.startswith(":"):
        return _commas(rest[1:])
    return [rest] if rest else []


def _commas(body: str) -> list[str]:
    parts = re.split(r"(?<!\\),", body)
    return [p.replace("\\,", ",").strip() for p in parts]


def _resolve(inner: str, ctx: MacroContext, *, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    """The value of one macro (``inner`` is the text between the braces), ``None`` to leave it."""
    stripped = inner.strip()
    if stripped.startswith("//"):
        return ""
    found = _NAME.match(inner)
    if found is None:
        return None
    name, rest = found.group(1).lower(), found.group(2)
    handler = _HANDLERS.get(name)
    if handler is None:
        return None
    return handler(_args(rest), rest, ctx, field, depth, at, rng)


_Handler = Callable[[list[str], str, MacroContext, str, int, int, _Rng], "str | None"]


def _simple(value: Callable[[MacroContext, str], str]) -> _Handler:
    def handle(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
        return value(ctx, field) if not args else None

    return handle


def _card_field(key: str) -> _Handler:
    def handle(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
        if args or depth >= MAX_DEPTH:
            return None
        return expand(ctx.fields.get(key, ""), ctx, field=key, depth=depth + 1)

    return handle


def _random(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    return rng.choice(args) if args else None


def _pick(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    if not args:
        return None
    digest = hashlib.sha256(f"{ctx.session}\x00{field}\x00{at}\x00{rest}".encode()).digest()
    return args[int.from_bytes(digest[:8], "big") % len(args)]


def _roll(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    if len(args) != 1:
        return None
    found = _DICE.match(args[0])
    if found is None or not (found.group(1) or found.group(2)):
        return None
    count_text, sides_text, sign, bonus = found.groups()
    if sides_text is None:  # "6" means one d6
        count, sides = 1, int(count_text)
    else:
        count, sides = int(count_text or 1), int(sides_text)
    if not (1 <= count <= MAX_DICE and 1 <= sides <= MAX_DICE * 1000):
        return None
    total = sum(rng.randint(1, sides) for _ in range(count))
    if sign:
        total += int(bonus) if sign == "+" else -int(bonus)
    return str(total)


def _repeat(char: str) -> _Handler:
    def handle(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
        if not args:
            return char
        if len(args) == 1 and args[0].isdigit() and int(args[0]) <= MAX_REPEAT:
            return char * int(args[0])
        return None

    return handle


def _reverse(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    return args[0][::-1] if len(args) == 1 else None


def _first_message(
    args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng
) -> str | None:
    if depth >= MAX_DEPTH:
        return None
    index = 0
    if args:
        if len(args) != 1 or not args[0].isdigit() or int(args[0]) >= len(ctx.greetings):
            return None
        index = int(args[0])
    text = ctx.greetings[index] if ctx.greetings else ""
    return expand(text, ctx, field="first_mes" if index == 0 else f"alternate_greetings[{index - 1}]", depth=depth + 1)


CLOCK_POINTER = "(see the clock note)"
"""What a clock macro becomes in text that must not change from turn to turn (``clock_note``)."""


def _clock(name: str) -> _Handler:
    def handle(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
        if ctx.now is None:
            return None
        value = clock_value(name, args, ctx.now, ctx.idle)
        if value is None or not ctx.clock_note:
            return value
        if name not in ctx.clock_used:
            ctx.clock_used.append(name)
        return CLOCK_POINTER

    return handle


def _empty(args: list[str], rest: str, ctx: MacroContext, field: str, depth: int, at: int, rng: _Rng) -> str | None:
    return ""


_HANDLERS: dict[str, _Handler] = {
    "char": _simple(lambda ctx, field: ctx.char),
    "user": _simple(lambda ctx, field: ctx.user),
    "group": _simple(lambda ctx, field: ctx.char),
    "groupnotmuted": _simple(lambda ctx, field: ctx.char),
    "charifnotgroup": _simple(lambda ctx, field: ctx.char),
    "notchar": _simple(lambda ctx, field: ctx.user),
    "original": _simple(lambda ctx, field: ctx.original if field == "system_prompt" else ""),
    "noop": _simple(lambda ctx, field: ""),
    "trim": _simple(lambda ctx, field: _TRIM),
    "newline": _repeat("\n"),
    "space": _repeat(" "),
    "random": _random,
    "pick": _pick,
    "roll": _roll,
    "reverse": _reverse,
    "comment": _empty,
    "hidden_key": _empty,
    "charfirstmessage": _first_message,
    **{name: _clock(name) for name in CLOCK_MACROS},
    **{
        name: _card_field(name)
        for name in (
            "description",
            "personality",
            "scenario",
            "charprompt",
            "charinstruction",
            "charcreatornotes",
            "charversion",
            "mesexamples",
            "mesexamplesraw",
        )
    },
}
