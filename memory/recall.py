"""Recall: the user's archived segments that best match a message, by hybrid search.

Up to three rankers run over the same rows, one user's segments only:

- **vector**: pgvector cosine distance (``<=>``) between the query embedding and each
  segment's key embedding, exact or over the HNSW index (below);
- **full text**: the query's lexemes (``companion_search_terms``: English stemming and
  stop words by PostgreSQL, plus CJK words by jieba, :mod:`memory.fulltext`) matched
  against the stored ``search`` tsvector of each segment's verbatim content. A segment scores
  ``Σ idf(t) · ts_rank(search, t)`` over the query terms ``t`` it contains, with
  ``idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5))`` over the user's N segments (the BM25
  idf of Robertson & Zaragoza 2009), because ``ts_rank`` alone has no notion of how
  rare a word is;
- **date** (only when the message names a period, :mod:`memory.dates`): the user's
  segments whose ``session_date`` falls in one of the periods, nearest by vector first.
  "我5月3号去了哪里？" then ranks that day's segments even when nothing in their text
  says "5月3号".

The lists (``pool`` each) are fused by reciprocal rank, ``Σ 1 / (k + rank)``
(Cormack, Clarke & Büttcher 2009, "Reciprocal rank fusion outperforms Condorcet and
individual rank learning methods", SIGIR), with ``k`` = :data:`RRF_K`. Optionally the
turns next to the best hits join them (neighbour expansion), as a one-turn hit is
often the question and its neighbour the answer: a neighbour ``d`` turns from its hit
is ranked among the hits as if its score were the hit's times :data:`NEIGHBOUR_WEIGHT`
to the power ``d``.

When the message names one of the two speakers ("What has Melanie painted?", the user's
display name or the character's, :func:`named_speaker`), the segments of that speaker's lines
rank as if their fused score were :data:`SPEAKER_WEIGHT` times higher, their neighbours too;
the engine embeds a user's message without the names (:func:`without_names`).

The user filter is a hard ``WHERE user_id = …`` in every ranker, applied before any
ranking, so another user's segment can never come back, however close it is. Each ranker
reads only the rows it needs, so the cost of a recall does not follow the archive's size:

- **vector, exact** (the user has fewer than :data:`INDEX_FROM` segments, or they are less
  than :data:`INDEX_SHARE` of the table): the user's rows, found by the ``user_id`` btree,
  scored exactly in a ``MATERIALIZED`` CTE (so the planner cannot swap in the HNSW index).
  Measured by ``scripts/bench_recall.py`` at 1M segments of 10,000 users (100 each): the
  exact per-user top 10 takes p95 9 ms with recall 1, while the HNSW index with the user
  filter finds about 1 in 10 of the true top 10 (a user's rows are 0.01 % of the table; the
  iterative scan stops at ``hnsw.max_scan_tuples``).
- **vector, HNSW** (a large archive that is a large share of the table): ``ORDER BY
  embedding <=> q LIMIT`` :data:`INDEX_POOL` over the HNSW index of half-precision keys
  (``halfvec``, migration 0017) with pgvector 0.8's iterative scan
  (``hnsw.iterative_scan = relaxed_order``, ``ef_search`` = max(:data:`INDEX_POOL`, :data:`EF_SEARCH`),
  ``max_scan_tuples`` = :data:`MAX_SCAN_TUPLES`), re-sorted by exact distance. The settings
  are ``set_config(…, true)``, i.e. ``SET LOCAL``: they last for recall's own read-only
  transaction and the pooled connection goes back unchanged. Measured by
  ``scripts/bench_turn.py`` (one user's archive, random unit vectors, the runtime's recall
  call; 12 interleaved rounds on a 2-core machine shared with other jobs, load 7–8), recall
  median / p95: at 100,000 segments 4,387 / 5,404 ms exact and 390 / 646 ms with the index;
  at 10,000, 390 / 530 ms and 223 / 296 ms; at 1,000, 101 / 135 ms and 207 / 365 ms. LoCoMo evidence recall at 1,000 tokens, all 7
  conversations (``scripts/eval_recall.py --vector exact|index``): see the figures under
  :data:`INDEX_FROM`.
- **full text**: only rows that contain a query term, found by the GIN index on ``search``
  (migration 0012), are ranked; N is the user's row in ``archive_counts`` (kept by triggers),
  not a count of their rows. On the index path a term in at least :data:`FREQUENT_ROWS` of the
  user's rows (estimated from PostgreSQL's ``most_common_elems`` statistics) adds to the score
  of rows found by rarer terms but finds none by itself. On the exact path every matching row is
  ranked, so results on small archives are what they were (``scripts/eval_recall.py
  --split tune``: 62.8 / 71.8 / 80.2 % at 500 / 1,000 / 2,000 tokens, before and after).
- **date**: only the rows inside the periods, by the ``(user_id, session_date)`` index.
- **neighbours**: ranges of the ``(session_id, last_seq)`` index around each hit.

:data:`INDEX_FROM` is 5,000 so that every archive of the evaluation sets (LoCoMo
conversations hold 400–700 segments, their haystack variant about 4,000) keeps the exact
path; above it the exact scan's cost grows with the archive (about 44 ms per 1,000
segments on this machine) while the index path's stays near its cost at 10,000.

A follow-up that says little alone ("那后来呢？", "and her?") is recalled by the turns
before it as well (:func:`enrich_query`, applied by the engine).

Recall is a read: one ``SELECT`` of the user's segment count (none when the caller gives
``vector_index``), one transaction-local ``set_config`` on the index path, and the ranked
``SELECT``, which reads the neighbours too (with a ``session_cap``, they take a second
``SELECT``); no writes. Told the exact path beforehand, it runs without a transaction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, text

from memory.database import autocommit_engine, storage_errors
from memory.dates import TimeSpan
from memory.fulltext import CJK_METHOD, CjkMethod, cjk_terms
from memory.vectors import Vector

RRF_K = 10
"""The reciprocal-rank-fusion constant k. Cormack et al. (2009) use 60 for fusing long
TREC runs; at our budgets (tens of one-turn segments) a smaller k, which trusts each
ranker's first places more, measured better (``scripts/eval_recall.py``, LoCoMo
evidence recall at 1,000 tokens with ±1 neighbour: 72.1 % with k = 10, 68.5 % with
k = 60, within a point for k in 5–20)."""
EXPAND_HITS = 5
"""How many of the best hits get their neighbours added (``neighbours > 0``). Expanding
every hit spends the budget on the context of weak hits: with ±2 turns, LoCoMo evidence
recall at 1,000 / 2,000 tokens was 71.6 / 80.2 % around the best 5, 70.3 / 78.6 % around
every hit, 69.6 / 76.8 % with no expansion (``scripts/eval_recall.py``)."""

NEIGHBOUR_WEIGHT = 0.8
"""Where a neighbour of a hit goes in the ranking: a segment ``d`` turns before or after its
hit ranks as if its fused score were the hit's times ``0.8 ** d``, so a strong hit's next turn
comes before a weak hit, and a weak hit's neighbours after the strong hits. Before, all of a
hit's neighbours followed it at once, so at small budgets two or three hits and their context
filled the memory block.

