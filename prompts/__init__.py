"""Prompt templates, kept as files beside this module so they can be reviewed and versioned.

Templates use :class:`string.Template` placeholders (``$name``), so braces in
conversation text are never interpreted.
"""

from __future__ import annotations

import functools
import re
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


def fence(text: str) -> str:
    """``text`` made safe to put inside a block: every look-alike of a block's opening or
    closing delimiter (``</reference>``, ``< / SUMMARY``, ``<profile x=…``) has its ``<``
    written as ``&lt;``, so reference material cannot end its block early or open a new
    one. Everything else is unchanged."""
    return _delimiter_pattern().sub(lambda m: "&lt;" + m.group(1), text)
