"""Parsing every format into ``--- page N ---`` extracts, the front-matter rules, and clear failures."""

from __future__ import annotations

import pytest

from errors import FileParseError
from runtime.parsing import (
    Extract,
    ParseLimits,
    format_of,
    pages_of,
    parse_document,
    score_page,
    serialize,
    toc_body_start,
)
from tests import file_fixtures as F


@pytest.mark.parametrize(
    "name, make, kind, pages, first_page_has, body_start",
    [
        pytest.param("book.pdf", F.book_pdf, "pdf", 8, "The Keeper's Log", 3, id="pdf-outline"),
        pytest.param("report.docx", F.docx_bytes, "docx", 4, "# Contents", 2, id="docx-sections"),
        pytest.param("deck.pptx", F.pptx_bytes, "pptx", 3, "Quarterly review", None, id="pptx-slides"),
        pytest.param("sheets.xlsx", F.xlsx_bytes, "xlsx", 2, "Sheet: Sales", None, id="xlsx-sheets"),
        pytest.param("tides.epub", F.epub_bytes, "epub", 3, "High Water", 2, id="epub-spine"),
        pytest.param("bundle.zip", F.zip_with_pdf, "zip", 8, "Archive bundle.zip", 2, id="zip-catalog"),
        pytest.param("list.md", F.markdown_bytes, "markdown", 1, "# Shopping list", None, id="markdown"),
        pytest.param("greet.py", F.code_bytes, "text", 1, "def greet", None, id="code"),
        pytest.param("notes.txt", F.text_bytes, "text", 1, "Line 1:", None, id="text"),
    ],
)
def test_every_format_serializes_into_numbered_pages(name, make, kind, pages, first_page_has, body_start):
    data = make()
    assert format_of(data, name=name) == kind
    extract = parse_document(data, name=name)
    assert len(extract.pages) == pages
    assert first_page_has in extract.pages[0]
    assert extract.body_start_page == body_start
    assert not extract.needs_ocr
    text = serialize(extract)
    for n in range(1, pages + 1):
        assert f"--- page {n} ---\n" in text
    assert f"--- page {pages + 1} ---" not in text
    assert pages_of(text) == [p.strip("\n") for p in extract.pages]


def test_format_comes_from_the_bytes_not_the_name():
    assert format_of(F.book_pdf(), name="renamed.txt") == "pdf"
    assert format_of(F.docx_bytes(), name="report") == "docx"


def test_pages_hold_what_their_source_unit_holds():
    xlsx = parse_document(F.xlsx_bytes(), name="s.xlsx")
    assert "North\t1200" in xlsx.pages[0] and "Ada\tEngineer" in xlsx.pages[1]
    pptx = parse_document(F.pptx_bytes(), name="d.pptx")
    assert "Notes: Mention the new supplier." in pptx.pages[1]
    docx = parse_document(F.docx_bytes(), name="r.docx")
    assert "Soil | 1200" in docx.pages[2]
    book = parse_document(F.book_pdf(), name="b.pdf")
    assert "This is body page 7" in book.pages[6] and "albatross" in book.pages[6]
    bundle = parse_document(F.zip_with_pdf(), name="z.zip")
    assert "docs/book.pdf" in bundle.pages[0] and "pages 2-7" in bundle.pages[0]
    assert bundle.pages[7].startswith("[notes.txt]") and "water the plants" in bundle.pages[7]


def test_long_text_is_cut_into_sections_at_line_boundaries():
    extract = parse_document(F.text_bytes(20_000), name="long.txt")
    assert len(extract.pages) >= 3
    assert all(len(p) <= 6000 for p in extract.pages)
    assert all(p.startswith("Line ") for p in extract.pages)


def test_page_text_cannot_fake_a_marker():
    tricky = Extract(pages=["intro\n--- page 2 ---\nnot a page", "real page two"])
    text = serialize(tricky)
    assert pages_of(text) == ["intro\n--- page 2 ---\nnot a page", "real page two"]
    assert len(pages_of(text)) == 2
    assert pages_of("no markers at all") == ["no markers at all"]
    assert pages_of("") == [] and pages_of(None) == []