Chosen on the tuning splits (``scripts/eval_recall.py --split tune --neighbour-weight W``,
evidence recall % at 250 / 500 / 1,000 / 2,000 tokens; ``after`` is the previous order):

============  =========================  ==========================  ==========================
W             LoCoMo                     MemoryBank Chinese          Chinese haystack
============  =========================  ==========================  ==========================
after         49.3 / 61.1 / 71.6 / 81.2  72.2 / 92.6 / 100 / 100     64.8 / 79.6 / 96.3 / 98.1
0.6           53.1 / 64.4 / 72.7 / 81.4  74.1 / 90.7 / 100 / 100     61.1 / 77.8 / 98.1 / 98.1
0.7           53.7 / 64.1 / 73.0 / 81.2  77.8 / 94.4 / 100 / 100     63.0 / 79.6 / 94.4 / 98.1
0.8           54.5 / 64.1 / 72.9 / 81.2  81.5 / 96.3 / 100 / 100     61.1 / 79.6 / 96.3 / 98.1
0.9           52.7 / 63.8 / 72.4 / 81.2  77.8 / 98.1 / 100 / 100     66.7 / 79.6 / 96.3 / 98.1
============  =========================  ==========================  ==========================

A weight of 0.5 for every neighbour, not raised to the power of its distance, and the
neighbours of the best 10 or 20 hits instead of :data:`EXPAND_HITS` each lost 1–1.5 points of
LoCoMo at 2,000 tokens."""

SPEAKER_WEIGHT = 3.0
"""How much more a segment of the speaker a message names counts (``speaker``): its fused
score, and the place of a neighbour of that speaker, are multiplied by this. A question about
one person ("What has Melanie painted?") is answered by that person's own lines, while the
words that match it are as often the other speaker's ("Thanks, Melanie! I painted it..."): in
the LoCoMo dev conversations, 1,280 of 1,325 evidence turns of a question naming one speaker
are that speaker's. Chosen on the tuning split (``scripts/eval_recall.py --split tune
--speaker-weight W``, LoCoMo evidence recall % at 250 / 500 / 1,000 / 2,000 tokens):

======================================  =========================
W                                       LoCoMo
======================================  =========================
1 (off)                                 54.5 / 64.1 / 72.9 / 81.2
2, hits only (neighbours as before)     55.1 / 66.4 / 75.1 / 83.4
2                                       59.9 / 70.7 / 77.5 / 83.3
3                                       59.2 / 70.0 / 79.5 / 84.2
4                                       59.0 / 69.6 / 79.3 / 84.6
10                                      59.0 / 69.4 / 78.7 / 84.4
======================================  =========================

With the question's vector embedded without the names (:func:`without_names`; the engine embeds
every user message so), 2 / 3 / 4 gave 62.7 / 71.9 / 78.6 / 85.1, 61.9 / 71.8 / 80.2 / 86.3 and 61.9 / 71.5 / 80.7 / 86.3.
The MemoryBank Chinese questions name no speaker ("我5月3号去了哪里？"), so they are unchanged.
Reading "I"/"我" as the user and "you"/"你" as the character did not pay there: on the Chinese
tuning split 96.3 → 92.6 % at 500 tokens, and 96.3 → 88.9 % at 1,000 with the haystack."""

DATE_WEIGHT = 1.0
"""Weight of the date ranker in the fusion (``when``): its ``1 / (k + rank)`` is multiplied
by this. With 1, on the tuning split, MemoryBank Chinese evidence recall at 500 tokens
rose from 68.5 to 90.7 % and LoCoMo at 1,000 / 2,000 from 71.1 / 79.7 to 71.6 / 80.2 %
(``scripts/eval_recall.py``)."""
SESSION_CAP: int | None = None
"""Hits of one conversation day taken before other days' (``session_cap``); ``None`` off.
Off because it did not pay: with 2, LoCoMo evidence recall at 1,000 tokens fell on the
tuning conversations (conv-26 74.4 → 71.9 %, conv-41 75.2 → 74.3 %, conv-44 52.2 → 49.3 %;
``scripts/eval_recall.py --components diversity --session-cap 2``; measured before
:data:`NEIGHBOUR_WEIGHT`, with the neighbours straight after their hit)."""

INDEX_FROM = 5_000
"""Segments of one user from which the vector ranker uses the HNSW index (if the user's
share of the table is also at least :data:`INDEX_SHARE`); below it, exact search.

