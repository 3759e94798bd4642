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

Matching stays linear in the text scanned, however large the book: each book gets a
:class:`BookIndex` once (per loaded book, kept while the book is), with one Aho-Corasick
automaton over the literal keys' texts. A turn runs the automaton over the deepest text it
scans, once; only the entries whose primary keys occur in it (and constant, ``@@activate`` and
regular-expression entries) are then checked under the rules above, and a literal key's pattern
is compiled the first time its text occurs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import ahocorasick
import structlog

from persona import CompiledKey, Lorebook, LoreEntry, entry_keys, is_regex_form, normalize, search

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


def _secondary_ok(entry: LoreEntry, text: str, keys: _EntryKeys) -> bool:
    if entry.additional_keys and _any(keys.additional(), text, entry) is None:
        return False
    if entry.exclude_keys and _any(keys.exclude(), text, entry) is not None:
        return False
    if not entry.selective or not entry.secondary_keys:
        return True
    hits = [_any((k,), text, entry) is not None for k in keys.secondary()]
    return {
        "AND_ANY": any(hits),
        "AND_ALL": all(hits),
        "NOT_ANY": not any(hits),
        "NOT_ALL": not all(hits),
    }[entry.selective_logic]


class _EntryKeys:
    """One entry's keys, each kind compiled the first time it is needed, then kept."""

    def __init__(self, entry: LoreEntry) -> None:
        self.entry = entry
        self._compiled: dict[str, list[CompiledKey]] = {}

    def _kind(self, kind: str, keys: tuple[str, ...]) -> list[CompiledKey]:
        found = self._compiled.get(kind)
        if found is None:
            found = self._compiled[kind] = entry_keys(self.entry, keys)
        return found

    def primary(self) -> list[CompiledKey]:
        return self._kind("keys", self.entry.keys)

    def secondary(self) -> list[CompiledKey]:
        return self._kind("secondary", self.entry.secondary_keys)

    def additional(self) -> list[CompiledKey]:
        return self._kind("additional", self.entry.additional_keys)

    def exclude(self) -> list[CompiledKey]:
        return self._kind("exclude", self.entry.exclude_keys)


class BookIndex:
    """A lorebook prepared for matching: one Aho-Corasick automaton over the texts of the literal
    primary keys (case-folded for case-insensitive keys, as :func:`persona.search` compares them),
    the entries each key text belongs to, and the entries always checked (constant, ``@@activate``,
    a regular-expression or empty primary key). Building it is linear in the book's keys and
    compiles no pattern."""

    def __init__(self, book: Lorebook) -> None:
        self.keys = [_EntryKeys(entry) for entry in book.entries]
        self.always: list[int] = []
        self.by_text: dict[tuple[bool, str], list[int]] = {}
        """(case-folded?, key text) → indexes of the entries with a literal primary key of that text."""
        folded, exact = ahocorasick.Automaton(), ahocorasick.Automaton()
        for index, entry in enumerate(book.entries):
            if not entry.enabled or not entry.content or entry.dont_activate and not entry.activate:
                continue
            if entry.activate or entry.constant:
                self.always.append(index)
                continue
            for key in entry.keys:
                if entry.use_regex is not False and is_regex_form(key) or not normalize(key):
                    self.always.append(index)
                    break
                fold = not entry.case_sensitive
                text = normalize(key).casefold() if fold else normalize(key)
                self.by_text.setdefault((fold, text), []).append(index)
                (folded if fold else exact).add_word(text, text)
        self.always = sorted(set(self.always))
        for automaton in (folded, exact):
            if len(automaton):
                automaton.make_automaton()
        self._folded = folded if len(folded) else None
        self._exact = exact if len(exact) else None
        self.deepest_entry_scan: int | None = max(
            (e.scan_depth for e in book.entries if e.scan_depth is not None), default=None
        )
        """The deepest scan depth an entry sets for itself (``None``: no entry sets one)."""

    def candidates(self, text: str) -> list[int]:
        """Indexes (card order) of the entries that may fire on ``text`` (normalized, the deepest
        scanned): those a literal primary key of which occurs in it, and those always checked."""
        found: set[int] = set(self.always)
        for automaton, haystack, fold in ((self._folded, text.casefold(), True), (self._exact, text, False)):
            if automaton is None:
                continue
            for key_text in {value for _, value in automaton.iter(haystack)}:
                found.update(self.by_text[(fold, key_text)])
        return sorted(found)


_INDEXES: dict[int, tuple[weakref.ref[Lorebook], BookIndex]] = {}
_INDEXES_LOCK = threading.Lock()


def book_index(book: Lorebook) -> BookIndex:
    """The :class:`BookIndex` of ``book``, built on first use and kept while the book object lives
    (by identity: a new revision of a card is a new object with its own index)."""
    key = id(book)
    with _INDEXES_LOCK:
        held = _INDEXES.get(key)
        if held is not None and held[0]() is book:
            return held[1]
    index = BookIndex(book)

    def forget(_: weakref.ref[Lorebook]) -> None:
        _INDEXES.pop(key, None)

    with _INDEXES_LOCK:
        _INDEXES[key] = (weakref.ref(book, forget), index)
    return index


def scan_text(current: str, previous: Sequence[str], depth: int) -> str:
    """The text to scan: the ``depth`` newest of ``previous`` (oldest first) and ``current``."""
    window = list(previous)[-depth:] if depth > 0 else []
    return "\n".join([*window, current])


def match_entries(book: Lorebook | None, scan: str | Scan) -> list[FiredEntry]:
    """The entries of ``book`` that fire on ``scan`` (a :class:`Scan`, or the text itself, which
    then stands for every depth), in prompt order: entries placed before the character first,
    then by ``insertion_order``, then card order. Linear in the text scanned (:class:`BookIndex`)."""
    if book is None:
        return []
    if isinstance(scan, str):
        scan = Scan(current=scan, previous=(), depth=0)
    texts: dict[int | None, str] = {}

    def text_for(depth: int | None) -> str:
        if depth not in texts:
            texts[depth] = scan.text(depth)
        return texts[depth]

    index = book_index(book)
    # every entry's text is a suffix of the deepest one
    deepest = max(scan.depth, index.deepest_entry_scan if index.deepest_entry_scan is not None else scan.depth)
    fired = []
    for i in index.candidates(text_for(deepest)):
        entry, keys = book.entries[i], index.keys[i]
        if entry.activate:
            fired.append(FiredEntry(entry=entry, index=i, key=None))
            continue
        text = text_for(entry.scan_depth)
        if entry.constant:
            if _secondary_ok(replace(entry, selective=False), text, keys):
                fired.append(FiredEntry(entry=entry, index=i, key=None))
            continue
        key = _any(keys.primary(), text, entry)
        if key is not None and _secondary_ok(entry, text, keys):
            fired.append(FiredEntry(entry=entry, index=i, key=key))
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
