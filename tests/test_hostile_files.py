"""Hostile files: unpack limits hold across every nesting level together, and for DOCX,
XLSX, PPTX and EPUB (ZIPs too), checked before their libraries open them."""

from __future__ import annotations

import pytest

from errors import FileParseError
from runtime.parsing import ParseLimits, parse_document
from tests import file_fixtures as F
from tests import hostile_files as H

MiB = 1024 * 1024


def test_nested_archives_share_one_unpack_limit():
    # three inner ZIPs of 4 x 1 MiB: each 4 MiB alone is under a 10 MiB limit; 12 MiB together is not
    data = H.zip_of_zips(width=3, inner_members=4, member_chars=MiB)
    assert parse_document(data, name="z.zip", limits=ParseLimits(max_unpacked_bytes=20 * MiB)).has_text
    with pytest.raises(FileParseError) as info:
        parse_document(data, name="z.zip", limits=ParseLimits(max_unpacked_bytes=10 * MiB))
    assert info.value.reason == "too_large" and "nested archives included" in str(info.value)


def test_nested_archives_share_one_member_count():
    data = H.zip_of_zips(width=5, inner_members=30, member_chars=100)
    with pytest.raises(FileParseError) as info:
        parse_document(data, name="z.zip", limits=ParseLimits(max_members=100))
    assert info.value.reason == "too_large" and "members in all" in str(info.value)


def test_a_zip_bomb_member_is_refused_by_its_ratio():
    with pytest.raises(FileParseError) as info:
        parse_document(H.zeros_member_zip(64 * MiB), name="bomb.zip")
    assert info.value.reason == "too_large" and "compressed" in str(info.value)


CONTAINERS = [
    pytest.param(F.docx_bytes, "a.docx", "customXml/item9.xml", id="docx"),
    pytest.param(F.xlsx_bytes, "a.xlsx", "xl/media/big.bin", id="xlsx"),
    pytest.param(F.pptx_bytes, "a.pptx", "ppt/media/big.bin", id="pptx"),
    pytest.param(F.epub_bytes, "a.epub", "OEBPS/big.xhtml", id="epub"),
]


@pytest.mark.parametrize("make,name,part", CONTAINERS)
def test_office_and_epub_files_are_held_to_the_ratio_before_their_library_opens_them(make, name, part):
    assert parse_document(make(), name=name).has_text
    data = H.with_big_part(make(), part=part, unpacked=48 * MiB)
    assert len(data) < MiB
    with pytest.raises(FileParseError) as info:
        parse_document(data, name=name)
    assert info.value.reason == "too_large"


@pytest.mark.parametrize("make,name,part", CONTAINERS)
def test_office_and_epub_files_are_held_to_the_total_and_member_limits(make, name, part):
    data = H.with_big_part(make(), part=part, unpacked=2 * MiB)
    with pytest.raises(FileParseError) as info:
        parse_document(data, name=name, limits=ParseLimits(max_unpacked_bytes=MiB))
    assert info.value.reason == "too_large"
    with pytest.raises(FileParseError) as info:
        parse_document(make(), name=name, limits=ParseLimits(max_members=3))
    assert info.value.reason == "too_large"


def test_an_xlsx_with_millions_of_shared_strings_is_refused_quickly():
    import time

    data = H.xlsx_many_shared_strings(3_000_000)
    started = time.monotonic()
    with pytest.raises(FileParseError) as info:
        parse_document(data, name="strings.xlsx")
    assert info.value.reason == "too_large"
    assert time.monotonic() - started < 2


def test_an_ordinary_nested_zip_still_parses():
    extract = parse_document(F.nested_zip(2), name="n.zip")
    assert extract.has_text
