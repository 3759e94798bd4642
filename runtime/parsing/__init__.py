"""Parsing stored files into one intermediate form: pages of text.

One serializer per format turns bytes into an :class:`Extract` (a list of pages);
:func:`serialize` writes it as text with a ``--- page N ---`` line before each page,
and :func:`pages_of` reads the pages back. Slicing knows only page numbers, never the
source format, so a new format needs only a new serializer registered in :func:`parse_document`.

Formats: plain text, Markdown and code (sections of about 6,000 characters), PDF
(pypdf; a page per page, the outline for the body start, scanned PDFs flagged), DOCX
(a page per level-1 section), PPTX (a page per slide), XLSX (a page per sheet), EPUB
(a page per spine document), ZIP (a catalog page, then the members' pages, recursively
to a depth limit). A section, sheet or chapter over 12,000 characters becomes several
pages headed ``[label, part k of n]``, so a bounded window reaches all of it.

Failures are explicit: corrupt, encrypted or unsupported bytes raise
:class:`~errors.FileParseError`, never an empty success.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from errors import FileParseError
from runtime.parsing._extract import MARKER, Extract, pages_of, serialize, unescape_page
from runtime.parsing._frontmatter import PageScore, is_front_matter_title, score_page, toc_body_start
from runtime.parsing._unpack import UnpackBudget

DEFAULT_ZIP_DEPTH = 2
"""``COMPANION_ZIP_DEPTH`` default: an archive inside an archive is read, one more level is not."""


@dataclass(frozen=True, kw_only=True)
class ParseLimits:
    """Bounds on one parse."""

    zip_depth: int = DEFAULT_ZIP_DEPTH
    """Archive nesting read: 1 reads the members of the uploaded ZIP, 2 also those of a ZIP inside it."""
    max_unpacked_bytes: int = 200 * 1024 * 1024
    """Most bytes one parse may unpack: all members of all ZIP containers in the file together
    (nested ZIPs, DOCX, XLSX, PPTX and EPUB included), bytes."""
    max_members: int = 10_000
    """Most archive members one parse may meet, all containers together."""
    max_ratio: float = 200.0
    """Largest unpacked/compressed ratio of one member over 1 MiB (ordinary text and XML compress
    10-30:1; ZIP bombs 1,000:1 and more)."""
    max_part_bytes: int = 64 * 1024 * 1024
    """Largest unpacked member, bytes: an Office XML part is parsed whole, so this bounds one parse step."""

    def budget(self) -> UnpackBudget:
        """A fresh budget for one parse."""
        return UnpackBudget(
            max_bytes=self.max_unpacked_bytes,
            max_members=self.max_members,
            max_ratio=self.max_ratio,
            max_part_bytes=self.max_part_bytes,
        )


_CODE_SUFFIXES = (
    ".py",
    ".js",
    ".ts",
    ".tsx",
    ".jsx",
    ".java",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".cs",
    ".go",
    ".rs",
    ".rb",
    ".php",
    ".swift",
    ".kt",
    ".scala",
    ".sh",
    ".bash",
    ".sql",
    ".json",
    ".yaml",
    ".yml",
    ".toml",
    ".ini",
    ".cfg",
    ".xml",
    ".html",
    ".htm",
    ".css",
    ".csv",
    ".tsv",
    ".log",
    ".txt",
    ".rst",
    ".tex",
    ".r",
    ".lua",
    ".pl",
    ".m",
)

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
EPUB = "application/epub+zip"


def format_of(data: bytes, *, name: str, mime: str | None = None) -> str:
    """The serializer to use: ``pdf``, ``docx``, ``pptx``, ``xlsx``, ``epub``, ``zip``,
    ``markdown``, ``text``, ``image`` (one page with no text layer) or ``binary`` (no serializer). The bytes decide over ``mime``
    and the name (a renamed PDF is still a PDF)."""
    from memory.file_names import sniff_mime

    sniffed = sniff_mime(data, name)
    lower = name.lower()
    by_mime = {
        "application/pdf": "pdf",
        DOCX: "docx",
        PPTX: "pptx",
        XLSX: "xlsx",
        EPUB: "epub",
        "application/zip": "zip",
    }
    if sniffed in by_mime and sniffed != "application/zip":
        return by_mime[sniffed]
    if data.startswith(b"PK\x03\x04") or data.startswith(b"PK\x05\x06"):
        # a damaged container: trust the name's extension so the error names the format
        for suffix in ("docx", "pptx", "xlsx", "epub"):
            if lower.endswith("." + suffix):
                return suffix
        return "zip"
    if lower.endswith((".md", ".markdown")) or (mime or "") == "text/markdown" or sniffed == "text/markdown":
        return "markdown"
    if sniffed.startswith("text/") or (mime or "").startswith("text/") or lower.endswith(_CODE_SUFFIXES):
        return "text"
    if sniffed in ("application/json", "application/xml", "application/javascript", "application/x-sh"):
        return "text"
    if sniffed.startswith("image/"):
        return "image"
    return "text"  # unknown: try UTF-8; decode_text fails clearly for binary data


def parse_document(
    data: bytes,
    *,
    name: str,
    mime: str | None = None,
    limits: ParseLimits | None = None,
    _depth: int = 0,
    _budget: UnpackBudget | None = None,
) -> Extract:
    """Parse ``data`` into pages and find where its body starts.

    The body start, in order of authority: the PDF outline's first body entry, then
    the table-of-contents heuristic over the first pages (``_frontmatter``), then the
    catalog page of containers (ZIP, EPUB navigation).

    Raises:
        FileParseError: corrupt, encrypted, unsupported, or ``too_large``: a ZIP container
            (nested ZIPs, DOCX, XLSX, PPTX, EPUB) past the unpack limits of :class:`ParseLimits`,
            which hold for the whole file, all nesting levels together.
    """
    limits = limits or ParseLimits()
    budget = _budget if _budget is not None else limits.budget()
    kind = format_of(data, name=name, mime=mime)
    if kind in ("docx", "pptx", "xlsx", "epub"):
        budget.check_container(data, name=name, kind=kind.upper())
    if kind == "pdf":
        from runtime.parsing._pdf import parse_pdf

        extract = parse_pdf(data, name=name)
    elif kind == "docx":
        from runtime.parsing._office import parse_docx

        extract = parse_docx(data, name=name)
    elif kind == "pptx":
        from runtime.parsing._office import parse_pptx

        extract = parse_pptx(data, name=name)
    elif kind == "xlsx":
        from runtime.parsing._office import parse_xlsx

        extract = parse_xlsx(data, name=name)
    elif kind == "epub":
        from runtime.parsing._epub import parse_epub

        extract = parse_epub(data, name=name)
    elif kind == "zip":
        from runtime.parsing._archive import parse_zip

        if _depth >= limits.zip_depth:
            raise FileParseError(
                f"{name}: an archive nested deeper than {limits.zip_depth} level(s) (COMPANION_ZIP_DEPTH); not unpacked.",
                reason="too_deep",
            )
        return parse_zip(
            data,
            name=name,
            budget=budget,
            parse_member=lambda content, member: parse_document(
                content, name=member, limits=limits, _depth=_depth + 1, _budget=budget
            ),
        )
    elif kind == "image":
        from runtime.parsing._image import parse_image

        extract = parse_image(data, name=name)
    elif kind == "binary":
        raise FileParseError(
            f"{name}: {mime or 'this format'} has no text serializer. "
            "Supported: text, Markdown, code, PDF, DOCX, PPTX, XLSX, EPUB, ZIP.",
            reason="unsupported",
        )
    else:
        from runtime.parsing._text import parse_text

        extract = parse_text(data, name=name, markdown=kind == "markdown")
    if extract.body_start_page is None and not extract.needs_ocr:
        start = toc_body_start(extract.pages)
        if start is not None:
            extract = replace(extract, body_start_page=start)
    return extract


__all__ = [
    "MARKER",
    "Extract",
    "PageScore",
    "ParseLimits",
    "UnpackBudget",
    "format_of",
    "is_front_matter_title",
    "pages_of",
    "parse_document",
    "score_page",
    "serialize",
    "toc_body_start",
    "unescape_page",
]
