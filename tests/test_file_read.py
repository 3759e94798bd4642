"""The ``file_read`` window: bounds, focus, the front-matter skip, and parse readiness."""

from __future__ import annotations

import threading

import pytest

from errors import FileInputError, FileNotFound
from memory.files import FileStore
from runtime.files import FileReader, ParseService, WindowLimits, read_window
from runtime.parsing import serialize
from tests import file_fixtures as F
from tests.files_support import LONG, GatedParser, files, parse_log, parser, parses  # noqa: F401  (fixtures)


def numbered_extract(pages: int, chars: int = 200, word_on: dict[int, str] | None = None) -> str:
    word_on = word_on or {}
    out = []
    for n in range(1, pages + 1):
        text = f"Page {n} text. " + "x" * max(0, chars - 15)
        out.append(text + (" " + word_on[n] if n in word_on else ""))
    return serialize(out)


def pages_in(result: str) -> list[int]:
    return [int(line.split()[2]) for line in result.splitlines() if line.startswith("--- page ")]


# -- the window, on extract text ------------------------------------------------
def test_default_window_is_eight_pages_and_says_how_to_read_on():
    result = read_window(numbered_extract(20))
    assert pages_in(result) == list(range(1, 9))
    assert result.splitlines()[0].endswith("pages 1-8 of 20]")
    assert "start_page=9" in result.splitlines()[-1] and "Pages 9-20 are not shown" in result


def test_last_window_says_the_file_ends():
    result = read_window(numbered_extract(10), start_page=9)
    assert pages_in(result) == [9, 10]
    assert "page 10 is the last page" in result


@pytest.mark.parametrize(
    "kwargs, limits, expected, note",
    [
        pytest.param({"max_pages": 3}, None, [1, 2, 3], None, id="fewer-pages"),
        pytest.param(
            {"max_pages": 50}, None, list(range(1, 9)), "max_pages 50 lowered to the limit of 8", id="clamped-pages"
        ),
        pytest.param({}, WindowLimits(max_pages=8, max_chars=2500), [1, 2], None, id="char-limit"),
        pytest.param({"max_chars": 1100}, None, [1], None, id="asked-chars"),
        pytest.param({}, WindowLimits(max_pages=4, max_chars=28_000), [1, 2, 3, 4], None, id="configured-pages"),
    ],
)
def test_window_holds_at_most_the_page_and_character_limits(kwargs, limits, expected, note):
    result = read_window(numbered_extract(12, chars=1000), limits=limits, **kwargs)
    assert pages_in(result) == expected
    if note:
        assert note in result.splitlines()[0]


def test_a_page_longer_than_the_window_is_cut_and_says_so():
    result = read_window(numbered_extract(3, chars=5000), limits=WindowLimits(max_pages=8, max_chars=1000))
    assert pages_in(result) == [1]
    assert "page 1 cut at 1,000 characters" in result
    body = result.split("--- page 1 ---\n", 1)[1].split("\n[End of window", 1)[0]
    assert len(body) == 1000


def test_focus_returns_a_window_around_the_first_page_with_the_keyword():
    text = numbered_extract(30, word_on={12: "Lighthouse keeper", 20: "lighthouse again"})
    result = read_window(text, focus="LIGHTHOUSE")
    assert pages_in(result)[:2] == [11, 12]
    assert 'first page containing "LIGHTHOUSE" is page 12' in result
    later = read_window(text, focus="lighthouse", start_page=13)
    assert 20 in pages_in(later)
    missing = read_window(text, focus="submarine")
    assert pages_in(missing) == [] and "was not found on any of its 30 pages" in missing


def test_start_page_past_the_end_says_where_the_file_ends():
    result = read_window(numbered_extract(5), start_page=9)
    assert pages_in(result) == [] and "past the last page (5)" in result


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"start_page": 0}, id="page-zero"),
        pytest.param({"start_page": -2}, id="negative-page"),
        pytest.param({"start_page": "two"}, id="word-page"),
        pytest.param({"max_pages": 0}, id="no-pages"),
        pytest.param({"max_pages": True}, id="bool"),
        pytest.param({"focus": "   "}, id="blank-focus"),
        pytest.param({"focus": "k" * 201}, id="long-focus"),
    ],
)
def test_bad_arguments_fail_clearly(kwargs):
    with pytest.raises(FileInputError) as info:
        read_window(numbered_extract(5), **kwargs)
    assert info.value.reason == "bad_argument"


def test_numbers_sent_as_strings_are_accepted():
    assert pages_in(read_window(numbered_extract(10), start_page="3", max_pages="2")) == [3, 4]


# -- stored files through FileReader ------------------------------------------------
def ready(files: FileStore, parser: GatedParser, parses: ParseService, name: str, data: bytes, user: str = "u1"):
    stored = files.add(user_id=user, name=name, data=data)
    parser.gate.set()
    assert parses.wait(stored.id, LONG) not in ("pending", "parsing")
    return stored


def test_front_matter_is_skipped_by_default_and_start_page_1_shows_it(files, parses, parser):
    book = ready(files, parser, parses, "book.pdf", F.book_pdf())
    reader = FileReader(files, parses)
    default = reader.file_read(book.id, "u1")
    assert pages_in(default) == [3, 4, 5, 6, 7, 8]
    assert "skipped front matter (pages 1-2): pass start_page=1" in default
    assert "Contents" not in default.split("\n", 1)[1]
    first = reader.file_read(book.id, "u1", start_page=1)
    assert pages_in(first)[:2] == [1, 2] and "Contents" in first and "skipped" not in first
    focused = reader.file_read(book.id, "u1", focus=F.FOCUS_WORD)
    assert 7 in pages_in(focused) and "is page 7" in focused


