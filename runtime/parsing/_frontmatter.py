"""Where a document's body starts: the table-of-contents heuristic and front-matter titles.

The heuristic scores each of the first pages on several signals and calls a page a
table of contents only when the combined score reaches :data:`TOC_THRESHOLD`; every
single signal scores below it, so no one signal decides. The signals:

- a "Contents" / "Table of contents" / "目录" (also 目 录, 目次, Inhalt, Sommaire, Índice)
  heading among the first lines;
- dot leaders (``.....``, ``…``, ``·····``) between titles and numbers;
- lines ending in a page number;
- trailing numbers that rise from entry to entry and stay plausible page numbers;
- numbered entries (``1.``, ``2.3``, ``Chapter 4``, ``第三章``, roman numerals);
- a table of contents flattened onto one line: four or more "title ... number" runs in
  one line (what text extraction often makes of a contents page); the runs are then
  scored as entries.

The body starts on the page after the last table-of-contents page found among the
first pages (a run of them may follow a title page). The weights and the threshold
are our own, tuned on the fixtures in ``tests/file_fixtures.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOC_THRESHOLD = 3.0
"""Score from which a page counts as a table of contents."""
SCAN_PAGES = 12
"""Pages scanned from the front (at most a third of the document, at least 1)."""

W_HEADING = 2.0
"""A contents heading among the first lines."""
W_DOT_LEADERS = 2.0
"""Dot leaders on half of the entries or more (scaled below that)."""
W_TRAILING_NUMBERS = 1.5
"""Entries ending in a number, on 60% of them or more (scaled below that)."""
W_ASCENDING = 1.0
"""Those trailing numbers rise (page numbers do; prices and counts rarely) and stay plausible page numbers."""
W_NUMBERED = 1.0
"""Numbered entries on half of them or more (scaled below that)."""
W_FLATTENED = 1.0
"""Four or more "title ... number" runs inside one line: a contents page flattened by text extraction."""
MIN_ENTRIES = 3
"""Fewer entries than this give the per-entry signals no weight."""

_HEADING_RE = re.compile(
    r"^\s*(?:table\s+of\s+contents|contents|目\s*录|目\s*次|inhalt(?:sverzeichnis)?|sommaire|table\s+des\s+mati[eè]res|índice|indice)\s*[:：]?",
    re.IGNORECASE,
)
_DOT_LEADER_RE = re.compile(r"(?:\.\s?){4,}|…{2,}|(?:·\s?){3,}|_{5,}")
_TRAILING_NUM_RE = re.compile(r"\S.*?[\s.…·_](\d{1,4})\s*$")
_NUMBERED_RE = re.compile(
    r"^\s*(?:\d{1,3}(?:\.\d{1,3})*[.)]?\s+\S|(?:chapter|part|section|appendix)\s+[\dIVXLC]+\b|第[一二三四五六七八九十百\d]+[章节部篇]|[IVXLC]{1,5}\.\s+\S)",
    re.IGNORECASE,
)
_FLAT_ENTRY_RE = re.compile(
    r"(?:(?:\d{1,3}(?:\.\d{1,3})*\.?|第[一二三四五六七八九十百\d]+[章节部篇])\s*)?[^\W\d_][^\n]{1,80}?(?:\s*(?:\.\s?){3,}\s*|\s*…+\s*|\s*·{3,}\s*|\s+)\d{1,4}(?=\s|$)"
)
FRONT_MATTER_TITLES = re.compile(
    r"^\s*(?:cover|title(?:\s+page)?|half[- ]title|copyright|dedication|epigraph|contents|table\s+of\s+contents|"
    r"list\s+of\s+(?:figures|tables|illustrations)|foreword|preface|acknowledg(?:e)?ments?|about\s+(?:this\s+book|the\s+authors?)|"
    r"目\s*录|目\s*次|封面|版权|前\s*言|序\s*言?|致\s*谢)\s*$",
    re.IGNORECASE,
)
"""Outline / navigation titles that are front matter, not body."""


@dataclass(frozen=True)
class PageScore:
    """The table-of-contents score of one page and the signals behind it."""

    score: float
    heading: bool
    dot_leader_share: float
    trailing_number_share: float
    ascending: bool
    numbered_share: float
    flattened: bool
    entries: int

    @property
    def is_toc(self) -> bool:
        return self.score >= TOC_THRESHOLD


def _entries(lines: list[str]) -> tuple[list[str], bool]:
    """The page's entries: its lines, or, when a few long lines hold many "title ... number"
    runs (a flattened contents page), those runs."""
    if len(lines) <= 3:
        runs = [m.group(0).strip() for ln in lines for m in _FLAT_ENTRY_RE.finditer(ln)]
        if len(runs) >= 4:
            return runs, True
    return lines, False


def score_page(text: str, *, max_page: int | None = None) -> PageScore:
    """Score one page's text as a table of contents (see the module docstring).

    Args:
        max_page: the document's page count, if known; trailing numbers above
            ``max_page + 50`` are not page numbers (years, amounts) and do not count as rising.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return PageScore(0.0, False, 0.0, 0.0, False, 0.0, False, 0)
    body = [ln for ln in lines if not (_HEADING_RE.match(ln) and len(ln) < 40)] or lines
    entries, flattened = _entries(body)
    heading = any(_HEADING_RE.match(ln) and (len(ln) < 40 or flattened) for ln in lines[:4])
    n = len(entries)
    enough = n >= MIN_ENTRIES
    dots = sum(1 for e in entries if _DOT_LEADER_RE.search(e)) / n
    numbers = [int(m.group(1)) for e in entries if (m := _TRAILING_NUM_RE.match(e))]
    trailing = len(numbers) / n
    numbered = sum(1 for e in entries if _NUMBERED_RE.match(e)) / n
    plausible = max_page is None or all(x <= max_page + 50 for x in numbers)
    rises = sum(1 for a, b in zip(numbers, numbers[1:], strict=False) if b >= a)
    ascending = len(numbers) >= 4 and plausible and rises >= 0.9 * (len(numbers) - 1)
    score = W_HEADING if heading else 0.0
    score += W_DOT_LEADERS * min(1.0, dots / 0.5)
    if enough:
        score += W_TRAILING_NUMBERS * min(1.0, trailing / 0.6)
        score += W_NUMBERED * min(1.0, numbered / 0.5)
    score += W_ASCENDING if ascending else 0.0
    score += W_FLATTENED if flattened else 0.0
    return PageScore(
        round(score, 3), heading, round(dots, 3), round(trailing, 3), ascending, round(numbered, 3), flattened, n
    )


def toc_body_start(pages: list[str]) -> int | None:
    """The page after the last table-of-contents page among the first pages, 1-based;
    ``None`` when no page scores as one, or when the contents page is the last page."""
    if len(pages) < 2:
        return None
    limit = max(1, min(SCAN_PAGES, len(pages) // 3 or 1))
    last_toc = None
    for i in range(min(limit + 1, len(pages))):
        if score_page(pages[i], max_page=len(pages)).is_toc:
            last_toc = i
        elif last_toc is not None:
            break
    if last_toc is None or last_toc + 1 >= len(pages):
        return None
    return last_toc + 2


def is_front_matter_title(title: str) -> bool:
    """True for an outline or navigation title that names front matter (contents, preface, ...)."""
    return bool(FRONT_MATTER_TITLES.match(title or ""))