Quality of the index path, LoCoMo evidence recall at 1,000 tokens over all 7 conversations
(``scripts/eval_recall.py --split all --budgets 1000 --vector exact|index``): 72.6 % exact,
72.6 % over the index (every category equal). A first rule for frequent terms, 0.5 % of the
table's rows, cost 4.1 points there (68.5 %): in a small table it pruned topical words, so
the rule counts rows in the user's archive instead (:data:`FREQUENT_ROWS`)."""
INDEX_SHARE = 0.05
"""The user's least share of the archive table (``pg_class.reltuples``) for the index path.
An iterative scan visits about ``pool / share`` rows to find ``pool`` of the user's."""
EF_SEARCH = 100
"""Least ``hnsw.ef_search`` of the index path (it is at least the vector ranker's pool there,
:data:`INDEX_POOL`)."""
INDEX_POOL = 100
"""On the index path, the vector ranker contributes at most this many candidates (the other
rankers keep ``pool``). An HNSW search's cost follows ``ef_search``, which must be at least
the candidates asked for: with 100 instead of 200, recall of a 100,000-segment archive took
28.5 instead of 44.6 ms (median of 30, alternating with a 1,000-segment user, 128 MB shared
buffers). Evidence recall over the index path on the LoCoMo tuning split
(``scripts/eval_recall.py --split tune --vector index``), 500 / 1,000 / 2,000 tokens: 62.8 /
71.4 / 80.0 % against 62.8 / 71.5 / 80.2 % with 200; haystack variant 55.1 / 64.7 / 73.2
against 55.7 / 64.9 / 73.3 %."""
FREQUENT_ROWS = 1_000
"""On the index path, a query term the user's archive holds in about this many rows or more
(its share of the table in PostgreSQL's ``most_common_elems`` statistics of ``search``, kept
by ANALYZE, times the user's N) finds no candidates for full text by itself: only rows with
a rarer term are ranked; the frequent term still adds to their score, with that estimate as
its df. Ranking every row a common word matches is the cost that grows with the archive, and
such a term's idf is low (ln(N / 1,000) at most). No term of an archive below 1,000
segments is frequent."""
MAX_SCAN_TUPLES = 50_000
"""``hnsw.max_scan_tuples`` of the index path: rows an iterative scan may visit (pgvector's
default is 20,000); with :data:`INDEX_SHARE` it covers a pool of 2,500."""


@dataclass(frozen=True, kw_only=True)
class RecalledSegment:
    """One archived segment returned by recall."""

    id: int
    session_id: str
    first_seq: int
    last_seq: int
    content: str
    tokens: int
    """Estimated tokens of ``content``, as stored."""
    session_date: datetime
    distance: float
    """Cosine distance of the segment's key embedding to the query, 0 (same direction) to 2."""
    vector_rank: int | None = None
    """1-based rank among the user's segments by ``distance``; ``None`` beyond the pool."""
    text_rank: int | None = None
    """1-based rank by full-text score; ``None`` if no query term matched or beyond the pool."""
    score: float = 0.0
    """Reciprocal-rank-fusion score, ``Σ 1/(k + rank)`` over the rankers, times ``speaker_weight``
    for a segment of the speaker the query names (:func:`recall_segments`); 0 for a neighbour."""
    neighbour_of: int | None = None
    """For a segment added by neighbour expansion, the id of the hit it sits next to."""


_RANKED = """
WITH {vec_cte},
total AS (
    SELECT coalesce((SELECT segments FROM archive_counts WHERE user_id = :user_id), 0){excluded_count} AS n
),
common AS MATERIALIZED (
    SELECT e.elem, e.freq
    FROM pg_stats AS st,
         unnest(CAST(CAST(st.most_common_elems AS text) AS text[]), st.most_common_elem_freqs) AS e(elem, freq)
    WHERE st.schemaname = current_schema() AND st.tablename = 'archived_segments' AND st.attname = 'search'
      AND CAST(:frequent_rows AS real) > 0
),
shares AS (
    SELECT t, coalesce((SELECT max(freq) FROM common WHERE common.elem = t), 0) AS share
    FROM unnest(companion_search_terms(CAST(:qt AS text), CAST(:cjk AS text[]))) AS t
),
terms AS (
    SELECT t, share,
           CAST(:frequent_rows AS real) > 0 AND share * (SELECT n FROM total) >= :frequent_rows AS frequent,
           CAST('''' || replace(replace(t, '\\', '\\\\'), '''', '''''') || '''' AS tsquery) AS tq
    FROM shares
),
hits AS MATERIALIZED (
    SELECT id, search {text_from} search @@ (SELECT CAST(string_agg(CAST(tq AS text), ' | ') AS tsquery) FROM terms WHERE NOT frequent)
),
df AS MATERIALIZED (
    SELECT terms.t, terms.tq,
           CASE WHEN terms.frequent THEN terms.share * (SELECT n FROM total) ELSE count(hits.id) END AS df,
           (SELECT n FROM total) AS n
    FROM terms LEFT JOIN hits ON hits.search @@ terms.tq
    GROUP BY terms.t, terms.tq, terms.frequent, terms.share
),
fts_score AS (
    SELECT hits.id, sum(ln(1.0 + (df.n - df.df + 0.5) / (df.df + 0.5)) * ts_rank(hits.search, df.tq) ORDER BY df.t) AS s
    FROM hits JOIN df ON hits.search @@ df.tq
    GROUP BY hits.id
),
fts AS (
    SELECT id, row_number() OVER (ORDER BY s DESC, id) AS r
    FROM fts_score ORDER BY s DESC, id LIMIT :pool
){dated_cte},
found AS (
    SELECT coalesce(vec.id, fts.id) AS id, vec.r AS vector_rank, fts.r AS text_rank
    FROM vec FULL JOIN fts ON fts.id = vec.id
){dated_found}
{ranked}"""
"""The fused ranking; ``{ranked}`` is :data:`_HITS`, or :data:`_HITS_AND_NEIGHBOURS` to read the
neighbours in the same statement. ``common`` (the table's most common lexemes, from ``pg_stats``) is
``MATERIALIZED`` so that it is read once: inlined, the view was read again for each query
term and each use of its share, about 0.5 ms per term on the index path. ``df`` (one row per
query term) is ``MATERIALIZED`` too: inlined, the planner recomputed it for every matching
row. ``found`` pairs the rankers' lists by a hash ``FULL JOIN`` on ``id``; joining each list
to the rows separately, the planner (which expects one row from a ``LIMIT``ed CTE) chose a
nested loop that compared every row with every full-text hit. On a 381-segment archive
(a conv-26 replay) the two took the statement from 11.3 to 1.7 ms (``EXPLAIN ANALYZE``; 1.9 ms
with the ordered sum below, on a machine twice as loaded), and
``scripts/eval_recall.py --split tune`` from a p50 of 17.4 to 6.4 ms per question. A row's
full-text score is summed over the query terms in term order (``ORDER BY df.t``): floating-point
addition depends on the order, so without it two rows of equal score could differ in the last
bit, and swap places, with the plan."""

