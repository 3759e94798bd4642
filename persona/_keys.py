"""Lorebook keys compiled to patterns: literal keys, ``/pattern/flags`` regex keys, Unicode rules.

Rules (checked at load time by :func:`compile_key`, applied by ``runtime/context/_lorebook.py``):

- **Normalization.** Keys and the scanned text are both put in Unicode NFKC before
  matching (:func:`normalize`), and only for matching: the prompt gets the text as
  written. NFKC rather than NFC because it also folds compatibility forms people
  type interchangeably: half-width katakana (``ﾈｺ`` = ``ネコ``), full-width Latin
  (``ｃａｔ`` = ``cat``), ligatures. Both sides take the same form, so an NFC key
  fires on NFD text and ``cafe`` never fires inside an NFD ``café`` (whose ``e`` and
  accent compose into one letter).
- **Literal keys** match case-insensitively (full case folding) unless the entry is
  case-sensitive. With whole-word matching (the default), an edge of the key that
  is a letter, digit, mark or ``_`` of a space-separated script must not touch
  another such character in the text, so ``cat`` fires on "my cat!" but not on
  "concatenate", and a combining mark counts as part of the letter before it.
- **Scripts written without spaces between words** get substring matching: there
  is no space to find a word edge by. Which characters those are is decided by
  Unicode properties, not by a list of languages: every character whose line
  breaking Unicode (UAX #14) does not base on spaces, ``Line_Break=Ideographic``
  (Han, Hiragana, Katakana incl. half-width, Yi, ...) or
  ``Line_Break=Complex_Context`` (Thai, Lao, Khmer, Myanmar, Tai Tham, Tai Le, New
  Tai Lue, Tai Viet, ...); the other scripts written without word spaces that UAX
  #14 classes as alphabetic (Tibetan, Javanese, Balinese, Buginese); and Hangul.
  Korean does separate words with spaces, but a space-separated unit carries its
  particles (``고양이가`` is "cat" plus a subject particle), so a whole-word ``고양이``
  would miss most mentions. An edge of a key in these scripts is never checked,
  and a character of these scripts never blocks the edge of a Latin key
  (``cat`` fires in ``我喜欢cat``).
- **Regex keys.** A key written ``/pattern/flags`` is a regular expression, as
  SillyTavern reads them and as the Character Card V3 spec writes a "regex
  pattern". Flags: ``i`` ignore case, ``m`` multiline, ``s`` dot matches newline,
  ``y`` match at the start of the text only; ``g``, ``u`` and ``d`` change nothing
  for a yes/no search. The entry's ``case_sensitive`` and whole-word options do not
  apply to a regex key: the pattern says what it means. A bare key is always
  literal, also when the entry sets ``use_regex: true``: SillyTavern writes
  ``use_regex: true`` on every entry it exports, with plain-text keys.
- **Catastrophic patterns.** A pattern is searched with a time limit
  (:data:`REGEX_TIMEOUT_S`; the ``regex`` package stops a search past it), and a
  search that runs out counts as no match. A limit rather than a syntactic
  rejection (of nested quantifiers, say) because no syntactic rule is both
  complete and free of false alarms: ``(a|aa)+$`` has no nested quantifier and is
  exponential, ``(\\w+\\s?)*`` has one and is fine on this engine.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass
from typing import Final

import regex

NORMAL_FORM: Final = "NFKC"
"""The Unicode normal form keys and scanned text are matched in."""

REGEX_TIMEOUT_S = 0.02
"""Longest one regex key may search one scanned text, seconds. The ``regex`` package checks the
limit now and then, not exactly (``docs/decisions/measurements.md#regex-key-timeout``)."""

_NOSPACE = (
    r"\p{Line_Break=Ideographic}\p{Line_Break=Complex_Context}"
    r"\p{Script=Hangul}\p{Script=Tibetan}\p{Script=Javanese}\p{Script=Balinese}\p{Script=Buginese}"
)
_SPACED_WORD = rf"(?:(?![{_NOSPACE}])[\p{{L}}\p{{M}}\p{{N}}_])"
"""A word character of a script that separates words with spaces."""
_SPACED_WORD_CHAR = regex.compile(_SPACED_WORD)
_BEFORE = rf"(?<!{_SPACED_WORD})"
_AFTER = rf"(?!{_SPACED_WORD})"
_NO_SPLIT = r"(?!(?!\p{Variation_Selector})\p{M})"
"""After a literal key: the text does not go on with a combining mark of the key's last letter."""
_REGEX_KEY = regex.compile(r"^/(.+)/([a-z]*)$", regex.DOTALL)
_FLAGS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL, "g": 0, "u": 0, "d": 0, "y": 0}


