"""Recall: the user's archived segments that best match a message, by hybrid search.

A :class:`RecallQuery` is a value: the query's embedding and text, its rankers' settings and
its exclusion. :func:`recall` runs it. The tuning settings a caller keeps from query to query
form a :class:`RecallPreset` (the engine's defaults: :data:`ENGINE_PRESET`); the evaluation
scripts define their own.

Up to three rankers run over the same rows, one user's segments only:

- **vector**: pgvector cosine distance (``<=>``) between the query embedding and each
  segment's key embedding, exact over the user's rows, or over the HNSW index of
  half-precision keys for a large archive that is a large share of the table
  (:func:`index_pays`: :data:`INDEX_FROM`, :data:`INDEX_SHARE`);
- **full text**: the query's lexemes (``companion_search_terms``: English stemming and
  stop words by PostgreSQL, plus CJK words by jieba, :mod:`memory.fulltext`) matched
  against the stored ``search`` tsvector of each segment's verbatim content. A segment scores
  ``Σ idf(t) · ts_rank(search, t)`` over the query terms ``t`` it contains, with
  ``idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5))`` over the user's N segments (the BM25
  idf of Robertson & Zaragoza 2009). On the index path a term in at least
  :data:`FREQUENT_ROWS` of the user's rows adds to the score of rows found by rarer terms
  but finds none by itself;
- **date** (only when the message names a period, :mod:`memory.dates`): the user's
  segments whose ``session_date`` falls in one of the periods, nearest by vector first.

The lists (``pool`` each) are fused by reciprocal rank, ``Σ 1 / (k + rank)``
(Cormack, Clarke & Büttcher 2009, SIGIR), with ``k`` = :data:`RRF_K`. Optionally the turns
next to the best hits join them (neighbour expansion): a neighbour ``d`` turns from its hit
is ranked among the hits as if its score were the hit's times :data:`NEIGHBOUR_WEIGHT` to the
power ``d``. When the message names one of the two speakers, the segments of that speaker's
lines rank as if their fused score were :data:`SPEAKER_WEIGHT` times higher.

The user filter is a hard ``WHERE user_id = …`` in every ranker, applied before any
ranking, so another user's segment can never come back. Recall is a read: one ``SELECT`` of
the user's segment count (none when the query sets ``vector_index``), one transaction-local
``set_config`` on the index path, and the ranked ``SELECT``, which reads the neighbours too
(with a ``session_cap``, they take a second ``SELECT``); no writes.

How every constant here was chosen, with the figures: ``docs/decisions/recall.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, text

from memory import _recall_sql as sql
from memory._recall_sql import ARCHIVE_HNSW_INDEX, archive_hnsw_index_ddl, archive_hnsw_key
from memory.database import autocommit_engine, storage_errors
from memory.dates import TimeSpan
from memory.fulltext import CJK_METHOD, CjkMethod, cjk_terms

__all__ = [
    "ARCHIVE_HNSW_INDEX",
    "ARCHIVE_SIZES",
    "DATE_WEIGHT",
    "ENGINE_PRESET",
    "EXPAND_HITS",
    "NEIGHBOUR_WEIGHT",
    "RRF_K",
    "SESSION_CAP",
    "SPEAKER_WEIGHT",
    "Exclusion",
    "RecallPreset",
    "RecallQuery",
    "RecalledSegment",
    "archive_hnsw_index_ddl",
    "archive_hnsw_key",
    "index_pays",
    "recall",
    "turns_apart",
    "within_budget",
]

RRF_K = 10
"""The reciprocal-rank-fusion constant k (Cormack et al. use 60 for long TREC runs; at our
budgets a smaller k measured better)."""
EXPAND_HITS = 5
"""How many of the best hits get their neighbours added (``neighbours > 0``)."""
NEIGHBOUR_WEIGHT = 0.8
"""A segment ``d`` turns before or after its hit ranks as if its fused score were the hit's
times ``0.8 ** d``."""
SPEAKER_WEIGHT = 3.0
"""How much more a segment of the speaker a message names counts (``speaker``): its fused
score, and the place of a neighbour of that speaker, are multiplied by this."""
DATE_WEIGHT = 1.0
"""Weight of the date ranker in the fusion (``when``): its ``1 / (k + rank)`` is multiplied by this."""
SESSION_CAP: int | None = None
"""Hits of one conversation day taken before other days' (``session_cap``); ``None``: off."""
INDEX_FROM = 5_000
"""Segments of one user from which the vector ranker uses the HNSW index (if the user's share of
the table is also at least :data:`INDEX_SHARE`); below it, exact search."""
INDEX_SHARE = 0.05
"""The user's least share of the archive table (``pg_class.reltuples``) for the index path.
An iterative scan visits about ``pool / share`` rows to find ``pool`` of the user's."""
EF_SEARCH = 100
"""Least ``hnsw.ef_search`` of the index path (at least the vector ranker's pool there)."""
INDEX_POOL = 100
"""On the index path, the vector ranker contributes at most this many candidates (the other
rankers keep ``pool``)."""
FREQUENT_ROWS = 1_000
"""On the index path, a query term the user's archive holds in about this many rows or more
(estimated from ``most_common_elems`` of ``search``) finds no candidates by itself; it still
adds to the score of rows a rarer term finds."""
MAX_SCAN_TUPLES = 50_000
"""``hnsw.max_scan_tuples`` of the index path: rows an iterative scan may visit."""


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
    distance: float | None
    """Cosine distance of the segment's key embedding to the query, 0 (same direction) to 2;
    ``None`` when recall ran without a query vector or the segment has no key yet."""
    vector_rank: int | None = None
    """1-based rank among the user's segments by ``distance``; ``None`` beyond the pool."""
    text_rank: int | None = None
    """1-based rank by full-text score; ``None`` if no query term matched or beyond the pool."""
    score: float = 0.0
    """Reciprocal-rank-fusion score, ``Σ 1/(k + rank)`` over the rankers, times ``speaker_weight``
    for a segment of the speaker the query names (:class:`RecallQuery`); 0 for a neighbour."""
    neighbour_of: int | None = None
    """For a segment added by neighbour expansion, the id of the hit it sits next to."""


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """Segments recall leaves out: those of ``session_id`` whose last turn is at or after
    ``from_seq`` (turns still in the recent window)."""

    session_id: str
    from_seq: int