_NEIGHBOURS_OF = """SELECT s.id, s.session_id, s.first_seq, s.last_seq, s.content, s.tokens, s.session_date,
       s.embedding <=> CAST(:q AS vector) AS distance, h.hit AS neighbour_of
FROM {hits}
CROSS JOIN LATERAL (
    (SELECT * FROM archived_segments AS a
     WHERE a.session_id = h.session_id AND a.last_seq BETWEEN h.first_seq - :span AND h.last_seq + :span)
    UNION ALL
    (SELECT * FROM archived_segments AS a
     WHERE a.session_id = h.session_id AND a.last_seq > h.last_seq + :span
     ORDER BY a.last_seq LIMIT 1)
) AS s
WHERE s.user_id = :user_id AND s.first_seq <= h.last_seq + :span AND s.id <> h.hit{exclude}"""
"""The segments within ``span`` turns of each hit of ``{hits}`` (rows ``h`` of ``hit``,
``session_id``, ``first_seq``, ``last_seq``): those that end inside the span, and the first one after it if it
starts inside it. One session's segments never overlap (each turn is archived once), so no
other segment can reach into the span; both parts are ranges of the ``(session_id, last_seq)``
index, whatever the session's length."""

_NEIGHBOURS = (
    _NEIGHBOURS_OF.replace(
        "{hits}",
        "unnest(CAST(:hit_ids AS bigint[]), CAST(:hit_sessions AS text[]), CAST(:hit_first AS int[]), "
        "CAST(:hit_last AS int[])) AS h(hit, session_id, first_seq, last_seq)",
    )
    + "\nORDER BY h.hit, s.first_seq"
)
"""The neighbours of hits given as arrays (``:hit_ids`` …), for a ranking a ``session_cap`` reordered."""


_HITS = """SELECT m.id, m.session_id, m.first_seq, m.last_seq, m.content, m.tokens, m.session_date,
       m.embedding <=> CAST(:q AS vector) AS distance,
       f.vector_rank, f.text_rank,
       (coalesce(1.0 / (:k + f.vector_rank), 0) + coalesce(1.0 / (:k + f.text_rank), 0){dated_score})
         * CASE WHEN :speaker_label <> '' AND starts_with(m.content, :speaker_label) THEN :speaker_weight ELSE 1.0 END
         AS score
FROM {found} AS f JOIN archived_segments AS m ON m.id = f.id
ORDER BY score DESC, distance, m.id
LIMIT :limit"""
"""The hits: the fused rows, best first (the last part of :data:`_RANKED`)."""

_HITS_AND_NEIGHBOURS = (
    """,
hits_ranked AS MATERIALIZED (
"""
    + _HITS
    + """
),
expanded AS (
    SELECT id AS hit, session_id, first_seq, last_seq
    FROM hits_ranked ORDER BY score DESC, distance, id LIMIT :expand
),
neighbour_rows AS (
"""
    + _NEIGHBOURS_OF.replace("{hits}", "expanded AS h").replace("{exclude}", "{exclude_near}")
    + """
)
SELECT 0 AS part, row_number() OVER (ORDER BY score DESC, distance, id) AS pos,
       id, session_id, first_seq, last_seq, content, tokens, session_date, distance,
       vector_rank, text_rank, score, CAST(NULL AS bigint) AS neighbour_of
FROM hits_ranked
UNION ALL
SELECT 1, row_number() OVER (ORDER BY neighbour_of, first_seq),
       id, session_id, first_seq, last_seq, content, tokens, session_date, distance,
       NULL, NULL, NULL, neighbour_of
FROM neighbour_rows
ORDER BY part, pos"""
)
"""The hits and, in the same statement, the neighbours of the best ``expand`` of them (what
:data:`_NEIGHBOURS` reads, by the same index ranges): ``part`` 0 rows are the hits in rank
order, ``part`` 1 rows the neighbours by hit and ``first_seq``. One round trip instead of two:
used whenever neighbours are asked for and no ``session_cap`` reorders the hits first."""


_VEC_EXACT = """mine AS MATERIALIZED (
    SELECT id, embedding <=> CAST(:q AS vector) AS distance
    FROM archived_segments
    WHERE user_id = :user_id{exclude}
),
vec AS (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS r
    FROM mine ORDER BY distance, id LIMIT :pool
)"""
"""The vector ranker, exact: every row of the user scored (``MATERIALIZED``, so the planner
cannot swap in the HNSW index)."""

ARCHIVE_HNSW_INDEX = "ix_archived_segments_embedding_hnsw"
"""The archive's HNSW index (migration 0017; :func:`archive_hnsw_index_ddl`)."""


def archive_hnsw_key(dim: int) -> str:
    """The expression the archive's HNSW index is built on and the index path orders by,
    for keys of ``dim`` dimensions: the key at half precision (2 bytes a dimension)."""
    return f"CAST(embedding AS halfvec({int(dim)}))"


def archive_hnsw_index_ddl(dim: int) -> str:
    """``CREATE INDEX`` of the archive's HNSW index for keys of ``dim`` dimensions, as migration
    0017 builds it (cosine distance on :func:`archive_hnsw_key`); used after a dimension change."""
    return (
        f"CREATE INDEX {ARCHIVE_HNSW_INDEX} ON archived_segments "
        f"USING hnsw (({archive_hnsw_key(dim)}) halfvec_cosine_ops)"
    )