class InvalidKeyError(ValueError):
    """A key that cannot be compiled; the message says why (the loader names the entry)."""


@dataclass(frozen=True)
class CompiledKey:
    """One key, ready to search normalized text with."""

    key: str
    """The key as the card writes it."""
    pattern: regex.Pattern
    is_regex: bool
    needle: str = ""
    """Literal keys: text that must occur in the (case-folded, unless case-sensitive) text for the
    pattern to match; checked first, since a plain substring test is much cheaper."""
    folded: bool = False
    """True: :attr:`needle` is case-folded and is looked for in the case-folded text."""


def normalize(text: str) -> str:
    """``text`` in :data:`NORMAL_FORM`, the form keys and scanned text are compared in."""
    return unicodedata.normalize(NORMAL_FORM, text)


def is_regex_form(key: str) -> bool:
    """Whether ``key`` is written ``/pattern/flags`` (a regular expression where the entry allows them)."""
    return _REGEX_KEY.match(key.strip()) is not None


def compile_key(
    key: str, *, case_sensitive: bool = False, whole_words: bool = True, regex_allowed: bool = True
) -> CompiledKey:
    """``key`` as a pattern over :func:`normalize`-d text, under the rules of this module.

    Args:
        regex_allowed: False (an entry with ``use_regex: false``): a ``/pattern/flags`` key is literal text.

    Raises:
        InvalidKeyError: a ``/pattern/flags`` key whose pattern does not compile or whose
            flags are not among ``dgimsuy``.
    """
    found = _REGEX_KEY.match(key.strip()) if regex_allowed else None
    if found is not None:
        return CompiledKey(key=key, pattern=_compile_regex(found.group(1), found.group(2)), is_regex=True)
    text = normalize(key)
    body = regex.escape(text, special_only=True)
    left = _BEFORE if whole_words and _SPACED_WORD_CHAR.fullmatch(text[0]) else ""
    right = _AFTER if whole_words and _SPACED_WORD_CHAR.fullmatch(text[-1]) else ""
    flags = 0 if case_sensitive else regex.IGNORECASE | regex.FULLCASE
    return CompiledKey(
        key=key,
        pattern=regex.compile(left + body + right + _NO_SPLIT, flags),
        is_regex=False,
        needle=text if case_sensitive else text.casefold(),
        folded=not case_sensitive,
    )


@functools.lru_cache(maxsize=4096)
def compiled(key: str, *, case_sensitive: bool, whole_words: bool, regex_allowed: bool) -> CompiledKey:
    """:func:`compile_key`, cached (the same card's keys are matched every turn)."""
    return compile_key(key, case_sensitive=case_sensitive, whole_words=whole_words, regex_allowed=regex_allowed)


def _compile_regex(source: str, flags: str) -> regex.Pattern:
    unknown = sorted(set(flags) - set(_FLAGS))
    if unknown:
        raise InvalidKeyError(f"unknown regex flag(s) {''.join(unknown)!r} (allowed: dgimsuy)")
    value = 0
    for flag in flags:
        value |= _FLAGS[flag]
    if "y" in flags:
        source = rf"\A(?:{source})"
    try:
        raw = regex.compile(source, value)
    except regex.error as exc:
        raise InvalidKeyError(f"the regular expression does not compile ({exc})") from exc
    try:  # match in the same form as the text; a pattern NFKC breaks (a half-width range, say) stays as written
        return regex.compile(normalize(source), value)
    except regex.error:
        return raw


def search(key: CompiledKey, text: str) -> bool:
    """True if ``key`` occurs in ``text`` (already normalized).

    Raises:
        TimeoutError: a regex key searched longer than :data:`REGEX_TIMEOUT_S`.
    """
    if key.is_regex:
        return key.pattern.search(text, timeout=REGEX_TIMEOUT_S) is not None
    if key.needle not in (_casefold(text) if key.folded else text):
        return False
    return key.pattern.search(text) is not None


@functools.lru_cache(maxsize=16)
def _casefold(text: str) -> str:
    return text.casefold()
