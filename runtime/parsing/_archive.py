"""ZIP archives: page 1 is the catalog (one line per member), then each member's pages,
parsed by format, recursively up to a depth limit. The body starts after the catalog.

Members are bounded by the parse's :class:`~runtime.parsing._unpack.UnpackBudget` (count,
each member's size and compression ratio, total unpacked size), which nested archives
share, so a small archive cannot unpack into gigabytes at any depth.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

from errors import FileParseError
from runtime.parsing._extract import Extract
from runtime.parsing._unpack import UnpackBudget

MAX_MEMBERS = 500
"""Members read from one archive; the catalog says when there were more."""


def parse_zip(
    data: bytes,
    *,
    name: str,
    budget: UnpackBudget,
    parse_member: Callable[[bytes, str], Extract],
) -> Extract:
    """Raises FileParseError: ``corrupt`` (not a ZIP), ``too_large`` (past the parse's unpack
    budget, here or in a nested archive: the whole parse stops)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = [i for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise FileParseError(f"{name}: the ZIP archive is corrupt ({exc}).", reason="corrupt") from exc
    budget.check_members(infos[:MAX_MEMBERS], name=name)
    catalog = [f"Archive {name}: {len(infos)} member(s)"]
    pages: list[str] = []
    too_deep = 0  # members left unread on purpose (the depth limit): not a failure of the archive
    for info in infos[:MAX_MEMBERS]:
        member = info.filename
        first_page = len(pages) + 2  # page 1 is the catalog
        if info.flag_bits & 0x1:
            catalog.append(f"- {member} ({info.file_size:,} bytes): encrypted, not read")
            continue
        try:
            content = archive.read(info)
            inner = parse_member(content, member)
        except FileParseError as exc:
            if exc.reason == "too_large":  # the parse's budget is spent: stop the whole parse
                raise
            catalog.append(f"- {member} ({info.file_size:,} bytes): not read: {exc}")
            too_deep += exc.reason == "too_deep"
            continue
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, ValueError) as exc:
            catalog.append(f"- {member} ({info.file_size:,} bytes): not read: {type(exc).__name__}: {exc}")
            continue
        member_pages = inner.pages or [""]
        for k, page in enumerate(member_pages, start=1):
            header = f"[{member}" + (f", page {k} of {len(member_pages)}]" if len(member_pages) > 1 else "]")
            pages.append(f"{header}\n{page}".rstrip())
        note = " (scanned, needs OCR)" if inner.needs_ocr else ""
        span = (
            f"page {first_page}"
            if len(member_pages) == 1
            else f"pages {first_page}-{first_page + len(member_pages) - 1}"
        )
        catalog.append(f"- {member} ({info.file_size:,} bytes): {span}{note}")
    if infos and not pages and not too_deep:
        encrypted = all(i.flag_bits & 0x1 for i in infos[:MAX_MEMBERS])
        raise FileParseError(
            f"{name}: no member of the archive could be read"
            + (" (all are encrypted; upload an unencrypted archive)." if encrypted else ": " + "; ".join(catalog[1:4])),
            reason="encrypted" if encrypted else "corrupt",
        )
    if len(infos) > MAX_MEMBERS:
        catalog.append(f"[only the first {MAX_MEMBERS} of {len(infos)} members were read]")
    return Extract(pages=["\n".join(catalog), *pages], body_start_page=2 if pages else None)
