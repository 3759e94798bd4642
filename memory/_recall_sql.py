"""The SQL of recall: each ranker builds its own common table expressions, and the statement
joins them.

Private to :mod:`memory.recall`. The vector ranker (exact, or over the HNSW index), the full-text
ranker and the date ranker each give CTEs that end in a ranked list (``vec``, ``fts``,
``dated``: ``id`` and rank ``r``); the fusion pairs the lists (``found``, ``found_dated``); the
hits, or the hits with their neighbours, end the statement. Each CTE is a SQLAlchemy Core
:class:`~sqlalchemy.sql.expression.CTE`; ``prefix_with("MATERIALIZED")`` compiles to
``AS MATERIALIZED``, which the plans rely on. Why each CTE is materialized and how each plan
was measured: ``docs/decisions/recall.md``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from sqlalchemy import TextClause, bindparam, column, text
from sqlalchemy.sql.expression import CTE, TextualSelect

from memory.vectors import Vector

QUERY_VECTOR = bindparam("q", type_=Vector())
"""``:q``, the query embedding, sent in binary (:class:`memory.vectors.Vector`)."""

_USES_Q = re.compile(r":q\b")

ARCHIVE_HNSW_INDEX = "ix_archived_segments_embedding_hnsw"
"""The archive's HNSW index (migration 0017; :func:`archive_hnsw_index_ddl`)."""

SEGMENT_COLUMNS = ("id", "session_id", "first_seq", "last_seq", "content", "tokens", "session_date", "distance")
"""The columns of a recalled row, before its ranks and score."""
HIT_COLUMNS = (*SEGMENT_COLUMNS, "vector_rank", "text_rank", "score")
"""The columns of a hit."""


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


def distance(alias: str = "", *, vectorless: bool = False) -> str:
    """The cosine distance of the key of row ``alias`` (none: unqualified) to the query vector
    ``:q``; ``NULL`` in a vectorless statement (no query vector: the embedder was down), and
    for a segment stored without a key until the backfill composes it."""
    if vectorless:
        return "CAST(NULL AS double precision)"
    return f"{alias}{'.' if alias else ''}embedding <=> CAST(:q AS vector)"


def _text(sql: str) -> TextClause:
    """``sql`` as a text clause, its ``:q`` typed as the binary query vector."""
    clause = text(sql)
    return clause.bindparams(QUERY_VECTOR) if _USES_Q.search(sql) else clause


def _select(sql: str, *columns: str) -> TextualSelect:
    return _text(sql).columns(*(column(name) for name in columns))


def cte(name: str, sql: str, *columns: str, materialized: bool = False) -> CTE:
    """One CTE named ``name`` over ``sql`` (returning ``columns``); ``materialized``: ``AS MATERIALIZED``."""
    made = _select(sql, *columns).cte(name)
    return made.prefix_with("MATERIALIZED") if materialized else made


@dataclass(frozen=True, kw_only=True)
class Excluded:
    """The rows every ranker reads besides the user's: with ``scoped``, only character
    ``:character_id``'s; and, with ``active``, not the segments of session ``:xs`` whose last turn
    is at or after ``:xseq`` (turns still in the recent window)."""

    active: bool
    scoped: bool = False

    def clause(self, alias: str = "") -> str:
        """`` AND ...`` on the rows of ``alias`` (none: unqualified columns), or ``""``."""
        prefix = f"{alias}." if alias else ""
        scope = f" AND {prefix}character_id = :character_id" if self.scoped else ""
        if not self.active:
            return scope
        return f"{scope} AND NOT ({prefix}session_id = :xs AND {prefix}last_seq >= :xseq)"

    def scope(self) -> str:
        """The character filter alone, on ``archive_counts``' rows (``""`` unscoped)."""
        return " AND character_id = :character_id" if self.scoped else ""

    def count(self) -> str:
        """What the excluded segments take off the user's N (the full-text idf's document count)."""
        if not self.active:
            return ""
        return (
            " - (SELECT count(*) FROM archived_segments "
            "WHERE user_id = :user_id AND session_id = :xs AND last_seq >= :xseq)"
        )


