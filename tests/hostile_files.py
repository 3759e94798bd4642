"""Hostile files, made in memory: archives and Office/EPUB containers that unpack far past
what their size suggests. Used by the parsing tests and ``scripts/bench_service.py``.
Every builder is bounded in time (seconds at most) and memory (the compressed size)."""

from __future__ import annotations

import io
import zipfile
import zlib

from tests import file_fixtures as F


def _zip(members: list[tuple[str, bytes]], *, level: int = 9) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as z:
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def text_member(chars: int, seed: int = 0) -> bytes:
    """Text that compresses about 20:1 (not a bomb on its own): numbered lines."""
    line_count = chars // 40 + 1
    return "".join(f"line {seed}-{i:08d} of an ordinary log file\n" for i in range(line_count)).encode()[:chars]


def zip_of_zips(*, width: int, inner_members: int, member_chars: int) -> bytes:
    """An outer ZIP of ``width`` inner ZIPs, each of ``inner_members`` text members of
    ``member_chars`` characters: each inner ZIP alone looks modest; together they are not."""
    inner = _zip([(f"part{i}.txt", text_member(member_chars, i)) for i in range(inner_members)])
    return _zip([(f"inner{k}.zip", inner) for k in range(width)], level=0)


def zeros_member_zip(unpacked: int) -> bytes:
    """A ZIP with one member of ``unpacked`` zero bytes (about 1,000:1: a classic bomb)."""
    return _zip_streamed("zeros.txt", unpacked)


def _zip_streamed(member: str, unpacked: int, base: bytes | None = None) -> bytes:
    """A ZIP whose member ``member`` is ``unpacked`` zero bytes, written in 1 MiB pieces
    (never held whole in memory); with ``base`` (a ZIP), the member is added to a copy of it."""
    buf = io.BytesIO(base or b"")
    with zipfile.ZipFile(buf, "a" if base else "w", zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo(member)
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as out:
            piece = b"\0" * (1024 * 1024)
            left = unpacked
            while left > 0:
                out.write(piece[: min(left, len(piece))])
                left -= len(piece)
    return buf.getvalue()


def with_big_part(container: bytes, *, part: str, unpacked: int) -> bytes:
    """``container`` (a DOCX, XLSX, PPTX or EPUB) with one more member of ``unpacked`` zero bytes."""
    # the mode "a" on a copy keeps every original part as it was
    return _zip_streamed(part, unpacked, base=container)


def docx_huge_shared_part(unpacked: int = 300 * 1024 * 1024) -> bytes:
    """A DOCX with a huge (mostly zeros) custom XML part, as in a "259 KB DOCX"."""
    return with_big_part(F.docx_bytes(), part="customXml/item9.xml", unpacked=unpacked)


def xlsx_many_shared_strings(count: int = 3_000_000) -> bytes:
    """An XLSX whose shared-strings part holds ``count`` distinct strings (one sheet cell uses one)."""
    parts = {
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
            '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
            '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
            "</Types>"
        ),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
            "</Relationships>"
        ),
        "xl/workbook.xml": (
            '<?xml version="1.0" encoding="UTF-8"?><workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
            'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="S" sheetId="1" r:id="rId1"/></sheets></workbook>'
        ),
        "xl/_rels/workbook.xml.rels": (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
            '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
            "</Relationships>"
        ),
        "xl/worksheets/sheet1.xml": (
            '<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            '<sheetData><row r="1"><c r="A1" t="s"><v>0</v></c></row></sheetData></worksheet>'
        ),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, text in parts.items():
            z.writestr(name, text)
        with z.open("xl/sharedStrings.xml", "w", force_zip64=True) as out:
            out.write(
                f'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="{count}" uniqueCount="{count}">'.encode()
            )
            step = 100_000
            for start in range(0, count, step):
                out.write("".join(f"<si><t>s{i}</t></si>" for i in range(start, min(count, start + step))).encode())
            out.write(b"</sst>")
    return buf.getvalue()


def compressed_size(data: bytes) -> int:
    """Bytes of ``data`` deflated (for reports)."""
    return len(zlib.compress(data, 1))
