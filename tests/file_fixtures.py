"""Small documents written by the tests themselves, one per supported format.

Each function returns the file's bytes; :func:`write_all` writes them into a folder.
The PDFs come from fpdf2 (its ``start_section`` writes the outline), the Office files
from python-docx / python-pptx / openpyxl, the EPUB from ebooklib, the scanned-style
page from Pillow. Body pages carry distinctive words so tests can tell pages apart:
page N of a book says ``This is body page N`` and chapter K is named in ``CHAPTERS``.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

CHAPTERS = ["Introduction", "The Harbour", "Storms at Sea", "The Lighthouse", "Albatross Island", "Homecoming"]
"""Chapter titles of the book fixtures; chapter K starts on body page K."""
FOCUS_WORD = "albatross"
"""A word that first appears in the fifth chapter's text."""


def _fpdf():
    from fpdf import FPDF

    pdf = FPDF(format=(148, 210))  # A5, in millimetres
    pdf.set_auto_page_break(False)
    pdf.set_font("Helvetica", size=11)
    return pdf


def _body_page(pdf, page_no: int, chapter: str | None, *, outline: bool) -> None:
    pdf.add_page()
    if chapter is not None:
        if outline:
            pdf.start_section(chapter, level=0)
        pdf.set_font("Helvetica", "B", 14)
        pdf.cell(0, 10, chapter, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
    text = f"This is body page {page_no}. "
    if chapter == "Albatross Island":
        text += "An albatross circled the island while the keeper wrote his log. "
    text += "The sea was calm and the ship kept its course through the long night. " * 3
    pdf.multi_cell(0, 6, text)


def _toc_page(pdf, entries: list[tuple[str, int]], *, flattened: bool = False) -> None:
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 14)
    pdf.cell(0, 10, "Contents", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=11)
    if flattened:
        line = "  ".join(f"{i}. {title} .......... {page}" for i, (title, page) in enumerate(entries, start=1))
        pdf.multi_cell(0, 6, line)  # wraps on paper, but pypdf may still give long lines; see score_page
        return
    for i, (title, page) in enumerate(entries, start=1):
        pdf.cell(0, 7, f"{i}. {title} {'.' * (40 - len(title))} {page}", new_x="LMARGIN", new_y="NEXT")


