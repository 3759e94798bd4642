"""Prompt templates, kept as files beside this module so they can be reviewed and versioned.

Templates use :class:`string.Template` placeholders (``$name``), so braces in
conversation text are never interpreted.
"""

from __future__ import annotations

import functools
from pathlib import Path
from string import Template

TEMPLATE_DIR = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def template(name: str) -> Template:
    """The template ``prompts/<name>.txt``. Raises ``FileNotFoundError`` for an unknown name."""
    return Template((TEMPLATE_DIR / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n"))


def render(name: str, **values: object) -> str:
    """Render ``prompts/<name>.txt`` with ``values``; a missing value raises ``KeyError``."""
    return template(name).substitute({k: str(v) for k, v in values.items()})
