"""The SQL of recall: one template per ranker, and the statement they make together.

Private to :mod:`memory.recall`. Each ranker contributes its CTE (vector: exact or over the
HNSW index; full text; dates), the fusion pairs their lists, and the hits, or the hits with
their neighbours, end the statement. Why each CTE is ``MATERIALIZED`` and how each plan was
measured: ``docs/decisions/recall.md``.
"""

from __future__ import annotations

from sqlalchemy import bindparam

from memory.vectors import Vector

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

QUERY_VECTOR = bindparam("q", type_=Vector())
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


def exclusion(alias: str = "") -> str:
    """The clause that leaves out the excluded session's segments from ``:xseq`` on (turns still
    in the recent window), on the rows of ``alias`` (none: unqualified columns)."""
    prefix = f"{alias}." if alias else ""
    return f" AND NOT ({prefix}session_id = :xs AND {prefix}last_seq >= :xseq)"


_EXCLUDED_COUNT = (
    " - (SELECT count(*) FROM archived_segments WHERE user_id = :user_id AND session_id = :xs AND last_seq >= :xseq)"
)
"""What the excluded segments take off the user's N (the full-text idf's document count)."""


def vector_cte(*, use_index: bool, excluding: bool, dim: int) -> str:
    """The vector ranker's CTEs (``vec``: ``id``, rank ``r``), exact or over the HNSW index."""
    template = _VEC_INDEX if use_index else _VEC_EXACT
    return template.format(exclude=exclusion() if excluding else "", dim=dim, key=archive_hnsw_key(dim))


def text_source(*, use_index: bool, excluding: bool) -> str:
    """Where the full-text ranker finds its matching rows: by the GIN index, or the user's rows."""
    return (_TEXT_FROM_INDEX if use_index else _TEXT_FROM_EXACT).format(exclude=exclusion() if excluding else "")


def ranked_statement(*, use_index: bool, excluding: bool, dated: bool, together: bool, dim: int) -> str:
    """The ranked ``SELECT``: the vector and full-text rankers, the date ranker when ``dated``,
    their fusion, and the hits; with ``together``, the neighbours of the best hits as well
    (``part`` 1 rows)."""
    found = "found_dated" if dated else "found"
    ranked = (_HITS_AND_NEIGHBOURS if together else _HITS).format(
        dated_score=_DATED_SCORE if dated else "",
        found=found,
        exclude_near=exclusion("s") if excluding else "",
    )
    return _RANKED.format(
        vec_cte=vector_cte(use_index=use_index, excluding=excluding, dim=dim),
        text_from=text_source(use_index=use_index, excluding=excluding),
        excluded_count=_EXCLUDED_COUNT if excluding else "",
        dated_cte=_DATED_CTE.format(exclude_a=exclusion("a") if excluding else "") if dated else "",
        dated_found=_DATED_FOUND if dated else "",
        ranked=ranked,
    )


def neighbours_statement(*, excluding: bool) -> str:
    """The ``SELECT`` of the neighbours of hits given as arrays (after a ``session_cap``)."""
    return _NEIGHBOURS.format(exclude=exclusion("s") if excluding else "")
