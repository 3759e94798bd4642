"""Validation of incoming message text, before anything is stored."""

from __future__ import annotations

from errors import InvalidMessageError


def validate_message(raw: str | bytes, *, max_chars: int) -> str:
    """Return ``raw`` as a ``str`` fit to store, or raise before anything is written.

    Args:
        raw: the message; ``bytes`` must be UTF-8.
        max_chars: the longest accepted message, in characters.

    Raises:
        InvalidMessageError: with ``reason``

            - ``invalid_utf8``: bytes that are not UTF-8, or a ``str`` holding lone
              surrogates (what undecodable bytes become under ``surrogateescape``);
              ``position`` is the byte or character offset;
            - ``nul_byte``: a NUL (U+0000) character, which PostgreSQL text cannot hold;
            - ``too_large``: more than ``max_chars`` characters;
            - ``empty``: nothing but whitespace.
    """
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessageError(
                f"The message is not valid UTF-8: byte {exc.start} ({bytes(raw)[exc.start : exc.start + 1]!r}) "
                "cannot be decoded. Send the text encoded as UTF-8.",
                reason="invalid_utf8",
                position=exc.start,
            ) from None
    elif isinstance(raw, str):
        text = raw
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessageError(
                f"The message is not valid UTF-8: character {exc.start} is a lone surrogate "
                f"({text[exc.start]!r}), usually an undecodable byte. Decode the input as UTF-8 first.",
                reason="invalid_utf8",
                position=exc.start,
            ) from None
    else:
        raise InvalidMessageError(
            f"A message must be str or UTF-8 bytes, not {type(raw).__name__}.", reason="invalid_type"
        )
    nul = text.find("\x00")
    if nul >= 0:
        raise InvalidMessageError(
            f"The message contains a NUL byte at character {nul}; NUL cannot be stored. Remove it and send again.",
            reason="nul_byte",
            position=nul,
        )
    if len(text) > max_chars:
        raise InvalidMessageError(
            f"The message is {len(text)} characters long; the limit is {max_chars} "
            "(COMPANION_MAX_MESSAGE_CHARS). Send it as an attachment or in parts.",
            reason="too_large",
        )
    if not text.strip():
        raise InvalidMessageError("The message is empty.", reason="empty")
    return text
