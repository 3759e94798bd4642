"""Plain text, Markdown and code: decoded as UTF-8 and cut into sections of about
:data:`SECTION_CHARS` characters at line boundaries (Markdown prefers headings)."""

from __future__ import annotations

import re

from errors import FileParseError
from runtime.parsing._extract import Extract

SECTION_CHARS = 6000
"""Target size of one page (document section) of a text file, characters."""

_MD_HEADING = re.compile(r"^#{1,3}\s+\S")


def decode_text(data: bytes, *, name: str) -> str:
    """``data`` as text: UTF-8 (a BOM allowed), else UTF-16 with a BOM.

    Raises:
        FileParseError: ``unsupported`` for NUL bytes or bytes that are not UTF-8.
    """
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise FileParseError(
                f"{name}: not valid UTF-16 text ({exc.reason} at byte {exc.start}).", reason="corrupt"
            ) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileParseError(
            f"{name}: not a supported document and not UTF-8 text (invalid byte at offset {exc.start}). "
            "Supported: text, Markdown, code, PDF, DOCX, PPTX, XLSX, EPUB, ZIP.",
            reason="unsupported",
        ) from exc
    if "\x00" in text:
        raise FileParseError(
            f"{name}: binary data (NUL bytes) of no supported format. "
            "Supported: text, Markdown, code, PDF, DOCX, PPTX, XLSX, EPUB, ZIP.",
            reason="unsupported",
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_sections(text: str, *, markdown: bool = False, size: int = SECTION_CHARS) -> list[str]:
    """Cut ``text`` into pages of at most about ``size`` characters, at line boundaries.

    With ``markdown``, a heading line starts a new page once the current one is over a
    quarter full. A single line longer than ``size`` is cut at ``size``.
    """
    if not text.strip():
        return []
    pages: list[str] = []
    current: list[str] = []
    length = 0
    for line in text.split("\n"):
        while len(line) > size:
            if current:
                pages.append("\n".join(current))
                current, length = [], 0
            pages.append(line[:size])
            line = line[size:]
        heading_break = markdown and _MD_HEADING.match(line) and length > size // 4
        if current and (length + len(line) + 1 > size or heading_break):
            pages.append("\n".join(current))
            current, length = [], 0
        current.append(line)
        length += len(line) + 1
    if current:
        pages.append("\n".join(current))
    return [p.strip("\n") for p in pages if p.strip()]


LONG_UNIT_CHARS = 2 * SECTION_CHARS
"""A sheet, DOCX section or EPUB chapter longer than this many characters is split into
pages of about that size, so a bounded ``file_read`` window can still reach all of it."""


def split_unit(text: str, label: str) -> list[str]:
    """One source unit (a sheet, section or chapter) as one page, or, when longer than
    :data:`LONG_UNIT_CHARS`, as several pages each headed ``[label, part k of n]``."""
    if len(text) <= LONG_UNIT_CHARS:
        return [text]
    parts = split_sections(text, size=LONG_UNIT_CHARS)
    return [f"[{label}, part {k} of {len(parts)}]\n{part}" for k, part in enumerate(parts, start=1)]


def parse_text(data: bytes, *, name: str, markdown: bool = False) -> Extract:
    return Extract(pages=split_sections(decode_text(data, name=name), markdown=markdown))
