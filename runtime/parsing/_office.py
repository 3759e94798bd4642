"""DOCX (python-docx), PPTX (python-pptx) and XLSX (openpyxl).

Pages: a DOCX document section (text up to the next level-1 heading), a slide (its
shapes' text, tables and speaker notes), a sheet (one tab-separated line per row). Long
sections and sheets are split into parts (``_text.split_unit``).
"""

from __future__ import annotations

import io
import zipfile

from errors import FileParseError
from runtime.parsing._extract import Extract
from runtime.parsing._text import split_unit

XLSX_MAX_ROWS = 5000
"""Rows read per sheet; a note on the page says when a sheet had more."""

_MALFORMED = (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, IndexError, OSError, SyntaxError)
"""Plain exceptions the Office libraries let escape on damaged packages (lxml's XMLSyntaxError is a SyntaxError)."""


def library_errors(kind: str) -> tuple[type[BaseException], ...]:
    """The exception classes one Office library raises on bad input, its own base classes included."""
    if kind == "DOCX":
        from docx.opc.exceptions import OpcError

        return (OpcError, *_MALFORMED)
    if kind == "PPTX":
        from pptx.exc import PythonPptxError

        return (PythonPptxError, *_MALFORMED)
    from openpyxl.utils.exceptions import InvalidFileException

    return (InvalidFileException, *_MALFORMED)


def _corrupt(name: str, kind: str, exc: BaseException) -> FileParseError:
    if isinstance(exc, zipfile.BadZipFile) or "encrypt" in str(exc).lower():
        hint = "it is not a valid Office file (encrypted or damaged)"
        reason = "encrypted" if "encrypt" in str(exc).lower() else "corrupt"
    else:
        hint, reason = f"{type(exc).__name__}: {exc}", "corrupt"
    return FileParseError(f"{name}: the {kind} file cannot be read ({hint}).", reason=reason)


def _check_zip(data: bytes, name: str, kind: str) -> None:
    # Password-protected Office files are OLE2 containers, not ZIP: say so plainly.
    if data.startswith(b"\xd0\xcf\x11\xe0"):
        raise FileParseError(
            f"{name}: the {kind} file is password-protected (or an old binary Office file). "
            "Save an unprotected .docx/.pptx/.xlsx copy and upload that.",
            reason="encrypted",
        )


def parse_docx(data: bytes, *, name: str) -> Extract:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    _check_zip(data, name, "DOCX")
    try:
        document = docx.Document(io.BytesIO(data))
        sections: list[list[str]] = [[]]
        for block in document.iter_inner_content():
            if isinstance(block, Paragraph):
                text = block.text.strip()
                style = (block.style.name if block.style is not None else "") or ""
                if style.lower() in ("heading 1", "title") and any(s.strip() for s in sections[-1]):
                    sections.append([])
                if text:
                    sections[-1].append(("# " + text) if style.lower().startswith("heading") else text)
            elif isinstance(block, Table):
                for row in block.rows:
                    sections[-1].append(" | ".join(cell.text.strip() for cell in row.cells))
    except library_errors("DOCX") as exc:
        raise _corrupt(name, "DOCX", exc) from exc
    pages: list[str] = []
    for number, section in enumerate(sections, start=1):
        text = "\n".join(section).strip()
        if text:
            pages.extend(split_unit(text, f"section {number}"))
    return Extract(pages=pages)


def parse_pptx(data: bytes, *, name: str) -> Extract:
    import pptx

    _check_zip(data, name, "PPTX")
    try:
        presentation = pptx.Presentation(io.BytesIO(data))
        pages = []
        for slide in presentation.slides:
            lines: list[str] = []
            for shape in slide.shapes:
                lines.extend(_shape_lines(shape))
            if slide.has_notes_slide:
                notes = slide.notes_slide.notes_text_frame.text.strip() if slide.notes_slide.notes_text_frame else ""
                if notes:
                    lines.append("Notes: " + notes)
            pages.append("\n".join(lines))
    except library_errors("PPTX") as exc:
        raise _corrupt(name, "PPTX", exc) from exc
    return Extract(pages=pages)


def _shape_lines(shape) -> list[str]:
    lines: list[str] = []
    if getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        lines.extend(p.strip() for p in shape.text_frame.text.split("\n") if p.strip())
    if getattr(shape, "has_table", False) and shape.has_table:
        for row in shape.table.rows:
            lines.append(" | ".join(cell.text.strip() for cell in row.cells))
    for child in getattr(shape, "shapes", []) or []:  # group shapes
        lines.extend(_shape_lines(child))
    return lines


def parse_xlsx(data: bytes, *, name: str) -> Extract:
    import openpyxl

    _check_zip(data, name, "XLSX")
    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
        pages = []
        try:
            for sheet in workbook.worksheets:
                lines = [f"Sheet: {sheet.title}"]
                rows = 0
                more = False
                for row in sheet.iter_rows(values_only=True):
                    if rows >= XLSX_MAX_ROWS:
                        more = True
                        break
                    cells = ["" if v is None else str(v) for v in row]
                    while cells and not cells[-1]:
                        cells.pop()
                    if cells:
                        lines.append("\t".join(cells))
                    rows += 1
                if more:
                    lines.append(f"[only the first {XLSX_MAX_ROWS} rows of this sheet were read]")
                pages.extend(split_unit("\n".join(lines), f"sheet {sheet.title}") if len(lines) > 1 else [""])
        finally:
            workbook.close()
    except library_errors("XLSX") as exc:
        raise _corrupt(name, "XLSX", exc) from exc
    return Extract(pages=pages)