@dataclass(frozen=True, kw_only=True)
class RecallPreset:
    """The settings of recall a caller keeps from query to query (what a message does not
    change): the limit and pool, neighbour expansion, and the rankers' weights. Each field is
    the :class:`RecallQuery` field of the same name."""

    limit: int
    pool: int | None = None
    neighbours: int = 0
    expand: int = EXPAND_HITS
    neighbour_weight: float | None = NEIGHBOUR_WEIGHT
    rrf_k: int = RRF_K
    date_weight: float = DATE_WEIGHT
    session_cap: int | None = SESSION_CAP
    speaker_weight: float = SPEAKER_WEIGHT
    cjk: CjkMethod = CJK_METHOD

    def query(
        self,
        *,
        user_id: str,
        character_id: str | None = None,
        query_embedding: Sequence[float] | None,
        query_text: str | None = None,
        when: Sequence[TimeSpan] | None = None,
        speaker: str | None = None,
        exclude: Exclusion | None = None,
        token_budget: int | None = None,
        vector_index: bool | None = None,
    ) -> RecallQuery:
        """The query of one message with this preset's settings (each argument as in :class:`RecallQuery`).

        Raises:
            ValueError: as :class:`RecallQuery`.
        """
        return RecallQuery(
            **asdict(self),
            user_id=user_id,
            character_id=character_id,
            query_embedding=query_embedding,
            query_text=query_text,
            when=when,
            speaker=speaker,
            exclude=exclude,
            token_budget=token_budget,
            vector_index=vector_index,
        )