_VEC_INDEX = """near AS MATERIALIZED (
    SELECT id, embedding <=> CAST(:q AS vector) AS distance
    FROM archived_segments
    WHERE user_id = :user_id{exclude}
    ORDER BY {key} <=> CAST(CAST(:q AS vector) AS halfvec({dim}))
    LIMIT :index_pool
),
vec AS (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS r
    FROM near ORDER BY distance, id
)"""
"""The vector ranker over the HNSW index: an iterative scan (``relaxed_order``) over the
half-precision expression index (migration 0017) that goes on until ``index_pool`` rows of the
user are found, then re-sorted by exact (single-precision) distance. The ``ORDER BY`` must be the
index's expression, ``CAST(embedding AS halfvec(N))``, for the planner to use it."""

_TEXT_FROM_INDEX = "FROM archived_segments WHERE user_id = :user_id{exclude} AND"
"""Full text on the index path: matching rows found by the GIN index on ``search``."""
_TEXT_FROM_EXACT = (
    "FROM (SELECT id, search FROM archived_segments WHERE user_id = :user_id{exclude} OFFSET 0) AS mine_text WHERE"
)
"""Full text on the exact path: the user's rows by the ``user_id`` btree, then filtered (``OFFSET 0``
keeps the planner from reaching for the GIN index, whose lists for a common word span every
user's rows: at 300,000 segments of 3,000 users that cost 33 ms of server CPU per query)."""

_QUERY_VECTOR = bindparam("q", type_=Vector())
"""``:q``, the query embedding, sent in binary (:class:`memory.vectors.Vector`)."""

_DATED_CTE = """,
dated_rows AS MATERIALIZED (
    SELECT a.id, a.embedding <=> CAST(:q AS vector) AS distance
    FROM archived_segments AS a
    WHERE a.id IN (
        SELECT s.id
        FROM unnest(CAST(:when_start AS timestamptz[]), CAST(:when_end AS timestamptz[])) AS w(s, e)
        JOIN archived_segments AS s
          ON s.user_id = :user_id AND s.session_date >= w.s AND s.session_date < w.e
    ){exclude_a}
),
dated AS (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS r
    FROM dated_rows ORDER BY distance, id LIMIT :pool
)"""
"""The date ranker: the rows inside the periods (the ``(user_id, session_date)`` index), by
exact distance. ``MATERIALIZED`` keeps the planner from ordering them by walking the HNSW
index under ``hnsw.iterative_scan`` (the index path's settings), which at 1M segments visited
about 24,000 index rows per query for a period of about 140 and returned few of them:
``scripts/bench_recall.py --heavy-user 100000`` (one user with 100,000 of 1M segments), a
query that names a day, p95 662–706 ms before and 176–228 ms after, with 21.9 instead of 11.4
of that day's segments among the hits."""
_DATED_SCORE = " + coalesce(:date_weight / (:k + f.date_rank), 0)"
_DATED_FOUND = """,
found_dated AS (
    SELECT coalesce(found.id, dated.id) AS id, found.vector_rank, found.text_rank, dated.r AS date_rank
    FROM found FULL JOIN dated ON dated.id = found.id
)"""