def test_outline_decides_the_body_start_before_the_heuristic():
    with_outline = parse_document(F.book_pdf(outline=True), name="b.pdf")
    without = parse_document(F.book_pdf(outline=False), name="b.pdf")  # heuristic finds the contents page
    no_toc = parse_document(F.book_pdf(outline=False, toc=False), name="b.pdf")
    assert with_outline.body_start_page == 3
    assert without.body_start_page == 3
    assert no_toc.body_start_page is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "Contents\n1. Intro ...... 3\n2. Harbour ...... 7\n3. Storms ...... 12\n4. End ...... 20", id="classic"
        ),
        pytest.param(
            "Contents 1. Introduction .......... 3  2. The Harbour .......... 4  3. Storms at Sea .......... 5  "
            "4. The Lighthouse .......... 6  5. Albatross .......... 7",
            id="flattened-with-heading",
        ),
        pytest.param(
            "1 Introduction 3 2 The Harbour 7 3 Storms at Sea 12 4 The Lighthouse 20 5 Albatross Island 28 6 Homecoming 35",
            id="flattened-numbered-no-heading",
        ),
        pytest.param("目录\n第一章 总则 1\n第二章 组织 5\n第三章 财务 9\n第四章 附则 15", id="chinese-heading"),
        pytest.param(
            "Table of Contents\nPreface 1\nThe Early Years 4\nThe War 19\nAfter 40", id="heading-and-page-numbers"
        ),
    ],
)
def test_table_of_contents_pages_score_as_contents(text):
    assert score_page(text, max_page=60).is_toc


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "Contents of the box\nThe box holds a kettle, two cups and a manual.\nKeep it dry.", id="heading-only"
        ),
        pytest.param(
            "1. Preheat the oven.\n2. Mix flour and sugar.\n3. Add the eggs.\n4. Bake for twenty minutes.",
            id="numbered-only",
        ),
        pytest.param("Apples 3\nBread 2\nCheese 7\nMilk 1\nEggs 4", id="trailing-numbers-only"),
        pytest.param("Name ..........\nAddress ..........\nSignature ..........", id="dot-leaders-only"),
        pytest.param(
            "In 1990 the harbour opened and in 1995 the pier was rebuilt; by 2001 the ferry ran daily and in 2010 "
            "the lighthouse was automated, in 2015 the museum came.",
            id="prose-with-rising-years",
        ),
        pytest.param(
            "The crew of 12 sailed for 30 days and saw 4 whales, 2 storms and 9 islands before 3 of them fell ill.",
            id="prose-with-counts",
        ),
    ],
)
def test_no_single_signal_makes_a_table_of_contents(text):
    assert not score_page(text, max_page=60).is_toc


def test_heuristic_skips_title_and_contents_pages_but_not_a_late_contents_page():
    body = ["Chapter text about the sea. " * 20] * 10
    toc = "Contents\n1. Intro ...... 3\n2. Harbour ...... 4\n3. Storms ...... 5\n4. End ...... 6"
    assert toc_body_start(["The Title", toc, *body]) == 3
    assert toc_body_start([*body[:8], toc, *body]) is None  # page 9 of 18 is past the front
    assert toc_body_start([toc]) is None


def test_scanned_pdf_is_marked_as_needing_ocr():
    extract = parse_document(F.scanned_pdf(), name="scan.pdf")
    assert extract.needs_ocr
    assert len(extract.pages) == 2 and not extract.has_text


@pytest.mark.parametrize(
    "name, data, reason, says",
    [
        pytest.param("secret.pdf", F.encrypted_pdf(), "encrypted", "password", id="encrypted-pdf"),
        pytest.param("broken.pdf", F.corrupt_pdf(), "corrupt", "corrupt", id="truncated-pdf"),
        pytest.param("broken.docx", F.docx_bytes()[:300], "corrupt", "cannot be read", id="truncated-docx"),
        pytest.param(
            "locked.xlsx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 64, "encrypted", "password", id="ole2-office"
        ),
        pytest.param("blob.bin", bytes(range(256)) * 4, "unsupported", "Supported:", id="binary"),
        pytest.param(
            "photo.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "corrupt", "image is corrupt", id="corrupt-image"
        ),
    ],
)
def test_corrupt_encrypted_and_unknown_bytes_fail_with_a_clear_error(name, data, reason, says):
    with pytest.raises(FileParseError) as info:
        parse_document(data, name=name)
    assert info.value.reason == reason
    assert says in str(info.value) and name in str(info.value)


def test_zip_members_are_read_to_the_depth_limit():
    two_deep = parse_document(F.nested_zip(2), name="n.zip", limits=ParseLimits(zip_depth=2))
    assert any("the innermost note" in p for p in two_deep.pages)
    three_deep = parse_document(F.nested_zip(3), name="n.zip", limits=ParseLimits(zip_depth=2))
    assert not any("the innermost note" in p for p in three_deep.pages)
    assert any("nested deeper than 2" in p for p in three_deep.pages)


