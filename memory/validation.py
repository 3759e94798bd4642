"""Rules for text the runtime stores as given: ids, names and free-text fields.

One rule for every entry point (HTTP API, command line, Python API): :func:`check_text` for any
text field, :func:`check_name` for a name or an id being created, :func:`check_id` for an id
being looked up. Importing this module loads no storage library (the command line checks its
id arguments with it before anything else is imported).
"""

from __future__ import annotations

from errors import InvalidFieldError

MAX_ID_CHARS = 200
"""Longest app name or external user id, characters (the columns' size)."""


def check_text(value: object, *, field: str, max_chars: int | None = None) -> str:
    """``value`` if it is text that can be stored: a ``str`` with no NUL (U+0000, which
    PostgreSQL text cannot hold), no lone surrogate (not encodable as UTF-8) and at most
    ``max_chars`` characters. The message's rules (:func:`runtime.turn.validate_message`),
    for every other text field.

    Raises:
        InvalidFieldError: naming ``field``, with ``reason`` ``nul_byte``, ``invalid_utf8`` or ``too_long``.
    """
    if not isinstance(value, str):
        raise InvalidFieldError(
            f"{field} must be a string, not {type(value).__name__}.", field=field, reason="invalid_type"
        )
    nul = value.find("\x00")
    if nul >= 0:
        raise InvalidFieldError(
            f"{field} contains a NUL byte at character {nul}; NUL cannot be stored.", field=field, reason="nul_byte"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidFieldError(
            f"{field} is not valid UTF-8: character {exc.start} is a lone surrogate.",
            field=field,
            reason="invalid_utf8",
        ) from None
    if max_chars is not None and len(value) > max_chars:
        raise InvalidFieldError(
            f"{field} is {len(value)} characters; at most {max_chars} are allowed.", field=field, reason="too_long"
        )
    return value


def check_name(value: str, *, field: str) -> str:
    """``value`` stripped, if it is a usable id or name: 1–200 printable characters
    (and :func:`check_text`'s rules).

    Raises:
        InvalidFieldError: empty, too long, NUL, a lone surrogate, or control characters.
    """
    cleaned = check_text(value, field=field).strip()
    if not cleaned:
        raise InvalidFieldError(f"{field} must be a non-empty string.", field=field, reason="empty")
    if len(cleaned) > MAX_ID_CHARS:
        raise InvalidFieldError(
            f"{field} is {len(cleaned)} characters; at most {MAX_ID_CHARS} are allowed.", field=field, reason="too_long"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in cleaned):
        raise InvalidFieldError(
            f"{field} must not contain control characters.", field=field, reason="control_character"
        )
    return cleaned


def check_id(value: object, *, field: str) -> str:
    """An id used for a lookup: :func:`check_text` with the id columns' size (200 characters)."""
    return check_text(value, field=field, max_chars=MAX_ID_CHARS)
