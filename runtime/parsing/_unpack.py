"""The unpack budget of one parse: bounds that hold across every nesting level together.

Every ZIP container met during one parse (the upload, a ZIP inside it, and DOCX, XLSX,
PPTX and EPUB files, which are ZIPs too) draws on ONE :class:`UnpackBudget`: the bytes
its members declare unpacked, and the count of members. Each member is also checked on
its own: its unpacked size (an XML part the Office libraries must parse whole) and its
compression ratio (the mark of a ZIP bomb). The checks read only the central directory,
before any library decompresses anything; ``zipfile`` never yields more bytes than a
member declares, so the declared sizes bound the work.

Raises :class:`~errors.FileParseError` with reason ``too_large``.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

from errors import FileParseError

RATIO_FLOOR_BYTES = 1024 * 1024
"""Members smaller than this (unpacked, bytes) are not held to the ratio: small parts compress oddly."""


@dataclass(kw_only=True)
class UnpackBudget:
    """What one parse may still unpack. Mutable: every container of the parse draws on it."""

    max_bytes: int
    """Unpacked bytes of all members of all containers of the parse, together, bytes."""
    max_members: int
    """Members of all containers of the parse, together."""
    max_ratio: float
    """Largest unpacked/compressed ratio of one member (over :data:`RATIO_FLOOR_BYTES`)."""
    max_part_bytes: int
    """Largest unpacked size of one member, bytes."""
    used_bytes: int = 0
    used_members: int = 0

    def _refuse(self, name: str, what: str) -> FileParseError:
        return FileParseError(f"{name}: {what}; not unpacked.", reason="too_large")

    def check_members(self, infos: list[zipfile.ZipInfo], *, name: str) -> None:
        """Check ``infos`` one by one (size, ratio) and draw them from the budget (count, bytes)."""
        for info in infos:
            if info.file_size > self.max_part_bytes:
                raise self._refuse(
                    name,
                    f"member {info.filename!r} unpacks to {info.file_size:,} bytes, more than the {self.max_part_bytes:,} allowed for one member",
                )
            if info.file_size >= RATIO_FLOOR_BYTES and info.file_size > self.max_ratio * max(info.compress_size, 1):
                ratio = info.file_size / max(info.compress_size, 1)
                raise self._refuse(
                    name,
                    f"member {info.filename!r} is compressed {ratio:,.0f}:1, more than the {self.max_ratio:g}:1 allowed (a ZIP bomb)",
                )
        count = len(infos)
        size = sum(i.file_size for i in infos)
        if self.used_members + count > self.max_members:
            raise self._refuse(
                name,
                f"the file holds {self.used_members + count:,} archive members in all, more than the {self.max_members:,} allowed",
            )
        if self.used_bytes + size > self.max_bytes:
            raise self._refuse(
                name,
                f"the file unpacks to {self.used_bytes + size:,} bytes in all (nested archives included), more than the {self.max_bytes:,} allowed",
            )
        self.used_members += count
        self.used_bytes += size

    def check_container(self, data: bytes, *, name: str, kind: str) -> None:
        """Check a DOCX, XLSX, PPTX or EPUB (all ZIPs) before its library opens it: every member
        counts. A container that is not a ZIP is left to the library (it says "corrupt")."""
        try:
            infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return
        self.check_members([i for i in infos if not i.is_dir()], name=f"{name} ({kind})")