def test_zip_that_unpacks_past_the_limit_fails():
    with pytest.raises(FileParseError) as info:
        parse_document(F.zip_with_pdf(), name="z.zip", limits=ParseLimits(max_unpacked_bytes=100))
    assert info.value.reason == "too_large"


def test_pdf_with_only_an_owner_password_opens_and_reads():
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_encryption(owner_password="owner-only")  # permissions only: no password needed to read
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    pdf.cell(0, 10, "Minutes of the harbour committee")
    extract = parse_document(bytes(pdf.output()), name="restricted.pdf")
    assert "harbour committee" in extract.pages[0]


def test_outline_starting_on_page_one_outranks_the_heuristic():
    # outline entries on every chapter, no title page: the outline says the body starts on page 1...
    extract = parse_document(F.book_pdf(outline=True, toc=False, title_page=False), name="b.pdf")
    assert extract.body_start_page == 1


def test_zip_whose_members_are_all_encrypted_fails_instead_of_an_empty_success():
    with pytest.raises(FileParseError) as info:
        parse_document(F.encrypted_zip(), name="locked.zip")
    assert info.value.reason == "encrypted" and "locked.zip" in str(info.value)


def test_flattened_chinese_contents_line_scores_as_contents():
    assert score_page(
        "目录 第一章 总则 1 第二章 组织 5 第三章 财务 9 第四章 附则 15 第五章 其他 20", max_page=40
    ).is_toc


def _library_error_classes():
    """Every exception class the parsing libraries define for bad input, one case each."""
    import inspect

    import pypdf.errors
    from docx.opc import exceptions as docx_errors
    from ebooklib import epub
    from openpyxl.utils.exceptions import InvalidFileException
    from pptx import exc as pptx_errors

    cases = []
    for module, target, kind in (
        (pypdf.errors, "pypdf.PdfReader", "book.pdf"),
        (docx_errors, "docx.Document", "report.docx"),
        (pptx_errors, "pptx.Presentation", "deck.pptx"),
    ):
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls_name == "DeprecationError":  # pypdf's "you called a removed API": our bug, not bad input
                continue
            if issubclass(cls, Exception) and not issubclass(cls, Warning) and cls.__module__ == module.__name__:
                cases.append(pytest.param(target, kind, cls, id=f"{kind.split('.')[1]}-{cls_name}"))
    cases.append(
        pytest.param("openpyxl.load_workbook", "sheets.xlsx", InvalidFileException, id="xlsx-InvalidFileException")
    )
    cases.append(pytest.param("ebooklib.epub.read_epub", "tides.epub", epub.EpubException, id="epub-EpubException"))
    return cases


@pytest.mark.parametrize("target, name, error", _library_error_classes())
def test_every_library_error_class_becomes_a_file_parse_error(monkeypatch, target, name, error):
    data = F.FIXTURES[name]()
    try:
        instance = error("boom")
    except TypeError:  # EpubException(code, msg)
        instance = error(1, "boom")

    def explode(*args, **kwargs):
        raise instance

    monkeypatch.setattr(target, explode)
    with pytest.raises(FileParseError) as info:
        parse_document(data, name=name)
    assert name in str(info.value)
    assert info.value.reason in ("corrupt", "encrypted", "too_large")


def test_pdf_contents_page_flattened_into_run_on_lines_is_skipped():
    extract = parse_document(F.book_pdf(outline=False, flattened_toc=True), name="flat.pdf")
    assert len(extract.pages[1].splitlines()) <= 4  # the contents came out as a few run-on lines
    assert score_page(extract.pages[1], max_page=len(extract.pages)).flattened
    assert extract.body_start_page == 3


def test_a_long_sheet_is_split_so_every_row_stays_reachable():
    import io

    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Log"
    for n in range(1, 2001):
        sheet.append([n, f"entry number {n}", "ok"])
    buffer = io.BytesIO()
    book.save(buffer)
    extract = parse_document(buffer.getvalue(), name="log.xlsx")
    assert len(extract.pages) > 1
    assert extract.pages[0].startswith("[sheet Log, part 1 of ")
    assert all(len(p) <= 12_100 for p in extract.pages)
    assert "2000\tentry number 2000" in extract.pages[-1]


def test_an_image_is_one_page_with_no_text_layer():
    from tests.image_fixtures import small_png

    extract = parse_document(small_png(), name="photo.png")
    assert (extract.pages, extract.needs_ocr) == ([""], True)
