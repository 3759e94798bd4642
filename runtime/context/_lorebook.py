"""Lorebook matching: which entries of a character's book fire for the current message. Pure.

Rules (after SillyTavern's world info and the Character Card V3 spec):

- The scanned text is the current user message plus the ``depth`` turns before it
  (``COMPANION_LOREBOOK_SCAN_DEPTH``, default 2; a card's ``character_book.scan_depth``
  wins when it sets one, and an entry's own scan depth wins over both).
- Keys and scanned text are compared in Unicode NFKC; literal keys match as whole
  words, case-insensitively, except in scripts written without spaces, where they
  match as substrings; ``/pattern/flags`` keys are regular expressions, searched
  with a time limit. ``case_sensitive`` and ``match_whole_words`` apply per entry.
  See ``persona/_keys.py`` for the details and their reasons.
- ``constant`` entries and ``@@activate`` ones always fire; disabled and
  ``@@dont_activate`` ones never (``@@activate`` wins).
- ``selective`` entries need a primary key and their secondary keys under
  ``selective_logic``: AND_ANY (any secondary), AND_ALL (all), NOT_ANY (none), NOT_ALL
  (not all). A selective entry without secondary keys fires on its primary keys.
  ``@@additional_keys`` (one must be there too) and ``@@exclude_keys`` (none may be)
  apply to every entry that has them.
- Order: by ``insertion_order`` (lower first, the V2 spec's meaning), ties in card order;
  entries placed before the character come first. ``priority`` does not move an entry;
  it decides which entries stay when the retrieval budget is short (:func:`admission_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import structlog

from persona import CompiledKey, Lorebook, LoreEntry, entry_keys, normalize, search

log = structlog.get_logger("companion.lorebook")
_timed_out: set[str] = set()
"""Regex keys that ran out of time once (logged once each)."""


@dataclass(frozen=True, kw_only=True)
class FiredEntry:
    """An entry that fired, with why."""

    entry: LoreEntry
    index: int
    """Its position in the card's list."""
    key: str | None
    """The primary key that matched (``None`` for a constant entry)."""


def key_matches(key: str, text: str, *, case_sensitive: bool = False, match_whole_words: bool = True) -> bool:
    """True if ``key`` occurs in ``text`` under the rules above (``text`` as written, not normalized)."""
    if not key:
        return False
    entry = LoreEntry(keys=(key,), content="", case_sensitive=case_sensitive, match_whole_words=match_whole_words)
    return _any(entry_keys(entry, (key,)), normalize(text), entry) is not None


@dataclass(frozen=True)
class Scan:
    """The text a lorebook is matched against: the current message and the turns before it."""

    current: str
    previous: Sequence[str] = ()
    """Earlier turns, oldest first."""
    depth: int = 2
    """Turns before the current message scanned by default."""

    def text(self, depth: int | None = None) -> str:
        """The scanned text, normalized, for ``depth`` turns back (default: :attr:`depth`)."""
        return normalize(scan_text(self.current, self.previous, self.depth if depth is None else depth))


def _any(keys: Sequence[CompiledKey], text: str, entry: LoreEntry) -> str | None:
    """The first key found in ``text`` (normalized), or ``None``. A regex key that runs out of time
    counts as not found (logged once per key)."""
    for key in keys:
        try:
            if search(key, text):
                return key.key
        except TimeoutError:
            if key.key not in _timed_out:
                _timed_out.add(key.key)
                log.warning("lorebook.regex_timeout", entry=entry.name or None, key_chars=len(key.key))
    return None


def _secondary_ok(entry: LoreEntry, text: str) -> bool:
    if entry.additional_keys and _any(entry_keys(entry, entry.additional_keys), text, entry) is None:
        return False
    if entry.exclude_keys and _any(entry_keys(entry, entry.exclude_keys), text, entry) is not None:
        return False
    if not entry.selective or not entry.secondary_keys:
        return True
    hits = [_any(entry_keys(entry, (k,)), text, entry) is not None for k in entry.secondary_keys]
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


def match_entries(book: Lorebook | None, scan: str | Scan) -> list[FiredEntry]:
    """The entries of ``book`` that fire on ``scan`` (a :class:`Scan`, or the text itself, which
    then stands for every depth), in prompt order: entries placed before the character first,
    then by ``insertion_order``, then card order."""
    if book is None:
        return []
    if isinstance(scan, str):
        scan = Scan(current=scan, previous=(), depth=0)
    texts: dict[int | None, str] = {}

    def text_for(entry: LoreEntry) -> str:
        depth = entry.scan_depth
        if depth not in texts:
            texts[depth] = scan.text(depth)
        return texts[depth]

    fired = []
    for index, entry in enumerate(book.entries):
        if not entry.enabled or not entry.content:
            continue
        if entry.activate:
            fired.append(FiredEntry(entry=entry, index=index, key=None))
            continue
        if entry.dont_activate:
            continue
        text = text_for(entry)
        if entry.constant:
            if _secondary_ok(replace(entry, selective=False), text):
                fired.append(FiredEntry(entry=entry, index=index, key=None))
            continue
        key = _any(entry_keys(entry, entry.keys), text, entry)
        if key is not None and _secondary_ok(entry, text):
            fired.append(FiredEntry(entry=entry, index=index, key=key))
    return sorted(fired, key=lambda f: (f.entry.placement != "before_char", f.entry.insertion_order, f.index))


def admission_order(fired: Sequence[FiredEntry]) -> list[FiredEntry]:
    """The order in which fired entries claim the budget: ``@@ignore_on_max_context`` entries
    last, constant entries first, then by ``priority`` (higher first; an entry without one
    counts as 0), then prompt order."""
    return sorted(
        fired,
        key=lambda f: (
            f.entry.ignore_on_max_context,
            not f.entry.constant,
            -(f.entry.priority or 0),
            f.entry.insertion_order,
            f.index,
        ),
    )