def recall_segments(
    engine: Engine,
    *,
    user_id: str,
    query_embedding: Sequence[float],
    limit: int,
    query_text: str | None = None,
    pool: int | None = None,
    token_budget: int | None = None,
    neighbours: int = 0,
    expand: int = EXPAND_HITS,
    rrf_k: int = RRF_K,
    exclude_session_id: str | None = None,
    exclude_from_seq: int | None = None,
    when: Sequence[TimeSpan] | None = None,
    date_weight: float = DATE_WEIGHT,
    session_cap: int | None = None,
    vector_index: bool | None = None,
    cjk: CjkMethod = CJK_METHOD,
    neighbour_weight: float | None = NEIGHBOUR_WEIGHT,
    speaker: str | None = None,
    speaker_weight: float = SPEAKER_WEIGHT,
) -> list[RecalledSegment]:
    """The best segments of ``user_id`` for a query, best first.

    Args:
        query_embedding: the query's embedding (same model as the segment keys).
        limit: at most this many hits (before neighbour expansion).
        query_text: the query's text for full-text ranking; ``None`` ranks by vector only.
        pool: candidates each ranker contributes to the fusion (default: ``limit``).
        token_budget: if set, segments are taken best first while their ``tokens`` fit
            in this many tokens; one that does not fit is skipped and smaller ones after
            it may still fit.
        neighbours: add the segments of the same session within this many turns
            (``seq``) before and after each of the best hits, budget permitting, with
            ``score`` 0 and ``neighbour_of`` set. 0 disables.
        expand: only the best ``expand`` hits get neighbours.
        neighbour_weight: from 0 to 1; a neighbour ``d`` turns from its hit
            (:func:`turns_apart`) is placed among the hits as if its score were the hit's
            times ``neighbour_weight ** d`` (ties: the earlier hit and its neighbours first;
            0 puts every neighbour after every hit); default :data:`NEIGHBOUR_WEIGHT`.
            ``None`` puts each hit's neighbours straight after it.
        rrf_k: the fusion constant k (default :data:`RRF_K`).
        exclude_session_id, exclude_from_seq: leave out segments of that session whose
            last turn is at or after that seq (turns still in the recent window).
        when: periods the query names (:func:`memory.dates.time_spans`); the user's
            segments dated within any of them, nearest first, join the fusion as a
            third ranked list weighted ``date_weight``. ``None`` or empty: no date ranker.
        session_cap: if set, at most this many hits of one conversation day (session
            and calendar date of ``session_date``) come before the hits of other days;
            the rest follow in their order. ``None``: score order only.
        vector_index: ``True`` ranks by vector over the HNSW index, ``False`` exactly over
            every row of the user; ``None`` (the default) chooses by the user's archive size
            and share of the table (:data:`INDEX_FROM`, :data:`INDEX_SHARE`).
        cjk: how the query's CJK text becomes lexemes (:func:`memory.fulltext.cjk_terms`);
            it must be the method the segments were stored with (:data:`~memory.fulltext.CJK_METHOD`).
        speaker: the label of the lines the query is about (``Melanie`` for ``Melanie: ...``
            lines, :func:`memory.archive.turn_line`; :func:`named_speaker` finds it), or ``None``.
            A segment whose content starts with ``speaker + ": "`` has its fused ``score``
            multiplied by ``speaker_weight`` before the hits are ranked and cut to ``limit``;
            with ``neighbour_weight`` set, a neighbour's place is multiplied by its own factor
            over its hit's (with ``None`` neighbours follow their hit as ever) (default
            :data:`SPEAKER_WEIGHT`; 1 turns it off).

    Raises:
        ValueError: ``neighbour_weight`` outside 0 to 1 (or NaN), or ``speaker_weight`` not
            positive and finite.
        StorageError: the database failed (``memory.database.storage_errors``).
    """
    if neighbour_weight is not None and not 0.0 <= neighbour_weight <= 1.0:
        raise ValueError(f"neighbour_weight must be None or from 0 to 1, got {neighbour_weight!r}")
    if not 0.0 < speaker_weight < math.inf:  # NaN too
        raise ValueError(f"speaker_weight must be positive and finite, got {speaker_weight!r}")
    exclude = ""
    params: dict[str, Any] = {"user_id": user_id, "q": list(query_embedding), "limit": int(limit), "k": int(rrf_k)}
    params["pool"] = int(pool if pool is not None else limit)
    params["qt"] = query_text or ""
    params["cjk"] = cjk_terms(query_text or "", method=cjk)
    exclude_near = exclude_a = excluded_count = ""
    if exclude_session_id is not None and exclude_from_seq is not None:
        exclude = " AND NOT (session_id = :xs AND last_seq >= :xseq)"
        exclude_near = " AND NOT (s.session_id = :xs AND s.last_seq >= :xseq)"
        exclude_a = " AND NOT (a.session_id = :xs AND a.last_seq >= :xseq)"
        excluded_count = (
            " - (SELECT count(*) FROM archived_segments"
            " WHERE user_id = :user_id AND session_id = :xs AND last_seq >= :xseq)"
        )
        params.update(xs=exclude_session_id, xseq=int(exclude_from_seq))
    parts = {"dated_cte": "", "dated_score": "", "dated_found": "", "found": "found"}
    if when:
        parts = {
            "dated_cte": _DATED_CTE.format(exclude_a=exclude_a),
            "dated_score": _DATED_SCORE,
            "dated_found": _DATED_FOUND,
            "found": "found_dated",
        }
        params.update(
            when_start=[w.start for w in when], when_end=[w.end for w in when], date_weight=float(date_weight)
        )
    params["index_pool"] = min(params["pool"], INDEX_POOL)
    params["speaker_label"] = label = f"{speaker}: " if speaker else ""
    params["speaker_weight"] = float(speaker_weight)
    # the index path's settings are transaction-local; the exact path (known beforehand) needs no
    # transaction, so its statement runs alone, without the BEGIN and ROLLBACK round trips
    reader = autocommit_engine(engine) if vector_index is False else engine
    with storage_errors(exclude_session_id), reader.connect() as conn:
        use_index = vector_index if vector_index is not None else _index_pays(conn, user_id, params["pool"])
        if use_index:
            # SET LOCAL: this transaction only; recall is a read and the connection returns to the pool as it was
            conn.execute(
                text(
                    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                    "set_config('hnsw.ef_search', :ef, true), set_config('hnsw.max_scan_tuples', :scan, true)"
                ),
                {"ef": str(max(params["index_pool"], EF_SEARCH)), "scan": str(MAX_SCAN_TUPLES)},
            )
        params["frequent_rows"] = FREQUENT_ROWS if use_index else 0  # 0: no term is frequent, all matches ranked
        vec_cte = (_VEC_INDEX if use_index else _VEC_EXACT).format(
            exclude=exclude, dim=len(params["q"]), key=archive_hnsw_key(len(params["q"]))
        )
        # the neighbours come with the hits, unless a session cap must reorder the hits first
        together = neighbours > 0 and expand > 0 and session_cap is None
        sql = _RANKED.format(
            vec_cte=vec_cte,
            text_from=(_TEXT_FROM_INDEX if use_index else _TEXT_FROM_EXACT).format(exclude=exclude),
            exclude=exclude,
            excluded_count=excluded_count,
            ranked=(_HITS_AND_NEIGHBOURS if together else _HITS).format(
                dated_score=parts["dated_score"], found=parts["found"], exclude_near=exclude_near
            ),
            **parts,
        )
        if together:
            params.update(span=int(neighbours), expand=int(expand))
        rows = conn.execute(text(sql).bindparams(_QUERY_VECTOR), params).fetchall()
        hits = [_segment(r) for r in rows if not together or r.part == 0]
        factor = _speaker_factor(label, speaker_weight)
        if session_cap is not None:
            hits = _cap_per_day(hits, session_cap)
        near: Sequence[Row[Any]] = [r for r in rows if r.part == 1] if together else []
        expanded = hits[: max(int(expand), 0)]
        if neighbours > 0 and expanded and not together:
            near = conn.execute(
                text(_NEIGHBOURS.format(exclude=exclude_near)).bindparams(_QUERY_VECTOR),
                {
                    **params,
                    "span": int(neighbours),
                    "hit_ids": [h.id for h in expanded],
                    "hit_sessions": [h.session_id for h in expanded],
                    "hit_first": [h.first_seq for h in expanded],
                    "hit_last": [h.last_seq for h in expanded],
                },
            ).fetchall()
    by_hit: dict[int, list[RecalledSegment]] = {}
    for r in near:
        by_hit.setdefault(r.neighbour_of, []).append(_segment(r, neighbour_of=r.neighbour_of))
    left = token_budget
    taken: set[int] = set()
    out: list[RecalledSegment] = []
    for seg in _interleave(hits, by_hit, neighbour_weight, factor):
        if seg.id in taken or (left is not None and seg.tokens > left):
            continue
        taken.add(seg.id)
        out.append(seg)
        if left is not None:
            left -= seg.tokens
    return out