@dataclass(frozen=True, kw_only=True)
class VectorRanker:
    """The vector ranker (``vec``), exact over every row of the user, or over the HNSW index.

    Exact: every row of the user scored in ``mine`` (``MATERIALIZED``, so the planner cannot
    swap in the HNSW index). Index: an iterative scan (``relaxed_order``) over the half-precision
    expression index (migration 0017) that goes on until ``:index_pool`` rows of the user are
    found (``near``), then re-sorted by exact (single-precision) distance. The ``ORDER BY`` must
    be the index's expression, ``CAST(embedding AS halfvec(N))``, for the planner to use it."""

    use_index: bool
    dim: int
    vectorless: bool = False
    """No query vector: the ranker's list is empty."""

    def ctes(self, excluded: Excluded) -> list[CTE]:
        if self.vectorless:
            return [cte("vec", "SELECT CAST(NULL AS bigint) AS id, CAST(NULL AS bigint) AS r WHERE false", "id", "r")]
        scored = (
            "SELECT id, embedding <=> CAST(:q AS vector) AS distance FROM archived_segments "
            f"WHERE user_id = :user_id{excluded.clause()}"
        )
        if self.use_index:
            by_index = (
                f" ORDER BY {archive_hnsw_key(self.dim)} <=> CAST(CAST(:q AS vector) AS halfvec({int(self.dim)})) "
                "LIMIT :index_pool"
            )
            source = cte("near", scored + by_index, "id", "distance", materialized=True)
            limit = ""
        else:
            source = cte("mine", scored, "id", "distance", materialized=True)
            limit = " LIMIT :pool"
        ranked = (
            f"SELECT id, row_number() OVER (ORDER BY distance, id) AS r FROM {source.name} "
            f"WHERE distance IS NOT NULL ORDER BY distance, id{limit}"
        )
        return [source, cte("vec", ranked, "id", "r")]


@dataclass(frozen=True, kw_only=True)
class TextRanker:
    """The full-text ranker (``fts``): an idf (BM25's) times ``ts_rank`` per query term, summed.

    ``common`` (the table's most common lexemes, from ``pg_stats``) is ``MATERIALIZED`` so that it
    is read once; ``df`` (one row per query term) too, so that the planner does not recompute it
    for every matching row. On the index path (``:frequent_rows`` > 0) a term in more than that
    many of the user's rows is not searched by the GIN index; its count comes from ``pg_stats``.
    On the index path matching rows are found by the GIN index on ``search``; on the exact path
    the user's rows are read by the ``user_id`` btree, then filtered (``OFFSET 0`` keeps the
    planner from the GIN index, whose lists for a common word span every user's rows). A row's
    score is summed in term order (``ORDER BY df.t``): floating-point addition depends on the
    order, and rows of equal score must not swap places with the plan."""

    use_index: bool

    def ctes(self, excluded: Excluded) -> list[CTE]:
        rows = (
            f"FROM archived_segments WHERE user_id = :user_id{excluded.clause()} AND"
            if self.use_index
            else "FROM (SELECT id, search FROM archived_segments "
            f"WHERE user_id = :user_id{excluded.clause()} OFFSET 0) AS mine_text WHERE"
        )
        return [
            cte(
                "total",
                "SELECT coalesce((SELECT sum(segments) FROM archive_counts WHERE user_id = :user_id"
                f"{excluded.scope()}), 0)"
                f"{excluded.count()} AS n",
                "n",
            ),
            cte(
                "common",
                "SELECT e.elem, e.freq FROM pg_stats AS st, "
                "unnest(CAST(CAST(st.most_common_elems AS text) AS text[]), st.most_common_elem_freqs) "
                "AS e(elem, freq) "
                "WHERE st.schemaname = current_schema() AND st.tablename = 'archived_segments' "
                "AND st.attname = 'search' AND CAST(:frequent_rows AS real) > 0",
                "elem",
                "freq",
                materialized=True,
            ),
            cte(
                "shares",
                "SELECT t, coalesce((SELECT max(freq) FROM common WHERE common.elem = t), 0) AS share "
                "FROM unnest(companion_search_terms(CAST(:qt AS text), CAST(:cjk AS text[]))) AS t",
                "t",
                "share",
            ),
            cte(
                "terms",
                "SELECT t, share, "
                "CAST(:frequent_rows AS real) > 0 AND share * (SELECT n FROM total) >= :frequent_rows AS frequent, "
                "CAST('''' || replace(replace(t, '\\', '\\\\'), '''', '''''') || '''' AS tsquery) AS tq "
                "FROM shares",
                "t",
                "share",
                "frequent",
                "tq",
            ),
            cte(
                "hits",
                f"SELECT id, search {rows} search @@ "
                "(SELECT CAST(string_agg(CAST(tq AS text), ' | ') AS tsquery) FROM terms WHERE NOT frequent)",
                "id",
                "search",
                materialized=True,
            ),
            cte(
                "df",
                "SELECT terms.t, terms.tq, "
                "CASE WHEN terms.frequent THEN terms.share * (SELECT n FROM total) ELSE count(hits.id) END AS df, "
                "(SELECT n FROM total) AS n "
                "FROM terms LEFT JOIN hits ON hits.search @@ terms.tq "
                "GROUP BY terms.t, terms.tq, terms.frequent, terms.share",
                "t",
                "tq",
                "df",
                "n",
                materialized=True,
            ),
            cte(
                "fts_score",
                "SELECT hits.id, "
                "sum(ln(1.0 + (df.n - df.df + 0.5) / (df.df + 0.5)) * ts_rank(hits.search, df.tq) ORDER BY df.t) AS s "
                "FROM hits JOIN df ON hits.search @@ df.tq GROUP BY hits.id",
                "id",
                "s",
            ),
            cte(
                "fts",
                "SELECT id, row_number() OVER (ORDER BY s DESC, id) AS r FROM fts_score ORDER BY s DESC, id LIMIT :pool",
                "id",
                "r",
            ),
        ]


