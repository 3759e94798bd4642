"""Print the non-ASCII characters that the bundled tokenizers encode in fewer tokens than bytes.

Usage::

    python scripts/single_token_chars.py 1   # SINGLE_TOKEN_CHARS
    python scripts/single_token_chars.py 2   # TWO_TOKEN_CHARS
    python scripts/single_token_chars.py 3   # THREE_TOKEN_CHARS

The results are :data:`runtime.accounting._tables.SINGLE_TOKEN_CHARS`, ``TWO_TOKEN_CHARS`` and
``THREE_TOKEN_CHARS`` (as regular-expression ranges; planes 0-3). A character qualifies for ``N`` when cl100k_base, o200k_base and the
DeepSeek tokenizer bundled with litellm each encode it, alone, in at most ``N`` tokens (exactly ``N``
for the largest), ``N`` is less than its UTF-8 length, and it is a letter, digit, punctuation mark or
symbol (Unicode categories L*, N*, P*, S*): combining marks, format characters, private-use and
whitespace characters attach to their neighbours and are left out.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm / tiktoken)
from runtime.accounting._exact import _exact_counter  # noqa: E402


@functools.cache
def largest_counts() -> dict[str, int]:
    """Every non-ASCII letter, digit, punctuation mark and symbol of planes 0-3 → the largest of its
    counts (alone) in the three bundled tokenizers."""
    counters = [_exact_counter(kind).count_text for kind in ("cl100k_base", "o200k_base", "deepseek")]
    counts = {}
    for code in range(0x80, 0x40000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF or unicodedata.category(char)[0] not in "LNPS":
            continue
        counts[char] = max(count(char) for count in counters)
    return counts


def chars_costing(tokens: int) -> list[str]:
    """Non-ASCII letters, digits, punctuation and symbols whose largest count is ``tokens`` (< bytes)."""
    return [c for c, n in largest_counts().items() if n == tokens and tokens < len(c.encode("utf-8"))]


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def ranges(chars: list[str]) -> str:
    """``chars`` as regular-expression class ranges with ``\\uXXXX`` escapes."""
    codes = sorted(ord(c) for c in chars)
    out, start, prev = [], codes[0], codes[0]
    for code in codes[1:] + [None]:
        if code is not None and code == prev + 1:
            prev = code
            continue
        out.append(_escape(start) if start == prev else f"{_escape(start)}-{_escape(prev)}")
        if code is not None:
            start = prev = code
    return "".join(out)


if __name__ == "__main__":
    found = chars_costing(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(len(found), file=sys.stderr)
    line = ""
    for piece in re.split(r"(?=\\[uU])", ranges(found))[1:]:
        if len(line) + len(piece) > 96:
            print(f'    "{line}"')
            line = ""
        line += piece
    print(f'    "{line}"')
