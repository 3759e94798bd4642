"""Where a document's body starts: the table-of-contents heuristic and front-matter titles.

The heuristic scores each of the first pages on several signals and calls a page a
table of contents only when the combined score reaches :data:`TOC_THRESHOLD`; every
single signal scores below it, so no one signal decides. The signals:

- a "Contents" / "Table of contents" / "目录" (also 目 录, 目次, Inhalt, Sommaire, Índice)
  heading among the first lines;
- dot leaders (``.....``, ``…``, ``·····``) between titles and numbers;
- lines ending in a page number;
- numbered entries (``1.``, ``2.3``, ``Chapter 4``, ``第三章``, roman numerals);
- a table of contents flattened onto one line: many "title ... number" runs in one line
  (what PDF text extraction often makes of a contents page).

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
W_DOT_LEADERS = 2.0
W_TRAILING_NUMBERS = 1.5
W_NUMBERED = 1.0
W_FLATTENED = 2.0

_HEADING_RE = re.compile(
    r"^\s*(?:table\s+of\s+contents|contents|目\s*录|目\s*次|inhalt(?:sverzeichnis)?|sommaire|table\s+des\s+mati[eè]res|índice|indice)\s*[:：]?\s*$",
    re.IGNORECASE,
)
_DOT_LEADER_RE = re.compile(r"(?:\.\s?){4,}|…{2,}|(?:·\s?){3,}|(?:_){5,}")
_TRAILING_NUM_RE = re.compile(r"\S.*?\s(\d{1,4}|[ivxlcdm]{1,6})\s*$", re.IGNORECASE)
_NUMBERED_RE = re.compile(
    r"^\s*(?:\d{1,3}(?:\.\d{1,3})*[.)]?\s+\S|(?:chapter|part|section|appendix)\s+[\dIVXLC]+\b|第[一二三四五六七八九十百\d]+[章节部篇]|[IVXLC]{1,5}\.\s+\S)",
    re.IGNORECASE,
)
_FLAT_ENTRY_RE = re.compile(r"[^\W\d_][^\n]{1,80}?(?:\s*(?:\.\s?){3,}|…+|·{3,}|\s)\s*\d{1,4}(?=\s|$)")
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
    numbered_share: float
    flattened_entries: int

    @property
    def is_toc(self) -> bool:
        return self.score >= TOC_THRESHOLD


def score_page(text: str) -> PageScore:
    """Score one page's text as a table of contents (see the module docstring)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return PageScore(0.0, False, 0.0, 0.0, 0.0, 0)
    heading = any(_HEADING_RE.match(ln) for ln in lines[:4])
    body = [ln for ln in lines if not _HEADING_RE.match(ln)] or lines
    n = len(body)
    dots = sum(1 for ln in body if _DOT_LEADER_RE.search(ln)) / n
    trailing = sum(1 for ln in body if _TRAILING_NUM_RE.match(ln)) / n
    numbered = sum(1 for ln in body if _NUMBERED_RE.match(ln)) / n
    flattened = max((len(_FLAT_ENTRY_RE.findall(ln)) for ln in body if len(ln) > 80), default=0)
    score = 0.0
    score += W_HEADING if heading else 0.0
    score += W_DOT_LEADERS * min(1.0, dots / 0.5)
    score += W_TRAILING_NUMBERS * (min(1.0, trailing / 0.6) if n >= 3 else 0.0)
    score += W_NUMBERED * (min(1.0, numbered / 0.5) if n >= 3 else 0.0)
    if flattened >= 4:
        score += W_FLATTENED * min(1.0, flattened / 6)
        if flattened >= 4 and n <= 3:  # one long line of entries counts as many trailing numbers too
            score += W_TRAILING_NUMBERS
    return PageScore(round(score, 3), heading, round(dots, 3), round(trailing, 3), round(numbered, 3), flattened)


def toc_body_start(pages: list[str]) -> int | None:
    """The page after the last table-of-contents page among the first pages, 1-based;
    ``None`` when no page scores as one, or when the contents page is the last page."""
    if len(pages) < 2:
        return None
    limit = max(1, min(SCAN_PAGES, len(pages) // 3 or 1))
    last_toc = None
    for i in range(min(limit + 1, len(pages))):
        if score_page(pages[i]).is_toc:
            last_toc = i
        elif last_toc is not None:
            break
    if last_toc is None or last_toc + 1 >= len(pages):
        return None
    return last_toc + 2


def is_front_matter_title(title: str) -> bool:
    """True for an outline or navigation title that names front matter (contents, preface, ...)."""
    return bool(FRONT_MATTER_TITLES.match(title or ""))
