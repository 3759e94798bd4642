"""EPUB with ebooklib: one page per spine document, in reading order. The navigation
document (the book's catalog) is kept as page 1 when it is in the spine, and the body
starts after it and any front matter named so in the table of contents."""

from __future__ import annotations

import os
import tempfile
import zipfile

from errors import FileParseError
from runtime.parsing._extract import Extract
from runtime.parsing._frontmatter import is_front_matter_title
from runtime.parsing._text import split_unit


def html_text(content: bytes) -> str:
    """The visible text of an (X)HTML document, one line per block."""
    import lxml.html

    if not content.strip():
        return ""
    try:
        root = lxml.html.document_fromstring(content)
    except (ValueError, lxml.etree.ParserError):
        return ""
    for bad in root.xpath("//script|//style|//head"):
        bad.drop_tree()
    for block in root.xpath("//p|//div|//li|//h1|//h2|//h3|//h4|//h5|//h6|//br|//tr|//section"):
        block.tail = "\n" + (block.tail or "")
    text = root.text_content()
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


EPUB_ERRORS = (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, IndexError, OSError, SyntaxError)
"""Plain exceptions ebooklib lets escape on damaged books, besides its own ``EpubException``
(lxml's XMLSyntaxError is a SyntaxError)."""


def parse_epub(data: bytes, *, name: str) -> Extract:
    """Raises FileParseError: ``corrupt`` for a damaged or non-EPUB container."""
    from ebooklib import epub

    fd, tmp = tempfile.mkstemp(suffix=".epub")  # ebooklib reads from a path
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            book = epub.read_epub(tmp, options={"ignore_ncx": True})
            return _pages(book)
        except (epub.EpubException, *EPUB_ERRORS) as exc:
            raise FileParseError(
                f"{name}: the EPUB is corrupt or unreadable ({type(exc).__name__}: {exc}).", reason="corrupt"
            ) from exc
    finally:
        os.unlink(tmp)


def _pages(book) -> Extract:
    import ebooklib
    from ebooklib import epub

    pages: list[str] = []
    kinds: list[str] = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() not in (ebooklib.ITEM_DOCUMENT, ebooklib.ITEM_NAVIGATION):
            continue
        is_nav = isinstance(item, epub.EpubNav) or "nav" in (getattr(item, "properties", None) or [])
        text = html_text(item.get_content())
        if not text:
            continue
        first = text.split("\n", 1)[0]
        parts = split_unit(text, first[:60] or idref)
        pages.extend(parts)
        kinds.extend(["front" if is_nav or is_front_matter_title(first) else "body"] * len(parts))
    start = None
    if "front" in kinds and "body" in kinds:
        first_body = kinds.index("body")
        start = first_body + 1 if first_body > 0 else None
    return Extract(pages=pages, body_start_page=start)