def book_pdf(
    *,
    outline: bool = True,
    toc: bool = True,
    title_page: bool = True,
    extra_pages: int = 0,
    flattened_toc: bool = False,
) -> bytes:
    """A small book: a title page, a "Contents" page (dot leaders, numbered entries, page
    numbers), then one page per chapter of :data:`CHAPTERS` plus ``extra_pages`` more.

    With ``outline`` the PDF outline has an entry per chapter (the first body entry is
    page 3 with the title and contents pages; page 1 without them). ``flattened_toc``
    writes the contents as one run-on paragraph, as text extraction often returns it.
    """
    pdf = _fpdf()
    front = int(title_page) + int(toc)
    if title_page:
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 20)
        pdf.cell(0, 20, "The Keeper's Log", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        pdf.cell(0, 10, "A novel in six chapters", new_x="LMARGIN", new_y="NEXT")
    if toc:
        _toc_page(pdf, [(c, front + k) for k, c in enumerate(CHAPTERS, start=1)], flattened=flattened_toc)
    for k, chapter in enumerate(CHAPTERS, start=1):
        _body_page(pdf, front + k, chapter, outline=outline)
    for extra in range(extra_pages):
        _body_page(pdf, front + len(CHAPTERS) + extra + 1, None, outline=False)
    return bytes(pdf.output())


def long_pdf(pages: int = 200) -> bytes:
    """A ``pages``-page PDF with an outline: a contents page, then body pages of about
    1,500 characters each (for the token bench)."""
    pdf = _fpdf()
    pdf.set_font("Helvetica", size=8)
    _toc_page(pdf, [(f"Part {k}", 2 + (k - 1) * 20) for k in range(1, pages // 20 + 1)])
    sentence = "The committee reviewed the harbour accounts, the repairs to the pier and the winter schedule. "
    for page in range(2, pages + 1):
        pdf.add_page()
        if (page - 2) % 20 == 0:
            pdf.start_section(f"Part {(page - 2) // 20 + 1}", level=0)
        pdf.multi_cell(0, 4, f"Page {page}. " + sentence * 15)
    return bytes(pdf.output())


def scanned_pdf(pages: int = 2) -> bytes:
    """A scanned-style PDF: each page is one image of text (drawn with Pillow), no text layer."""
    from PIL import Image, ImageDraw

    pdf = _fpdf()
    for n in range(1, pages + 1):
        image = Image.new("RGB", (420, 595), "white")
        draw = ImageDraw.Draw(image)
        for row in range(20):
            draw.text((20, 20 + row * 26), f"Scanned page {n}, line {row + 1}: ink on paper", fill="black")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        pdf.add_page()
        pdf.image(io.BytesIO(buffer.getvalue()), x=0, y=0, w=148)
    return bytes(pdf.output())


def encrypted_pdf() -> bytes:
    """A PDF that needs a user password to open."""
    pdf = _fpdf()
    pdf.set_encryption(owner_password="owner-secret", user_password="user-secret")
    pdf.add_page()
    pdf.cell(0, 10, "Secret minutes")
    return bytes(pdf.output())


def corrupt_pdf() -> bytes:
    """Bytes that start like a PDF and then break off."""
    return book_pdf()[:400]


def docx_bytes() -> bytes:
    """A DOCX: a "Contents" section, then three level-1 sections with a table in the second."""
    import docx

    document = docx.Document()
    document.add_heading("Contents", level=1)
    for i, title in enumerate(["Overview", "Budget", "Schedule"], start=1):
        document.add_paragraph(f"{i}. {title} ........................ {i + 1}")
    document.add_heading("Overview", level=1)
    document.add_paragraph("The garden project turns the old car park into a community garden.")
    document.add_heading("Budget", level=1)
    document.add_paragraph("The budget covers soil, seeds and tools.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Item", "Cost"
    table.cell(1, 0).text, table.cell(1, 1).text = "Soil", "1200"
    document.add_heading("Schedule", level=1)
    document.add_paragraph("Planting starts in April; the first harvest is in July.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def pptx_bytes() -> bytes:
    """A PPTX with three slides (title + body text, one with speaker notes)."""
    import pptx

    deck = pptx.Presentation()
    for i, (title, body) in enumerate(
        [
            ("Quarterly review", "Sales grew in every region."),
            ("Risks", "Supply of copper is tight."),
            ("Next steps", "Hire two engineers."),
        ],
        start=1,
    ):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if i == 2:
            slide.notes_slide.notes_text_frame.text = "Mention the new supplier."
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def xlsx_bytes() -> bytes:
    """An XLSX with two sheets: ``Sales`` (3 rows) and ``Staff`` (2 rows)."""
    import openpyxl

    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    for row in (["Region", "Revenue"], ["North", 1200], ["South", 950]):
        sales.append(row)
    staff = book.create_sheet("Staff")
    for row in (["Name", "Role"], ["Ada", "Engineer"]):
        staff.append(row)
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def epub_bytes() -> bytes:
    """An EPUB with a navigation page and two chapters."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("fixture-book-1")
    book.set_title("Tide Tables")
    book.set_language("en")
    chapters = []
    for i, (title, text) in enumerate(
        [("High Water", "The tide rises twice a day in the bay."), ("Low Water", "At low water the sandbanks show.")],
        start=1,
    ):
        chapter = epub.EpubHtml(title=title, file_name=f"chap_{i}.xhtml", lang="en")
        chapter.content = f"<html><body><h1>{title}</h1><p>{text}</p></body></html>"
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = tuple(chapters)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    return buffer.getvalue()


def zip_with_pdf() -> bytes:
    """A ZIP holding ``docs/book.pdf`` (the book fixture) and ``notes.txt``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("docs/book.pdf", book_pdf(outline=False, toc=False, title_page=False))
        archive.writestr("notes.txt", "Remember to water the plants on Sunday.\n")
    return buffer.getvalue()


def nested_zip(levels: int) -> bytes:
    """A ZIP inside a ZIP, ``levels`` deep; the innermost holds ``deep.txt``."""
    data = b""
    for level in range(levels, 0, -1):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            if level == levels:
                archive.writestr("deep.txt", "the innermost note\n")
            else:
                archive.writestr(f"level{level + 1}.zip", data)
        data = buffer.getvalue()
    return data


def encrypted_zip() -> bytes:
    """A ZIP whose only member is marked encrypted (the general-purpose flag bit 0 set in
    both headers; zipfile cannot write real ZIP encryption)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("secret.txt", b"ciphertext")
    data = bytearray(buffer.getvalue())
    local = data.find(b"PK\x03\x04")
    central = data.find(b"PK\x01\x02")
    data[local + 6] |= 0x1
    data[central + 8] |= 0x1
    return bytes(data)


def markdown_bytes() -> bytes:
    return b"# Shopping list\n\n- apples\n- bread\n\n## Notes\n\nBuy the bread at the corner bakery.\n"


def code_bytes() -> bytes:
    return b'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n'


def text_bytes(chars: int = 1000) -> bytes:
    """Plain text of about ``chars`` characters, numbered lines."""
    lines, total, n = [], 0, 0
    while total < chars:
        n += 1
        line = f"Line {n}: the quick brown fox jumps over the lazy dog."
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


FIXTURES = {
    "book.pdf": book_pdf,
    "scanned.pdf": scanned_pdf,
    "report.docx": docx_bytes,
    "deck.pptx": pptx_bytes,
    "sheets.xlsx": xlsx_bytes,
    "tides.epub": epub_bytes,
    "bundle.zip": zip_with_pdf,
    "list.md": markdown_bytes,
    "greet.py": code_bytes,
    "notes.txt": text_bytes,
}
"""File name → bytes writer, one per supported format."""


def write_all(folder: Path) -> dict[str, Path]:
    """Write every fixture of :data:`FIXTURES` into ``folder``; name → path."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, make in FIXTURES.items():
        path = folder / name
        path.write_bytes(make())
        out[name] = path
    return out
