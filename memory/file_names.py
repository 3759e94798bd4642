"""File names and kinds: MIME sniffing from the bytes, safe file names, new file ids. No database."""

from __future__ import annotations

import io
import mimetypes
import secrets
import unicodedata
import zipfile

from errors import FileInputError, FileNotFound

MAX_NAME_CHARS = 255
"""Longest file name kept, characters (the usual file-system limit)."""

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"PK\x05\x06", "application/zip"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
)
_OOXML = {
    "word/": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "ppt/": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "xl/": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}
EPUB_MIME = "application/epub+zip"


def new_file_id() -> str:
    """A fresh file id: ``file_`` plus 20 random hex characters."""
    return "file_" + secrets.token_hex(10)


def sniff_mime(data: bytes, name: str) -> str:
    """The MIME type of ``data``: from its magic bytes first, then from ``name``'s extension.

    ZIP containers are told apart by their members: ``mimetype`` (EPUB) and the
    ``word/``, ``ppt/``, ``xl/`` folders of Office Open XML. Unknown bytes that decode
    as UTF-8 without NUL bytes are ``text/plain``; anything else ``application/octet-stream``.
    """
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            if mime == "application/zip":
                return _zip_kind(data) or mime
            return mime
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed:
        return guessed
    head = data[:4096]
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "text/plain"
        except UnicodeDecodeError as exc:
            if exc.start >= len(head) - 4:  # a multi-byte character cut by the 4096-byte window
                return "text/plain"
    return "application/octet-stream"


def _zip_kind(data: bytes) -> str | None:

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            if "mimetype" in names and archive.read("mimetype").strip() == EPUB_MIME.encode():
                return EPUB_MIME
    except (zipfile.BadZipFile, OSError, KeyError, RuntimeError, NotImplementedError):
        return None
    for prefix, mime in _OOXML.items():
        if any(n.startswith(prefix) for n in names) and "[Content_Types].xml" in names:
            return mime
    return None


def clean_name(name: str) -> str:
    """The file name to store: the last path component, NFC-normalised, stripped.

    Raises:
        FileInputError: ``bad_name`` for an empty name, ``.``/``..``, control characters
            or NUL, or more than :data:`MAX_NAME_CHARS` characters.
    """
    base = unicodedata.normalize("NFC", str(name)).replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not base or base in (".", ".."):
        raise FileInputError(
            f"The file name {name!r} is empty; give the file a name such as notes.txt.", reason="bad_name"
        )
    if any(unicodedata.category(ch) == "Cc" for ch in base):
        raise FileInputError(f"The file name {name!r} contains control characters; rename the file.", reason="bad_name")
    if len(base) > MAX_NAME_CHARS:
        raise FileInputError(
            f"The file name is {len(base)} characters long; at most {MAX_NAME_CHARS} are allowed. Rename the file.",
            reason="bad_name",
        )
    return base


def _not_found(file_id: object) -> str:
    return (
        f"No file {str(file_id)!r} for this user. Check the id (ids look like file_0123456789abcdef0123), "
        "or upload the file again."
    )


def file_not_found(file_id: object) -> FileNotFound:
    """The one :class:`FileNotFound` for an unknown or foreign id (the same message for both)."""
    return FileNotFound(_not_found(file_id), file_id=str(file_id))