@dataclass(frozen=True, kw_only=True)
class RecallQuery:
    """One recall of one user's archive: what to match, with which rankers, and what to leave out.

    Raises:
        ValueError: ``neighbour_weight`` outside 0 to 1 (or NaN), or ``speaker_weight`` not
            positive and finite.
    """

    user_id: str
    """Whose segments: the only rows any ranker reads."""
    character_id: str | None = None
    """Which character's segments of the user's (memory per user and character); ``None``: all of
    the user's (the memory scope ``user``)."""
    query_embedding: Sequence[float] | None = field(repr=False)
    """The query's embedding (same model as the segment keys); ``None`` (the embedder was down)
    runs the full-text and date rankers only, the date ranker's rows in archive order."""
    limit: int
    """At most this many hits (before neighbour expansion)."""
    query_text: str | None = None
    """The query's text for full-text ranking; ``None`` ranks by vector (and dates) only."""
    pool: int | None = None
    """Candidates each ranker contributes to the fusion (``None``: ``limit``)."""
    token_budget: int | None = None
    """If set, segments are taken best first while their ``tokens`` fit in this many tokens; one
    that does not fit is skipped and smaller ones after it may still fit."""
    vector_index: bool | None = None
    """The vector ranker: ``True`` over the HNSW index, ``False`` exactly over every row of the
    user, ``None`` chosen by the archive's size (:func:`index_pays`)."""
    cjk: CjkMethod = CJK_METHOD
    """The full-text ranker: how the query's CJK text becomes lexemes; it must be the method the
    segments were stored with."""
    when: Sequence[TimeSpan] | None = None
    """The date ranker: periods the query names (:func:`memory.dates.time_spans`); the user's
    segments dated within any of them, nearest first, join the fusion as a third list weighted
    ``date_weight``. ``None`` or empty: no date ranker."""
    date_weight: float = DATE_WEIGHT
    rrf_k: int = RRF_K
    """The fusion constant k."""
    neighbours: int = 0
    """Neighbour expansion: the segments of the same session within this many turns (``seq``)
    before and after each of the best ``expand`` hits join them, with ``score`` 0 and
    ``neighbour_of`` set. 0 disables."""
    expand: int = EXPAND_HITS
    neighbour_weight: float | None = NEIGHBOUR_WEIGHT
    """From 0 to 1: a neighbour ``d`` turns from its hit (:func:`turns_apart`) is placed among the
    hits as if its score were the hit's times ``neighbour_weight ** d`` (0 puts every neighbour
    after every hit). ``None`` puts each hit's neighbours straight after it."""
    speaker: str | None = None
    """The speaker ranking: the label of the lines the query is about (``Melanie`` for
    ``Melanie: ...`` lines, :func:`memory.archive.turn_line`), or ``None``. A segment whose content
    starts with ``speaker + ": "`` has its fused score multiplied by ``speaker_weight`` before the
    hits are cut to ``limit``; with ``neighbour_weight`` set, a neighbour's place is multiplied by
    its own factor over its hit's."""
    speaker_weight: float = SPEAKER_WEIGHT
    session_cap: int | None = None
    """If set, at most this many hits of one conversation day (session and calendar date of
    ``session_date``) come before the hits of other days; the rest follow in their order."""
    exclude: Exclusion | None = None
    """Segments left out of every ranker (and of the full-text document count)."""

    def __post_init__(self) -> None:
        if self.neighbour_weight is not None and not 0.0 <= self.neighbour_weight <= 1.0:
            raise ValueError(f"neighbour_weight must be None or from 0 to 1, got {self.neighbour_weight!r}")
        if not 0.0 < self.speaker_weight < math.inf:  # NaN too
            raise ValueError(f"speaker_weight must be positive and finite, got {self.speaker_weight!r}")

    @property
    def speaker_label(self) -> str:
        """``speaker`` as its lines begin (``"Melanie: "``), or ``""``."""
        return f"{self.speaker}: " if self.speaker else ""

    def together(self) -> bool:
        """Whether the neighbours are read in the ranked statement (no ``session_cap`` reorders the hits)."""
        return self.neighbours > 0 and self.expand > 0 and self.session_cap is None

    def params(self) -> dict[str, Any]:
        """The bind parameters of the ranked statement (``frequent_rows`` is set per path)."""
        pool = int(self.pool if self.pool is not None else self.limit)
        params: dict[str, Any] = {
            "user_id": self.user_id,
            "character_id": self.character_id,
            "q": list(self.query_embedding) if self.query_embedding is not None else None,
            "limit": int(self.limit),
            "k": int(self.rrf_k),
            "pool": pool,
            "qt": self.query_text or "",
            "cjk": cjk_terms(self.query_text or "", method=self.cjk),
            "index_pool": min(pool, INDEX_POOL),
            "speaker_label": self.speaker_label,
            "speaker_weight": float(self.speaker_weight),
        }
        if self.exclude is not None:
            params.update(xs=self.exclude.session_id, xseq=int(self.exclude.from_seq))
        if self.when:
            params.update(
                when_start=[w.start for w in self.when],
                when_end=[w.end for w in self.when],
                date_weight=float(self.date_weight),
            )
        if self.together():
            params.update(span=int(self.neighbours), expand=int(self.expand))
        return params


ENGINE_PRESET = RecallPreset(limit=100, pool=200, neighbours=2, session_cap=SESSION_CAP)
"""The engine's defaults (``COMPANION_RECALL_CANDIDATES``, ``COMPANION_RECALL_POOL``,
``COMPANION_RECALL_NEIGHBOURS`` at their defaults); the engine builds its preset from its settings."""


