"""The archive room: the only writer of ``archived_segments`` (``archive_counts`` is kept by triggers).

Segments are written by a compaction's transaction (:func:`add_segments`), read in turn order
(:meth:`Archive.segments`), counted (:meth:`Archive.count`) and recalled
(:meth:`Archive.recall`, :mod:`memory.recall`). Recall reads one user's rows only and changes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, func, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Session, col, select

from memory.database import autocommit_engine, storage_errors
from memory.fulltext import search_vector
from memory.recall import RecalledSegment, RecallQuery, recall
from memory.tables import ArchivedSegment, ChatSession, utcnow

SEGMENT_ROWS = 500
"""Archived segments one ``INSERT`` writes: 11 bind parameters each, well under PostgreSQL's
65,535 per statement."""


@dataclass(frozen=True, kw_only=True)
class NewSegment:
    """An archive segment to write: verbatim turns of one exchange plus its embedding."""

    first_seq: int
    last_seq: int
    content: str
    tokens: int
    """Estimated tokens of ``content``."""
    session_date: datetime
    embedding: list[float] | None
    """The key vector; ``None`` when the embedder was down (the backfill composes it, :mod:`memory.backfill`)."""


def add_segments(db: Session, *, session_id: str, user_id: str, segments: Sequence[NewSegment]) -> None:
    """Insert the segments in ``db``'s transaction: one multi-row ``INSERT`` per :data:`SEGMENT_ROWS`."""
    created_at = utcnow()
    # the session's character, read by the INSERT itself: the archive is kept per user and character
    character = (
        select(ChatSession.character_id)
        .where(ChatSession.id == session_id, ChatSession.user_id == user_id)
        .scalar_subquery()
    )
    for start in range(0, len(segments), SEGMENT_ROWS):
        db.execute(
            pg_insert(ArchivedSegment).values(
                [
                    {
                        "user_id": user_id,
                        "session_id": session_id,
                        "character_id": character,
                        "first_seq": seg.first_seq,
                        "last_seq": seg.last_seq,
                        "content": seg.content,
                        "tokens": seg.tokens,
                        "session_date": seg.session_date,
                        "embedding": seg.embedding,
                        "search": search_vector(seg.content),
                        "created_at": created_at,
                    }
                    for seg in segments[start : start + SEGMENT_ROWS]
                ]
            )
        )


def delete_session_rows(db: Session, session_id: str) -> dict[str, int]:
    """Delete the session's archived segments in ``db``'s transaction; counts by table."""
    deleted = db.execute(text("DELETE FROM archived_segments WHERE session_id = :s").bindparams(s=session_id))
    return {"archived_segments": cast("CursorResult[Any]", deleted).rowcount}


class Archive:
    """The archived segments of every user."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._one = autocommit_engine(engine)

    def count(self, *, user_id: str) -> int:
        """The user's archived segments."""
        with storage_errors(), Session(self._one) as db:
            return int(
                db.exec(
                    select(func.count()).select_from(ArchivedSegment).where(ArchivedSegment.user_id == user_id)
                ).one()
            )

    def segments(self, *, session_id: str) -> list[ArchivedSegment]:
        """The session's archived segments in turn order."""
        with storage_errors(session_id), Session(self._one) as db:
            return list(
                db.exec(
                    select(ArchivedSegment)
                    .where(ArchivedSegment.session_id == session_id)
                    .order_by(col(ArchivedSegment.first_seq))
                ).all()
            )

    def recall(self, query: RecallQuery) -> list[RecalledSegment]:
        """The best segments for ``query``, best first (:func:`memory.recall.recall`). A read.

        Raises:
            StorageError: the database failed.
        """
        return recall(self._engine, query)