def _speaker_factor(label: str, weight: float) -> Callable[[RecalledSegment], float] | None:
    """A segment's score factor for :func:`recall_segments`' ``speaker`` (``label``: its lines'
    ``"Name: "``, empty for none): ``weight`` for that speaker's segments, 1 for the rest; ``None``
    when it changes nothing."""
    if not label or weight == 1.0:
        return None
    return lambda seg: weight if seg.content.startswith(label) else 1.0


def _interleave(
    hits: list[RecalledSegment],
    by_hit: dict[int, list[RecalledSegment]],
    weight: float | None,
    factor: Callable[[RecalledSegment], float] | None = None,
) -> list[RecalledSegment]:
    """``hits`` (in their given order) with their neighbours (``by_hit``, by hit id) placed as
    :func:`recall_segments`' ``neighbour_weight`` says; a segment may appear twice (as a hit and
    as a neighbour). With ``factor`` (the speaker's, :func:`_speaker_factor`; the hits' scores
    already carry it) a neighbour's place is also multiplied by its own factor over its hit's.

    Hits keep their order: each ranks at the lowest score of the hits up to it, which is its own
    score when the hits are in score order, and after a ``session_cap`` has moved a hit back,
    no more than the hits now before it."""
    grouped = [(hit, seg) for hit in hits for seg in [hit, *by_hit.get(hit.id, [])]]
    if weight is None:
        return [seg for _, seg in grouped]
    level: dict[int, float] = {}
    lowest = float("inf")
    for hit in hits:
        lowest = min(lowest, hit.score)
        level[hit.id] = lowest

    def key(item: tuple[int, tuple[RecalledSegment, RecalledSegment]]) -> tuple[float, int]:
        position, (hit, seg) = item
        if seg is hit:
            return -level[hit.id], position
        speaker = factor(seg) / factor(hit) if factor is not None else 1.0
        return -level[hit.id] * weight ** turns_apart(seg, hit) * speaker, position

    return [seg for _, (_, seg) in sorted(enumerate(grouped), key=key)]


def turns_apart(segment: RecalledSegment, hit: RecalledSegment) -> int:
    """How many turns (``seq``) ``segment`` lies before or after ``hit``, at least 1: the ``d`` of
    :data:`NEIGHBOUR_WEIGHT` (one session's segments never overlap)."""
    return max(segment.first_seq - hit.last_seq, hit.first_seq - segment.last_seq, 1)


ARCHIVE_SIZES = (
    "coalesce((SELECT segments FROM archive_counts WHERE user_id = :u), 0) AS archived, "
    "(SELECT reltuples FROM pg_class WHERE oid = CAST('archived_segments' AS regclass)) AS archive_rows"
)
"""The two numbers :func:`index_pays` takes, as ``SELECT`` columns for the user ``:u``: their
archived segments (``archive_counts``, kept by triggers) and the table's estimated rows."""


def _index_pays(conn: Connection, user_id: str, pool: int) -> bool:
    """:func:`index_pays` for ``user_id``, read: one primary-key read and one catalog read."""
    row = conn.execute(text(f"SELECT {ARCHIVE_SIZES}"), {"u": user_id}).one()
    return index_pays(int(row.archived), float(row.archive_rows or 0), pool)


def index_pays(archived: int, table_rows: float, pool: int) -> bool:
    """Whether the HNSW path is the one to take for a user with ``archived`` segments when the
    archive table holds about ``table_rows`` (``pg_class.reltuples``; 0 or less: unknown), for
    ``pool`` candidates: a large archive (:data:`INDEX_FROM`) that is a large share of the table
    (:data:`INDEX_SHARE`). :func:`recall_segments` reads the two numbers itself unless given
    ``vector_index``; :meth:`memory.store.Store.session_reads` reads them with other things."""
    if archived < max(INDEX_FROM, pool):
        return False
    return table_rows <= 0 or archived / max(table_rows, archived) >= INDEX_SHARE


_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
"""Kana, CJK ideographs and Hangul: a name with one of these is found wherever it appears, as
these scripts run words together or attach particles to them ("민수는", "さくらは")."""
_WORDLIKE = re.compile(r"\w")
"""A name must hold a letter or digit to count: one of only spaces or marks ("!!") is ignored."""
_GREETING = r"(?:(?:hey|hi|hello|dear|oh|ok|okay|well|so|yo|thanks|thank you)[\s,，]+|(?:嗨|哈喽|你好|亲爱的)[\s,，]*)?"
_ADDRESS_BEFORE = re.compile(r"^\s*" + _GREETING + r"$", re.I)
_ADDRESS_AFTER = re.compile(r"^\s*(?:[,，!！:：]|$)")
_ADDRESS_END = re.compile(r"[,，]\s*$")
_TRAILING = re.compile(r"^[\s.!?。！？…~]*$")


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    name: str
    address: bool
    """Said to the person ("Melanie, what did I paint?", "Hey Mel!", "..., Mel?"), not about them."""


def _mentions(message: str, names: Iterable[str]) -> list[_Mention]:
    """Where ``names`` occur in ``message``: longest names first, a shorter one never inside a
    longer one's match ("Mary Jane" is not also "Jane"); spaces inside a name match any run of
    spaces; a name in a spaced script as a whole word, case-insensitive, with a possessive "'s"."""
    found: list[_Mention] = []
    wanted = {" ".join(n.split()): n for n in names if _WORDLIKE.search(n)}
    for name in sorted(wanted, key=len, reverse=True):
        body = r"\s+".join(re.escape(part) for part in name.split())
        pattern = body if _UNSPACED.search(name) else r"(?<!\w)" + body + r"(?:['’]s)?(?!\w)"
        for m in re.finditer(pattern, message, re.I):
            if any(m.start() < f.end and f.start < m.end() for f in found):
                continue
            before, after = message[: m.start()], message[m.end() :]
            address = bool(
                (_ADDRESS_BEFORE.match(before) and _ADDRESS_AFTER.match(after))
                or (_ADDRESS_END.search(before) and _TRAILING.match(after))
            )
            found.append(_Mention(m.start(), m.end(), wanted[name], address))
    return found


