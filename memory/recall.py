"""Recall: the user's archived segments nearest to a query embedding.

The user filter is a hard ``WHERE user_id = …`` applied before ranking, so another
user's segment can never come back, however close it is. Ranking is pgvector cosine
distance over the HNSW index, with pgvector 0.8 iterative index scans
(``hnsw.iterative_scan = relaxed_order``) so the filter cannot starve the result;
rows are re-sorted by exact distance afterwards, as pgvector's README advises for
relaxed ordering. Recall is a read: it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from sqlalchemy import Engine, text

from memory.database import storage_errors


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
    """Cosine distance to the query, 0 (same direction) to 2."""


def recall_segments(
    engine: Engine,
    *,
    user_id: str,
    query_embedding: Sequence[float],
    limit: int,
    exclude_session_id: str | None = None,
    exclude_from_seq: int | None = None,
) -> list[RecalledSegment]:
    """The ``limit`` segments of ``user_id`` nearest to ``query_embedding``, nearest first.

    Args:
        exclude_session_id, exclude_from_seq: leave out segments of that session whose
            last turn is at or after that seq (turns still in the recent window).
    """
    vector = "[" + ",".join(f"{float(x):.7g}" for x in query_embedding) + "]"
    where = "user_id = :user_id"
    params: dict = {"user_id": user_id, "q": vector, "limit": int(limit)}
    if exclude_session_id is not None and exclude_from_seq is not None:
        where += " AND NOT (session_id = :xs AND last_seq >= :xseq)"
        params.update(xs=exclude_session_id, xseq=int(exclude_from_seq))
    sql = text(
        "SELECT id, session_id, first_seq, last_seq, content, tokens, session_date, "
        "embedding <=> CAST(:q AS vector) AS distance "
        f"FROM archived_segments WHERE {where} "
        "ORDER BY embedding <=> CAST(:q AS vector) LIMIT :limit"
    )
    with storage_errors(exclude_session_id), engine.connect() as conn:
        with conn.begin():
            conn.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
            rows = conn.execute(sql, params).fetchall()
    found = [
        RecalledSegment(
            id=r.id,
            session_id=r.session_id,
            first_seq=r.first_seq,
            last_seq=r.last_seq,
            content=r.content,
            tokens=r.tokens,
            session_date=r.session_date,
            distance=float(r.distance),
        )
        for r in rows
    ]
    return sorted(found, key=lambda s: (s.distance, s.id))
