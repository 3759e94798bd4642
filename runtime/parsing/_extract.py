"""The one intermediate form every format is serialized into.

A document is a list of pages; the stored extract joins them with a marker line
``--- page N ---`` (N from 1) before each page. Slicing (``runtime.files``)
knows only this: :func:`pages_of` gives the pages back, whatever the source format.
A page's own line that looks like a marker is escaped with a leading backslash by
:func:`serialize` and unescaped by :func:`pages_of`, so page text can never fake a page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MARKER = "--- page {n} ---"
"""The marker line before page ``n``."""

_MARKER_RE = re.compile(r"^--- page (\d+) ---$")
_ESCAPED_RE = re.compile(r"^(\\*)(--- page \d+ ---)$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Extract:
    """A parsed document: its pages' text and where its body starts."""

    pages: list[str] = field(default_factory=list)
    """One string per page: a PDF page, a slide, a sheet, a document section or an archive member."""
    body_start_page: int | None = None
    """First page after the front matter (1-based), if the parser found one; ``None``: from page 1."""
    needs_ocr: bool = False
    """True for a PDF whose pages have no text layer (scanned)."""

    @property
    def has_text(self) -> bool:
        return any(p.strip() for p in self.pages)


def serialize(extract: Extract | list[str]) -> str:
    """The extract text: ``--- page N ---`` before each page, pages separated by a blank line."""
    pages = extract.pages if isinstance(extract, Extract) else list(extract)
    parts = []
    for n, page in enumerate(pages, start=1):
        body = _ESCAPED_RE.sub(lambda m: "\\" + m.group(1) + m.group(2), page.strip("\n"))
        parts.append(f"{MARKER.format(n=n)}\n{body}")
    return "\n\n".join(parts) + ("\n" if parts else "")


def unescape_page(body: str) -> str:
    """A page's text as :func:`serialize` stored it (its marker line removed), unescaped."""
    return _ESCAPED_RE.sub(lambda m: m.group(1)[1:] + m.group(2), body.strip("\n"))


def pages_of(text: str | None) -> list[str]:
    """The pages of an extract text, in order (``[]`` for ``None`` or ``""``).

    A text without any marker is one page. Marker lines are recognised only when they
    carry the next page number in sequence, so ``--- page 9 ---`` quoted on page 2
    stays text.
    """
    if not text:
        return []
    lines = text.split("\n")
    first = _MARKER_RE.match(lines[0]) if lines else None
    if first is None or int(first.group(1)) != 1:
        return [text.strip("\n")]
    pages: list[list[str]] = []
    expected = 1
    for line in lines:
        m = _MARKER_RE.match(line)
        if m and int(m.group(1)) == expected:
            pages.append([])
            expected += 1
            continue
        pages[-1].append(line)
    out = []
    for page in pages:
        body = "\n".join(page).strip("\n")
        out.append(_ESCAPED_RE.sub(lambda m: m.group(1)[1:] + m.group(2), body))
    return out
