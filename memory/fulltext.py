"""Full-text lexemes of archived segments and of recall queries: English by PostgreSQL, CJK here.

A segment's ``search`` tsvector is ``companion_search_vector(content, cjk_terms)``
(migration 0013): PostgreSQL's ``to_tsvector('english', …)`` of the content with its CJK
runs blanked out (stemming, English stop words), concatenated with the CJK lexemes this
module computes, taken as they are (``array_to_tsvector``). A query's lexemes are
``companion_search_terms(query, cjk_terms)``, the same split. English therefore goes
through exactly the function it always went through, and only the CJK part is Python.

CJK lexemes (:func:`cjk_terms`), by :data:`CJK_METHOD`:

- ``words``: each run of Han characters cut into words by jieba (its default dictionary
  and HMM for unknown words; Sun 2012-, MIT, https://github.com/fxsjy/jieba), so
  "我家宠物生病了" gives 我家 / 宠物 / 生病 / 了. A segment and a query then match on whole
  words: "宠物" does not match "物生", and a one-character word ("猫") is a lexeme of its
  own, which no bigram of a longer run is;
- ``search``: jieba's search-engine mode (``lcut_for_search``): the words, plus the
  dictionary words of two and three characters inside a longer word (中华人民共和国 also
  gives 中华 / 人民 / 共和国);
- ``bigrams``: overlapping two-character grams of every run (a run of one character gives
  itself), as Lucene's CJKAnalyzer indexes; what migration 0002 computed in SQL;
- ``words+bigrams``: both.

Runs of kana or Hangul are always cut into bigrams (jieba's dictionary is Chinese).
A lexeme longer than :data:`MAX_TERM_CHARS` characters is left out (PostgreSQL refuses
lexemes over 2,047 bytes; the bigrams of such a run still index it under ``bigrams``).

jieba's dictionary is loaded on the first call that needs it, once per process (about
1–2 s; jieba keeps a pickled prefix dictionary in the temporary directory after the
first load), under a lock, so importing this module costs nothing.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Literal

import structlog
from sqlalchemy import Text, func, literal, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["CJK_METHOD", "CjkMethod", "cjk_terms", "reindex", "search_vector"]

log = structlog.get_logger("companion.fulltext")

CjkMethod = Literal["words", "search", "bigrams", "words+bigrams"]
"""How CJK text becomes lexemes; see the module docstring."""
CJK_METHODS: tuple[CjkMethod, ...] = ("words", "search", "bigrams", "words+bigrams")

CJK_METHOD: CjkMethod = "search"
"""The method the runtime stores and queries with. Chosen on the tuning split of the
MemoryBank Chinese questions (``scripts/eval_recall.py --cjk``; see docs/evaluation.md)."""

MAX_TERM_CHARS = 64
"""Longest CJK lexeme kept, in characters (a Han character is 3 bytes in UTF-8)."""

CJK_PATTERN = "[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]"
"""Han (CJK Unified Ideographs, Extension A, Compatibility), Hiragana, Katakana, Hangul
syllables: the characters migration 0002 blanks out of the English part."""
_CJK_RUN = re.compile(CJK_PATTERN + "+")
_HAN_OR_OTHER = re.compile("([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)|([^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)")

_jieba: Any = None
_jieba_lock = threading.Lock()


def _tokenizer() -> Any:
    """jieba's tokenizer with its dictionary loaded; the first call loads it (once per process)."""
    global _jieba
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import logging

                import jieba

                jieba.setLogLevel(logging.WARNING)  # it prints its progress at DEBUG otherwise
                started = time.perf_counter()
                tokenizer = jieba.Tokenizer()
                tokenizer.initialize()
                log.info("fulltext.jieba_loaded", seconds=round(time.perf_counter() - started, 3))
                _jieba = tokenizer
    return _jieba


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


def cjk_terms(text_: str, *, method: CjkMethod = CJK_METHOD) -> list[str]:
    """The distinct CJK lexemes of ``text_`` by ``method``, in order of first appearance.

    Text without CJK characters gives ``[]`` (and never loads jieba).

    Raises:
        ValueError: ``method`` is not one of :data:`CJK_METHODS`.
    """
    if method not in CJK_METHODS:
        raise ValueError(f"method must be one of {', '.join(CJK_METHODS)}, got {method!r}")
    out: dict[str, None] = {}
    for run in _CJK_RUN.findall(text_):
        if method in ("bigrams", "words+bigrams"):
            out.update(dict.fromkeys(_bigrams(run)))
        if method == "bigrams":
            continue
        for han, other in _HAN_OR_OTHER.findall(run):
            if other:
                out.update(dict.fromkeys(_bigrams(other)))
            elif method == "search":
                out.update(dict.fromkeys(_tokenizer().lcut_for_search(han)))
            else:
                out.update(dict.fromkeys(_tokenizer().lcut(han)))
    return [t for t in out if t.strip() and len(t) <= MAX_TERM_CHARS]


def search_vector(content: str, *, method: CjkMethod = CJK_METHOD) -> ColumnElement[Any]:
    """The SQL expression of ``content``'s stored ``search`` tsvector, for an INSERT or UPDATE."""
    return func.companion_search_vector(literal(content, Text), literal(cjk_terms(content, method=method), ARRAY(Text)))


_CJK_ROWS = f"""
SELECT id, content FROM archived_segments
WHERE content ~ '{CJK_PATTERN}' AND id > :after{{user}}
ORDER BY id LIMIT :batch
"""
_UPDATE = """
UPDATE archived_segments AS a
SET search = companion_search_vector(a.content, string_to_array(u.terms, ' '))
FROM unnest(CAST(:ids AS bigint[]), CAST(:terms AS text[])) AS u(id, terms)
WHERE a.id = u.id
"""


def reindex(conn: Connection, *, method: CjkMethod = CJK_METHOD, user_id: str | None = None, batch: int = 2000) -> int:
    """Recompute the stored ``search`` of every archived segment that contains CJK text.

    Segments without CJK characters are left alone (their tsvector has no CJK part).
    Runs in ``conn``'s transaction, ``batch`` rows per ``UPDATE``; the caller commits.

    Args:
        method: the CJK lexemes to store (:data:`CJK_METHOD` is what recall queries with).
        user_id: only this user's segments; ``None``: all users'.

    Returns:
        How many segments were rewritten.
    """
    sql = text(_CJK_ROWS.format(user=" AND user_id = :user_id" if user_id is not None else ""))
    after, done = 0, 0
    while True:
        rows = conn.execute(sql, {"after": after, "batch": int(batch), "user_id": user_id}).fetchall()
        if not rows:
            return done
        conn.execute(
            text(_UPDATE),
            {"ids": [r.id for r in rows], "terms": [" ".join(cjk_terms(r.content, method=method)) for r in rows]},
        )
        after, done = rows[-1].id, done + len(rows)
