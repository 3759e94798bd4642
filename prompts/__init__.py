"""Prompt templates, kept as files beside this module so they can be reviewed and versioned.

Templates use :class:`string.Template` placeholders (``$name``), so braces in
conversation text are never interpreted.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path
from string import Template

TEMPLATE_DIR = Path(__file__).resolve().parent


@functools.cache
def template(name: str) -> Template:
    """The template ``prompts/<name>.txt``. Raises ``FileNotFoundError`` for an unknown name."""
    return Template((TEMPLATE_DIR / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n"))


def render(name: str, **values: object) -> str:
    """Render ``prompts/<name>.txt`` with ``values``; a missing value raises ``KeyError``."""
    return template(name).substitute({k: str(v) for k, v in values.items()})


@functools.lru_cache(maxsize=1)
def block_tags() -> frozenset[str]:
    """The names of the blocks the templates open at the start of a line (``<reference …>``,
    ``<summary …>``, ``<profile …>``, ``<file_content …>``): the delimiters text put inside
    a block must never imitate."""
    tags: set[str] = set()
    for path in TEMPLATE_DIR.glob("*.txt"):
        tags.update(re.findall(r"^<([A-Za-z_][\w-]*)[\s>]", path.read_text(encoding="utf-8"), flags=re.MULTILINE))
    return frozenset(tags)


LESS_THAN_FORMS = frozenset({"<", "\ufe64", "\uff1c"})
"""The characters whose compatibility form (NFKC) is ``<``: ASCII, SMALL LESS-THAN SIGN and
FULLWIDTH LESS-THAN SIGN (every code point checked; ``tests/test_reference_fences.py``)."""
_SKIP = "\ue010"
"""What a format character (Unicode category Cf) becomes in the folded text: a place the
delimiter pattern skips, so that the folded text keeps every character's position."""


class _Folding(dict[int, str]):
    """``str.translate`` table, filled as characters are met: a format character (Cf) to
    :data:`_SKIP`, a character whose NFKC form is one character to that character (``Ｒ`` to
    ``R``, ``＜`` to ``<``), any other character to itself. One character for one."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if unicodedata.category(char) == "Cf":
            value = _SKIP
        else:
            folded = unicodedata.normalize("NFKC", char)
            value = folded if len(folded) == 1 else char
        self[code] = value
        return value


_FOLDING = _Folding()


@functools.lru_cache(maxsize=1)
def _delimiter_pattern() -> re.Pattern[str]:
    """A block's opening or closing delimiter in folded text: ``<``, spaces, an optional ``/``,
    spaces, a block name (format characters allowed anywhere in it), then no name character."""
    skip = f"[\\s{_SKIP}]*"
    names = "|".join(f"{_SKIP}*".join(re.escape(c) for c in tag) for tag in sorted(block_tags(), key=len, reverse=True))
    return re.compile(rf"<{skip}/?{skip}(?:{names})(?!{_SKIP}*[\w-])", re.IGNORECASE)


def fence(text: str) -> str:
    """``text`` made safe to put inside a block: every look-alike of a block's opening or
    closing delimiter (``</reference>``, ``< / SUMMARY``, ``<profile x=…``, and the same with
    format characters inside or written in full-width or small forms, ``<\u200b/reference>``,
    ``＜/reference＞``) has its ``<`` written as ``&lt;``, so reference material cannot end its
    block early or open a new one. Delimiters are matched as a reader of the prompt would see
    them: format characters (Cf) removed and compatibility forms folded (NFKC), on a folded copy
    that keeps every character's position (``str.translate``, one character for one). Everything
    else is unchanged."""
    if not any(form in text for form in LESS_THAN_FORMS):
        return text
    starts = [m.start() for m in _delimiter_pattern().finditer(text.translate(_FOLDING))]
    if not starts:
        return text
    pieces, last = [], 0
    for start in starts:
        pieces.append(text[last:start] + "&lt;")
        last = start + 1
    return "".join(pieces) + text[last:]
