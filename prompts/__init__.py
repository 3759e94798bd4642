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


@functools.lru_cache(maxsize=1)
def _delimiter_pattern() -> re.Pattern[str]:
    names = "|".join(sorted((re.escape(t) for t in block_tags()), key=len, reverse=True))
    # "<", optional spaces, optional "/", optional spaces, a block name, then anything but a name character
    return re.compile(rf"<(\s*/?\s*(?:{names}))(?![\w-])", re.IGNORECASE)


LESS_THAN_FORMS = frozenset({"<", "\ufe64", "\uff1c"})
"""The characters whose compatibility form (NFKC) is ``<``: ASCII, SMALL LESS-THAN SIGN and
FULLWIDTH LESS-THAN SIGN (every code point checked; ``tests/test_reference_fences.py``)."""
_SCAN_LIMIT = 4096
"""Characters looked at after a ``<`` for the rest of a delimiter, format characters included."""


def _skeleton(text: str, start: int) -> str:
    """``text`` from ``start`` as a delimiter is matched: format characters (Unicode category Cf:
    ZERO WIDTH SPACE, WORD JOINER, SOFT HYPHEN ...) removed and compatibility forms folded (NFKC:
    ``＜／ｒｅｆｅｒｅｎｃｅ`` is ``</reference``), far enough to hold the longest delimiter."""
    longest = max((len(t) for t in block_tags()), default=0) + 2
    out: list[str] = []
    letters = 0
    for char in text[start : start + _SCAN_LIMIT]:
        if unicodedata.category(char) == "Cf":
            continue
        folded = unicodedata.normalize("NFKC", char)
        out.append(folded)
        letters += not folded.isspace()
        if letters > longest:
            break
    return "".join(out)


def fence(text: str) -> str:
    """``text`` made safe to put inside a block: every look-alike of a block's opening or
    closing delimiter (``</reference>``, ``< / SUMMARY``, ``<profile x=…``, and the same with
    format characters inside or written in full-width or small forms, ``<\u200b/reference>``,
    ``＜/reference＞``) has its ``<`` written as ``&lt;``, so reference material cannot end its
    block early or open a new one. Delimiters are matched as a reader of the prompt would see
    them: format characters (Cf) removed and compatibility forms folded (NFKC). Everything else
    is unchanged."""
    if not any(form in text for form in LESS_THAN_FORMS):
        return text
    pattern = _delimiter_pattern()
    pieces: list[str] = []
    last = 0
    for index, char in enumerate(text):
        if char in LESS_THAN_FORMS and pattern.match(_skeleton(text, index)):
            pieces.append(text[last:index] + "&lt;")
            last = index + 1
    return "".join(pieces) + text[last:] if pieces else text