def named_speaker(message: str, names: Mapping[str, str]) -> str | None:
    """The label of the one speaker ``message`` is about, for :func:`recall_segments`' ``speaker``.

    ``names`` maps each name a speaker goes by (the user's display name; the character's
    name and nickname) to the label of that speaker's archived lines (``User``, the
    character's name). A name counts as a whole word, case-insensitive ("melanie's" names
    Melanie, "Melanies" does not); a name in kana, CJK or Hangul, wherever it appears; a name
    without a letter or digit, never; of two overlapping names, the longer. A name the message
    is said to rather than about does not count: at the start, alone or after a greeting and
    before a comma or "!" ("Melanie, what did I paint?", "Hey Mel! ..."), or at the end after a
    comma ("..., Mel?"). ``None`` when the message is about no speaker, or about two.

    Known limits: a name that is also a common word ("Will", "May") is found in that word, and
    a short CJK name inside a longer word (a persona "小雨" in "下小雨了")."""
    labels = {names[m.name] for m in _mentions(message, names) if not m.address}
    return labels.pop() if len(labels) == 1 else None


def without_names(message: str, names: Iterable[str]) -> str:
    """``message`` without the speakers' ``names`` (wherever :func:`named_speaker` finds them,
    said to or about the person), spaces collapsed; ``message`` itself when it holds no name, or
    nothing but names.

    The text a user's message is embedded from (the runtime, the replay and the re-embed). Its
    vector is the recall query while the message is the newest, and a part of its archive key;
    archive keys are composed from turns' texts, which carry no speaker labels, so a name pulls
    towards lines that address that person by name rather than towards what is said, and who
    is asked about is :func:`named_speaker`'s part. On the LoCoMo tuning split (evidence recall %
    at 250 / 500 / 1,000 / 2,000 tokens, with the speaker ranking): 59.2 / 70.0 / 79.5 / 84.2 with
    the names, 62.3 / 71.5 / 80.4 / 86.3 without (``scripts/eval_recall.py --components``)."""
    mentions = sorted(_mentions(message, names), key=lambda m: m.start)
    if not mentions:
        return message
    parts, at = [], 0
    for m in mentions:
        parts.append(message[at : m.start])
        at = m.end
    parts.append(message[at:])
    text = " ".join(" ".join(parts).split())
    return text if _WORDLIKE.search(text) else message


ENRICH_WORDS = 4
"""A message of at most this many words (a CJK character counts as two thirds of a word,
Chinese words averaging about 1.5 characters) says too little to recall by alone;
:func:`enrich_query` adds the turns before it. Up to twice as many words, it does so when
the message opens with a connective or ends on a pronoun."""
ENRICH_TURNS = 2
"""How many turns before the message :func:`enrich_query` adds."""
_ANAPHORA = re.compile(
    r"^\s*(?:and|but|so|then|what about|how about|and what about)\b|\b(?:that|this|it|those|these|her|him|them|she|he|they|there)\b[\s?!.]*$"
    r"|^\s*(?:那|然后|后来|还有|那么|所以)|(?:呢|那个|这个|那件事|这件事|他|她|它|他们|她们)[\s?？!！。]*$",
    re.I,
)
_WORD = re.compile(r"[\u3400-\u9fff]|[^\W\u3400-\u9fff]+")


def enrich_query(message: str, previous: Sequence[str]) -> str:
    """The text to recall by for ``message``: the message itself, or, for a follow-up that
    says little alone ("那后来呢?", "and her?", "what happened with that?"), the last
    :data:`ENRICH_TURNS` turns of ``previous`` (oldest first) and then the message, one per line.

    A follow-up is a message of at most :data:`ENRICH_WORDS` words (a CJK character is
    two thirds of a word), or of at most twice that which opens with a connective ("and",
    "then", "那", "后来") or ends on a pronoun or "呢". With no previous turns the message
    is returned unchanged. Which turns join it: :func:`enrichment`.
    """
    return "\n".join([*(previous[i] for i in enrichment(message, previous)), message])


def enrichment(message: str, previous: Sequence[str]) -> list[int]:
    """The positions in ``previous`` of the turns :func:`enrich_query` puts before ``message``,
    oldest first: the last :data:`ENRICH_TURNS` that are not blank when ``message`` is a
    follow-up, else ``[]``. The engine composes the enriched query's vector from these turns'
    vectors and the message's (:func:`memory.archive.compose`) instead of embedding the text."""
    words = _WORD.findall(message)
    size = sum(2 / 3 if len(w) == 1 and "\u3400" <= w <= "\u9fff" else 1 for w in words)
    short = size <= ENRICH_WORDS or (size <= 2 * ENRICH_WORDS and _ANAPHORA.search(message) is not None)
    if not previous or not short:
        return []
    start = max(len(previous) - ENRICH_TURNS, 0)
    return [i for i in range(start, len(previous)) if previous[i].strip()]


def _cap_per_day(hits: list[RecalledSegment], cap: int) -> list[RecalledSegment]:
    """``hits`` with at most ``cap`` of each (session, day) first, the rest after, each part in order."""
    seen: dict[tuple[str, object], int] = {}
    first: list[RecalledSegment] = []
    rest: list[RecalledSegment] = []
    for hit in hits:
        day = (hit.session_id, hit.session_date.date())
        seen[day] = seen.get(day, 0) + 1
        (first if seen[day] <= max(int(cap), 1) else rest).append(hit)
    return first + rest


def _segment(r: Row[Any], neighbour_of: int | None = None) -> RecalledSegment:
    return RecalledSegment(
        id=r.id,
        session_id=r.session_id,
        first_seq=r.first_seq,
        last_seq=r.last_seq,
        content=r.content,
        tokens=r.tokens,
        session_date=r.session_date,
        distance=float(r.distance),
        vector_rank=getattr(r, "vector_rank", None),
        text_rank=getattr(r, "text_rank", None),
        score=float(getattr(r, "score", 0.0) or 0.0),
        neighbour_of=neighbour_of,
    )