def recall(engine: Engine, query: RecallQuery) -> list[RecalledSegment]:
    """The best segments of ``query.user_id`` for ``query``, best first, within its token budget.

    Raises:
        StorageError: the database failed (``memory.database.storage_errors``).
    """
    params = query.params()
    excluding = query.exclude is not None
    # the index path's settings are transaction-local; the exact path (known beforehand) needs no
    # transaction, so its statement runs alone, without the BEGIN and ROLLBACK round trips
    reader = autocommit_engine(engine) if query.vector_index is False else engine
    with storage_errors(query.exclude.session_id if query.exclude else None), reader.connect() as conn:
        use_index = (
            query.vector_index
            if query.vector_index is not None
            else _index_pays(conn, query.user_id, query.character_id, params["pool"])
        )
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
        together = query.together()
        statement = sql.ranked_statement(
            use_index=bool(use_index),
            excluding=excluding,
            dated=bool(query.when),
            together=together,
            dim=len(params["q"] or ()),
            scoped=query.character_id is not None,
            vectorless=params["q"] is None,
        )
        rows = conn.execute(statement, params).fetchall()
        hits = [_segment(r) for r in rows if not together or r.part == 0]
        if query.session_cap is not None:
            hits = _cap_per_day(hits, query.session_cap)
        near: Sequence[Row[Any]] = [r for r in rows if r.part == 1] if together else []
        expanded = hits[: max(int(query.expand), 0)]
        if query.neighbours > 0 and expanded and not together:
            near = conn.execute(
                sql.neighbours_statement(
                    excluding=excluding, scoped=query.character_id is not None, vectorless=params["q"] is None
                ),
                {
                    **params,
                    "span": int(query.neighbours),
                    "hit_ids": [h.id for h in expanded],
                    "hit_sessions": [h.session_id for h in expanded],
                    "hit_first": [h.first_seq for h in expanded],
                    "hit_last": [h.last_seq for h in expanded],
                },
            ).fetchall()
    by_hit: dict[int, list[RecalledSegment]] = {}
    for r in near:
        by_hit.setdefault(r.neighbour_of, []).append(_segment(r, neighbour_of=r.neighbour_of))
    factor = _speaker_factor(query.speaker_label, query.speaker_weight)
    return within_budget(_interleave(hits, by_hit, query.neighbour_weight, factor), query.token_budget)


def within_budget(ranked: Sequence[RecalledSegment], budget: int | None) -> list[RecalledSegment]:
    """``ranked`` without repeats, taken in order while each fits in what is left of ``budget``
    tokens (one that does not fit is skipped; ``None``: no budget)."""
    left = budget
    taken: set[int] = set()
    out: list[RecalledSegment] = []
    for seg in ranked:
        if seg.id in taken or (left is not None and seg.tokens > left):
            continue
        taken.add(seg.id)
        out.append(seg)
        if left is not None:
            left -= seg.tokens
    return out


def _speaker_factor(label: str, weight: float) -> Callable[[RecalledSegment], float] | None:
    """A segment's score factor for :func:`recall`' ``speaker`` (``label``: its lines'
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
    :func:`recall`' ``neighbour_weight`` says; a segment may appear twice (as a hit and
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
    "coalesce((SELECT sum(segments) FROM archive_counts WHERE user_id = :u "
    "AND (CAST(:c AS text) IS NULL OR character_id = :c)), 0) AS archived, "
    "(SELECT reltuples FROM pg_class WHERE oid = CAST('archived_segments' AS regclass)) AS archive_rows"
)
"""The two numbers :func:`index_pays` takes, as ``SELECT`` columns for the user ``:u`` and the
character ``:c`` (``NULL``: all of the user's): their archived segments (``archive_counts``, kept
by triggers) and the table's estimated rows."""


def _index_pays(conn: Connection, user_id: str, character_id: str | None, pool: int) -> bool:
    """:func:`index_pays` for ``user_id`` (and ``character_id``), read: one primary-key range read
    and one catalog read."""
    row = conn.execute(text(f"SELECT {ARCHIVE_SIZES}"), {"u": user_id, "c": character_id}).one()
    return index_pays(int(row.archived), float(row.archive_rows or 0), pool)


def index_pays(archived: int, table_rows: float, pool: int) -> bool:
    """Whether the HNSW path is the one to take for a user with ``archived`` segments when the
    archive table holds about ``table_rows`` (``pg_class.reltuples``; 0 or less: unknown), for
    ``pool`` candidates: a large archive (:data:`INDEX_FROM`) that is a large share of the table
    (:data:`INDEX_SHARE`). :func:`recall` reads the two numbers itself unless the query sets
    ``vector_index``; :meth:`memory.assembly.AssemblyReads.session` reads them with other things."""
    if archived < max(INDEX_FROM, pool):
        return False
    return table_rows <= 0 or archived / max(table_rows, archived) >= INDEX_SHARE


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
        distance=float(r.distance) if r.distance is not None else None,
        vector_rank=getattr(r, "vector_rank", None),
        text_rank=getattr(r, "text_rank", None),
        score=float(getattr(r, "score", 0.0) or 0.0),
        neighbour_of=neighbour_of,
    )