@dataclass(frozen=True)
class DateRanker:
    """The date ranker (``dated``): the rows inside the periods ``:when_start``/``:when_end`` (the
    ``(user_id, session_date)`` index), by exact distance (``vectorless``: in archive order).
    ``MATERIALIZED`` keeps the planner from ordering them by walking the HNSW index under
    ``hnsw.iterative_scan`` (the index path's settings)."""

    vectorless: bool = False
    score = " + coalesce(:date_weight / (:k + f.date_rank), 0)"
    """Its term of the fused score."""

    def ctes(self, excluded: Excluded) -> list[CTE]:
        return [
            cte(
                "dated_rows",
                f"SELECT a.id, {distance('a', vectorless=self.vectorless)} AS distance FROM archived_segments AS a "
                "WHERE a.user_id = :user_id AND a.id IN (SELECT s.id "
                "FROM unnest(CAST(:when_start AS timestamptz[]), CAST(:when_end AS timestamptz[])) AS w(s, e) "
                "JOIN archived_segments AS s "
                f"ON s.user_id = :user_id AND s.session_date >= w.s AND s.session_date < w.e{excluded.clause('s')})"
                f"{excluded.clause('a')}",
                "id",
                "distance",
                materialized=True,
            ),
            cte(
                "dated",
                "SELECT id, row_number() OVER (ORDER BY distance, id) AS r FROM dated_rows "
                "ORDER BY distance, id LIMIT :pool",
                "id",
                "r",
            ),
        ]


def fusion(*, dated: bool) -> list[CTE]:
    """The rankers' lists paired by ``id`` (``found``; ``found_dated`` with the date ranker) by a
    hash ``FULL JOIN``: joining each list to the rows separately, the planner (which expects one
    row from a ``LIMIT``-ed CTE) chose a nested loop that compared every row with every hit."""
    found = [
        cte(
            "found",
            "SELECT coalesce(vec.id, fts.id) AS id, vec.r AS vector_rank, fts.r AS text_rank "
            "FROM vec FULL JOIN fts ON fts.id = vec.id",
            "id",
            "vector_rank",
            "text_rank",
        )
    ]
    if dated:
        found.append(
            cte(
                "found_dated",
                "SELECT coalesce(found.id, dated.id) AS id, found.vector_rank, found.text_rank, dated.r AS date_rank "
                "FROM found FULL JOIN dated ON dated.id = found.id",
                "id",
                "vector_rank",
                "text_rank",
                "date_rank",
            )
        )
    return found


def hits_sql(*, dated: bool, vectorless: bool = False) -> str:
    """The hits: the fused rows, best first, scored by the reciprocal-rank sum (``:k``) times the
    speaker's factor (``:speaker_weight`` for rows starting with ``:speaker_label``), at most ``:limit``."""
    return (
        "SELECT m.id, m.session_id, m.first_seq, m.last_seq, m.content, m.tokens, m.session_date, "
        f"{distance('m', vectorless=vectorless)} AS distance, f.vector_rank, f.text_rank, "
        "(coalesce(1.0 / (:k + f.vector_rank), 0) + coalesce(1.0 / (:k + f.text_rank), 0)"
        f"{DateRanker.score if dated else ''}) "
        "* CASE WHEN :speaker_label <> '' AND starts_with(m.content, :speaker_label) THEN :speaker_weight ELSE 1.0 END "
        f"AS score FROM {'found_dated' if dated else 'found'} AS f "
        "JOIN archived_segments AS m ON m.id = f.id AND m.user_id = :user_id "
        "ORDER BY score DESC, distance, m.id LIMIT :limit"
    )