def test_heuristic_and_catalog_skips_reach_the_reader(files, parses, parser):
    no_outline = ready(files, parser, parses, "plain.pdf", F.book_pdf(outline=False))
    bundle = ready(files, parser, parses, "bundle.zip", F.zip_with_pdf())
    reader = FileReader(files, parses)
    assert pages_in(reader.file_read(no_outline.id, "u1"))[0] == 3
    assert pages_in(reader.file_read(bundle.id, "u1"))[0] == 2
    assert "Archive bundle.zip" in reader.file_read(bundle.id, "u1", start_page=1)


def test_pending_extract_says_still_processing_then_reads_once_ready(files, parses, parser):
    stored = files.add(user_id="u1", name="book.pdf", data=F.book_pdf())
    impatient = FileReader(files, parses, wait_seconds=0)
    first = impatient.file_read(stored.id, "u1")
    assert "STILL_PROCESSING" in first and "Try again next turn" in first
    assert pages_in(first) == [] and "body page" not in first
    assert parser.started.wait(LONG)
    parser.gate.set()
    assert parses.wait(stored.id, LONG) == "ready"
    assert pages_in(impatient.file_read(stored.id, "u1"))[0] == 3
    assert parser.calls == 1


def test_reader_waits_for_a_parse_that_ends_within_its_bound(files, parses, parser):
    stored = files.add(user_id="u1", name="book.pdf", data=F.book_pdf())
    opener = threading.Thread(target=lambda: parser.started.wait(LONG) and parser.gate.set())
    opener.start()
    result = FileReader(files, parses, wait_seconds=LONG).file_read(stored.id, "u1", start_page=1, max_pages=2)
    opener.join(LONG)
    assert pages_in(result) == [1, 2]


@pytest.mark.parametrize(
    "name, make, says",
    [
        pytest.param("blank.txt", lambda: b"  \n \n", "EXTRACT_EMPTY", id="empty"),
        pytest.param("scan.pdf", F.scanned_pdf, "NEEDS_OCR", id="scanned"),
        pytest.param("secret.pdf", F.encrypted_pdf, "PARSE_FAILED", id="encrypted"),
    ],
)
def test_finished_parse_without_text_says_why(files, parses, parser, name, make, says):
    stored = ready(files, parser, parses, name, make())
    result = FileReader(files, parses).file_read(stored.id, "u1")
    assert says in result and pages_in(result) == []
    if says == "NEEDS_OCR":
        assert "2 page(s)" in result
    if says == "PARSE_FAILED":
        assert "password" in result


def test_unknown_and_foreign_ids_fail_at_once_without_waiting(files, parses, parser, parse_log):
    theirs = files.add(user_id="u2", name="book.pdf", data=F.book_pdf())  # pending, parser gated
    reader = FileReader(files, parses, wait_seconds=LONG)
    with pytest.raises(FileNotFound):
        reader.file_read("file_ffffffffffffffffffff", "u1")
    with pytest.raises(FileNotFound):
        reader.file_read(theirs.id, "u1")
    with pytest.raises(FileInputError):
        reader.file_read(theirs.id, "u2", start_page=0)
    assert parse_log("file.watch.started") == 0 and parser.calls == 0


def test_focus_searches_the_body_before_the_front_matter(files, parses, parser):
    book = ready(files, parser, parses, "book.pdf", F.book_pdf())
    reader = FileReader(files, parses)
    body_hit = reader.file_read(book.id, "u1", focus="Albatross Island")
    assert pages_in(body_hit)[:2] == [6, 7] and "is page 7" in body_hit  # not the contents page, which names it too
    front_hit = reader.file_read(book.id, "u1", focus="Contents")
    assert pages_in(front_hit)[0] == 2 and "is page 2" in front_hit  # only in the front matter: found there


def test_a_page_without_text_says_so_instead_of_showing_nothing():
    result = read_window(serialize(["first page text", "", "third page text"]))
    assert pages_in(result) == [1, 2, 3]
    assert "--- page 2 ---\n[This page has no extractable text" in result


def test_a_single_skipped_page_is_named_as_one_page():
    result = read_window(numbered_extract(5), body_start_page=2)
    assert pages_in(result)[0] == 2 and "skipped front matter (page 1)" in result


def test_a_window_of_a_big_extract_is_read_without_loading_the_whole_extract(files):
    import tracemalloc

    from runtime.files import FileReader, ParseService
    from runtime.parsing import serialize

    pages = [f"Page {n} of a very long ledger. " + ("entry " * 2_000) for n in range(1, 3_001)]
    pages[2_500] += " The lighthouse keeper's signature."
    stored = files.add(user_id="u1", name="ledger.txt", data=b"ledger")
    extract = serialize(pages)
    assert len(extract) > 30_000_000
    files.set_parse_result(stored.id, state="ready", extract=extract, page_count=len(pages), body_start_page=None)
    del extract, pages
    with ParseService(files) as parses:
        reader = FileReader(files, parses)
        tracemalloc.start()
        try:
            window = reader.file_read(stored.id, "u1", start_page=1_200)
            found = reader.file_read(stored.id, "u1", focus="LIGHTHOUSE keeper's")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "--- page 1200 ---" in window and "Page 1200 of a very long ledger." in window
    assert "--- page 2501 ---" in found and "signature" in found
    assert peak < 2_000_000  # bytes: a few pages, not the 30 MB extract
