"""PDF with pypdf: one page per PDF page, the outline for where the body starts, and
scanned PDFs (pages but no text layer) flagged as needing OCR."""

from __future__ import annotations

import io
import logging

from errors import FileParseError
from runtime.parsing._extract import Extract
from runtime.parsing._frontmatter import is_front_matter_title

OCR_MIN_CHARS_PER_PAGE = 10
"""Fewer extracted characters than this per page, on average, means "no text layer"."""


MALFORMED = (
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    IndexError,
    OSError,
    AssertionError,
    RecursionError,
    ZeroDivisionError,
    UnicodeError,
    NotImplementedError,
)
"""Plain exceptions pypdf lets escape on malformed objects (besides its own ``PyPdfError`` family)."""


def map_pdf_error(exc: BaseException, name: str) -> FileParseError:
    """The one place pypdf errors become :class:`FileParseError`: password and crypto
    errors are ``encrypted``, pypdf's resource limits (decompression bombs) ``too_large``,
    everything else ``corrupt``."""
    from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError, WrongPasswordError

    if isinstance(exc, (FileNotDecryptedError, WrongPasswordError, DependencyError)):
        return FileParseError(
            f"{name}: the PDF is encrypted and cannot be opened ({exc}). Upload an unencrypted copy.",
            reason="encrypted",
        )
    if isinstance(exc, LimitReachedError):
        return FileParseError(f"{name}: the PDF exceeds a safety limit while unpacking ({exc}).", reason="too_large")
    return FileParseError(f"{name}: the PDF is corrupt or unreadable ({type(exc).__name__}: {exc}).", reason="corrupt")


def parse_pdf(data: bytes, *, name: str) -> Extract:
    """Raises FileParseError: ``encrypted`` (a password is needed), ``corrupt`` or ``too_large``."""
    import pypdf
    from pypdf.errors import DependencyError, PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileParseError(
                f"{name}: the PDF is password-protected. Upload a copy without the password.", reason="encrypted"
            )
        pages = [_page_text(p) for p in reader.pages]
        outline_start = _outline_body_start(reader)
        has_images = any(_has_image(p) for p in reader.pages[:5])
    except FileParseError:
        raise
    except (PyPdfError, DependencyError, *MALFORMED) as exc:
        raise map_pdf_error(exc, name) from exc
    if not pages:
        raise FileParseError(f"{name}: the PDF has no pages.", reason="corrupt")
    chars = sum(len(p.strip()) for p in pages)
    needs_ocr = chars < OCR_MIN_CHARS_PER_PAGE * len(pages) and (has_images or chars == 0)
    if needs_ocr:
        pages = ["" if len(p.strip()) < OCR_MIN_CHARS_PER_PAGE else p for p in pages]
    return Extract(pages=pages, body_start_page=outline_start, needs_ocr=needs_ocr)


def _page_text(page) -> str:
    text = page.extract_text() or ""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).strip("\n")


def _has_image(page) -> bool:
    try:
        resources = page.get("/Resources") or {}
        xobjects = resources.get("/XObject") or {}
        return any(xobjects[k].get_object().get("/Subtype") == "/Image" for k in xobjects)
    except Exception:  # a malformed resource dictionary only means "no image seen"
        return False


def _outline_body_start(reader) -> int | None:
    """The 1-based page of the outline's first entry that is not front matter, if any (1 included:
    an outline that starts the body on page 1 says there is no front matter to skip)."""
    try:
        outline = reader.outline
    except Exception:  # a broken outline is not a broken document; fall back to the heuristic
        return None
    entries: list[tuple[str, int]] = []

    def walk(items, depth=0):
        for item in items:
            if isinstance(item, list):
                if depth < 1:
                    walk(item, depth + 1)
                continue
            try:
                page = reader.get_destination_page_number(item)
            except Exception:
                continue
            if page is not None and page >= 0:
                entries.append((str(getattr(item, "title", "") or ""), page + 1))

    walk(outline)
    for title, page in entries:
        if not is_front_matter_title(title):
            return page  # 1 when the body starts at once: the outline still outranks the heuristic
    return None
