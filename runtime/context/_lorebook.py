"""Lorebook matching: which entries of a character's book fire for the current message. Pure.

Rules (after SillyTavern's world info, simplified):

- The scanned text is the current user message plus the ``depth`` turns before it
  (``COMPANION_LOREBOOK_SCAN_DEPTH``, default 2; a card's ``character_book.scan_depth``
  wins when it sets one).
- A key made only of non-CJK characters matches as a whole word, case-insensitively
  (unless the entry is ``case_sensitive``): it must not touch a letter, digit or ``_``
  on either side, so ``cat`` fires on "my cat!" but not on "concatenate". A key holding
  any CJK character (Han, kana, Hangul) matches as a plain substring, since those
  scripts write words without spaces.
- ``constant`` entries always fire; disabled ones never.
- ``selective`` entries need a primary key and their secondary keys under
  ``selective_logic``: AND_ANY (any secondary), AND_ALL (all), NOT_ANY (none), NOT_ALL
  (not all). A selective entry without secondary keys fires on its primary keys.
- Order: by ``insertion_order`` (lower first, the V2 spec's meaning), ties in card order.
  ``priority`` does not move an entry; it decides which entries stay when the
  retrieval budget is short (:func:`admission_order`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from persona import LoreEntry, Lorebook

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
"""Hiragana, Katakana, Han (CJK Unified Ideographs, Extension A, Compatibility), Hangul syllables;
the same ranges as the archive's full-text bigrams (migration 0002)."""


@dataclass(frozen=True, kw_only=True)
class FiredEntry:
    """An entry that fired, with why."""

    entry: LoreEntry
    index: int
    """Its position in the card's list."""
    key: str | None
    """The primary key that matched (``None`` for a constant entry)."""


def key_matches(key: str, text: str, *, case_sensitive: bool = False) -> bool:
    """True if ``key`` occurs in ``text`` under the rules above (whole word, or substring for CJK)."""
    if not key:
        return False
    if _CJK.search(key):
        return key in text if case_sensitive else key.casefold() in text.casefold()
    pattern = r"(?<![\w])" + re.escape(key) + r"(?![\w])"
    return re.search(pattern, text, 0 if case_sensitive else re.IGNORECASE) is not None


def _secondary_ok(entry: LoreEntry, text: str) -> bool:
    if not entry.selective or not entry.secondary_keys:
        return True
    hits = [key_matches(k, text, case_sensitive=bool(entry.case_sensitive)) for k in entry.secondary_keys]
    return {
        "AND_ANY": any(hits),
        "AND_ALL": all(hits),
        "NOT_ANY": not any(hits),
        "NOT_ALL": not all(hits),
    }[entry.selective_logic]


def scan_text(current: str, previous: Sequence[str], depth: int) -> str:
    """The text to scan: the ``depth`` newest of ``previous`` (oldest first) and ``current``."""
    window = list(previous)[-depth:] if depth > 0 else []
    return "\n".join([*window, current])


def match_entries(book: Lorebook | None, text: str) -> list[FiredEntry]:
    """The entries of ``book`` that fire on ``text``, in prompt order (``insertion_order``, then card order)."""
    if book is None:
        return []
    fired = []
    for index, entry in enumerate(book.entries):
        if not entry.enabled or not entry.content:
            continue
        if entry.constant:
            fired.append(FiredEntry(entry=entry, index=index, key=None))
            continue
        key = next((k for k in entry.keys if key_matches(k, text, case_sensitive=bool(entry.case_sensitive))), None)
        if key is not None and _secondary_ok(entry, text):
            fired.append(FiredEntry(entry=entry, index=index, key=key))
    return sorted(fired, key=lambda f: (f.entry.insertion_order, f.index))


def admission_order(fired: Sequence[FiredEntry]) -> list[FiredEntry]:
    """The order in which fired entries claim the budget: constant entries first, then by
    ``priority`` (higher first; an entry without one counts as 0), then prompt order."""
    return sorted(
        fired, key=lambda f: (not f.entry.constant, -(f.entry.priority or 0), f.entry.insertion_order, f.index)
    )