def neighbours_sql(hits: str, excluded: Excluded, *, vectorless: bool = False) -> str:
    """The segments within ``:span`` turns of each hit of ``hits`` (rows ``h`` of ``hit``,
    ``session_id``, ``first_seq``, ``last_seq``): those that end inside the span, and the first one
    after it if it starts inside it. One session's segments never overlap (each turn is archived
    once), so no other segment can reach into the span; both parts are ranges of the
    ``(session_id, last_seq)`` index, whatever the session's length."""
    return (
        "SELECT s.id, s.session_id, s.first_seq, s.last_seq, s.content, s.tokens, s.session_date, "
        f"{distance('s', vectorless=vectorless)} AS distance, h.hit AS neighbour_of FROM {hits} "
        "CROSS JOIN LATERAL ("
        "(SELECT * FROM archived_segments AS a WHERE a.user_id = :user_id "
        "AND a.session_id = h.session_id AND a.last_seq BETWEEN h.first_seq - :span AND h.last_seq + :span) "
        "UNION ALL "
        "(SELECT * FROM archived_segments AS a WHERE a.user_id = :user_id "
        "AND a.session_id = h.session_id AND a.last_seq > h.last_seq + :span ORDER BY a.last_seq LIMIT 1)"
        ") AS s "
        f"WHERE s.user_id = :user_id AND s.first_seq <= h.last_seq + :span AND s.id <> h.hit{excluded.clause('s')}"
    )


def neighbour_ctes(*, dated: bool, excluded: Excluded, vectorless: bool = False) -> list[CTE]:
    """The neighbour ranker in the ranked statement: the hits (``hits_ranked``), the best
    ``:expand`` of them (``expanded``), and their neighbours (``neighbour_rows``)."""
    return [
        cte("hits_ranked", hits_sql(dated=dated, vectorless=vectorless), *HIT_COLUMNS, materialized=True),
        cte(
            "expanded",
            "SELECT id AS hit, session_id, first_seq, last_seq FROM hits_ranked "
            "ORDER BY score DESC, distance, id LIMIT :expand",
            "hit",
            "session_id",
            "first_seq",
            "last_seq",
        ),
        cte(
            "neighbour_rows",
            neighbours_sql("expanded AS h", excluded, vectorless=vectorless),
            *SEGMENT_COLUMNS,
            "neighbour_of",
        ),
    ]


_HITS_AND_NEIGHBOURS = (
    "SELECT 0 AS part, row_number() OVER (ORDER BY score DESC, distance, id) AS pos, "
    "id, session_id, first_seq, last_seq, content, tokens, session_date, distance, "
    "vector_rank, text_rank, score, CAST(NULL AS bigint) AS neighbour_of FROM hits_ranked "
    "UNION ALL "
    "SELECT 1, row_number() OVER (ORDER BY neighbour_of, first_seq), "
    "id, session_id, first_seq, last_seq, content, tokens, session_date, distance, "
    "NULL, NULL, NULL, neighbour_of FROM neighbour_rows "
    "ORDER BY part, pos"
)


@functools.cache
def ranked_statement(
    *,
    use_index: bool,
    excluding: bool,
    dated: bool,
    together: bool,
    dim: int,
    scoped: bool = False,
    vectorless: bool = False,
) -> TextualSelect:
    """The ranked ``SELECT``: the vector and full-text rankers, the date ranker when ``dated``,
    their fusion, and the hits; with ``together``, the neighbours of the best ``:expand`` hits as
    well, read by the same index ranges in the same statement (``part`` 0 rows are the hits in
    rank order, ``part`` 1 rows the neighbours by hit and ``first_seq``: one round trip, not two).
    ``vectorless``: no query vector (the embedder was down): the full-text and date rankers only.
    Built once per shape (statements are immutable values)."""
    excluded = Excluded(active=excluding, scoped=scoped)
    ctes = [
        *VectorRanker(use_index=use_index, dim=dim, vectorless=vectorless).ctes(excluded),
        *TextRanker(use_index=use_index).ctes(excluded),
        *(DateRanker(vectorless).ctes(excluded) if dated else []),
        *fusion(dated=dated),
    ]
    if not together:
        return _select(hits_sql(dated=dated, vectorless=vectorless), *HIT_COLUMNS).add_cte(*ctes)
    ctes += neighbour_ctes(dated=dated, excluded=excluded, vectorless=vectorless)
    return _select(_HITS_AND_NEIGHBOURS, "part", "pos", *HIT_COLUMNS, "neighbour_of").add_cte(*ctes)


@functools.cache
def neighbours_statement(*, excluding: bool, scoped: bool = False, vectorless: bool = False) -> TextualSelect:
    """The ``SELECT`` of the neighbours of hits given as arrays (``:hit_ids`` …), for a ranking a
    ``session_cap`` reordered."""
    given = (
        "unnest(CAST(:hit_ids AS bigint[]), CAST(:hit_sessions AS text[]), CAST(:hit_first AS int[]), "
        "CAST(:hit_last AS int[])) AS h(hit, session_id, first_seq, last_seq)"
    )
    sql = neighbours_sql(given, Excluded(active=excluding, scoped=scoped), vectorless=vectorless)
    sql += " ORDER BY h.hit, s.first_seq"
    return _select(sql, *SEGMENT_COLUMNS, "neighbour_of")
