"""The memories room: what a character remembers of a user, read and forgotten.

A memory is an archived segment (recall's unit: its text, vector and lexemes are one row). Reading
pages through a user's segments, newest first; forgetting deletes segments (and, to delete a
message, the turn with them) and writes the summaries and learned facts the runtime rewrote
without them, in one transaction. A summary is written only if it is still the one the runtime
read (its ``updated_at``); otherwise nothing is written and :class:`~errors.ConflictError` says to
try again, so a compaction that ran meanwhile is never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, text
from sqlmodel import Session, col, select

from errors import ConflictError
from memory.database import autocommit_engine, storage_errors
from memory.sessions import NO_KEPT_RECALL
from memory.tables import ArchivedSegment, ChatSession, Summary, SummaryItemJSON, Turn

MAX_PAGE = 200
"""The most memories one page holds."""


@dataclass(frozen=True, kw_only=True)
class SummaryRewrite:
    """A summary the runtime rewrote without forgotten words."""

    session_id: str
    seen: datetime
    """The ``updated_at`` of the summary as it was read: it is written only if still that one."""
    content: str
    items: list[SummaryItemJSON]
    tokens: int


@dataclass(frozen=True, kw_only=True)
class Forgetting:
    """What one forgetting deletes and rewrites, all of one user."""

    segment_ids: Sequence[int] = ()
    turn_ids: Sequence[int] = ()
    summaries: Sequence[SummaryRewrite] = ()
    facts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Character id → learned facts to remove (exact texts)."""


class Memories:
    """Segments of a user, and forgetting them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._one = autocommit_engine(engine)

    def segment(self, segment_id: int, *, user_id: str) -> ArchivedSegment | None:
        """The user's segment, or ``None`` (another user's too)."""
        with storage_errors(), Session(self._one) as db:
            return db.exec(
                select(ArchivedSegment).where(ArchivedSegment.id == segment_id, ArchivedSegment.user_id == user_id)
            ).first()

    def owner(self, segment_id: int) -> str | None:
        """The user whose segment it is, or ``None``."""
        with storage_errors(), Session(self._one) as db:
            return db.exec(select(ArchivedSegment.user_id).where(ArchivedSegment.id == segment_id)).first()

    def covering(self, session_id: str, *, user_id: str, seq: int) -> list[ArchivedSegment]:
        """The session's segments that hold turn ``seq``."""
        with storage_errors(session_id), Session(self._one) as db:
            return list(
                db.exec(
                    select(ArchivedSegment).where(
                        ArchivedSegment.session_id == session_id,
                        ArchivedSegment.user_id == user_id,
                        ArchivedSegment.first_seq <= seq,
                        ArchivedSegment.last_seq >= seq,
                    )
                ).all()
            )

    def summaries(self, user_id: str) -> list[Summary]:
        """Every summary of the user's sessions."""
        with storage_errors(), Session(self._one) as db:
            return list(db.exec(select(Summary).where(Summary.user_id == user_id)).all())

    def turns(self, session_id: str, *, user_id: str, first_seq: int, last_seq: int) -> list[Turn]:
        """The session's turns from ``first_seq`` to ``last_seq``."""
        with storage_errors(session_id), Session(self._one) as db:
            return list(
                db.exec(
                    select(Turn)
                    .where(
                        Turn.session_id == session_id,
                        Turn.user_id == user_id,
                        col(Turn.seq) >= first_seq,
                        col(Turn.seq) <= last_seq,
                    )
                    .order_by(col(Turn.seq))
                ).all()
            )

    def page(
        self,
        user_id: str,
        *,
        character_id: str | None = None,
        before: datetime | None = None,
        after: datetime | None = None,
        limit: int = 50,
        cursor: int | None = None,
    ) -> list[ArchivedSegment]:
        """The user's segments (of ``character_id``'s sessions, when given), newest first, dated
        before ``before`` and after ``after``; ``cursor``: the last id of the page before."""
        query = select(ArchivedSegment).where(ArchivedSegment.user_id == user_id)
        if character_id is not None:
            query = query.where(ArchivedSegment.character_id == character_id)
        if before is not None:
            query = query.where(col(ArchivedSegment.session_date) < before)
        if after is not None:
            query = query.where(col(ArchivedSegment.session_date) > after)
        if cursor is not None:
            query = query.where(col(ArchivedSegment.id) < cursor)
        limit = max(1, min(int(limit), MAX_PAGE))
        with storage_errors(), Session(self._one) as db:
            return list(db.exec(query.order_by(col(ArchivedSegment.id).desc()).limit(limit)).all())

    def sessions_of(self, user_id: str) -> dict[str, str]:
        """The user's session ids → their character ids."""
        with storage_errors(), Session(self._one) as db:
            rows = db.exec(select(ChatSession.id, ChatSession.character_id).where(ChatSession.user_id == user_id))
            return {s: c for s, c in rows.all()}

    def forget(self, user_id: str, what: Forgetting) -> dict[str, int]:
        """In one transaction: delete the segments and turns (their vectors and ``turn_files`` rows
        with them), write the rewritten summaries, remove the learned facts, and drop the kept recall
        of every session of the user that quotes a deleted segment (the user's session rows are
        locked first, waiting for a turn that is storing its reply). Counts by table.

        Raises:
            ConflictError: a summary changed since it was read (a compaction ran); nothing was written.
        """
        counts = {"archived_segments": 0, "turns": 0, "summaries": 0, "learned_facts": 0}
        with storage_errors(), Session(self._engine) as db:
            if what.segment_ids:
                # the user's session rows first: a turn storing the recall it keeps holds its
                # session's row until it commits, so the segments are deleted either before the
                # turn stores (it then finds them gone and keeps none) or after it has stored (the
                # clearing below finds its block), and locks are taken in the turn's order
                db.execute(text("SELECT id FROM sessions WHERE user_id = :u ORDER BY id FOR UPDATE"), {"u": user_id})
            for rewrite in what.summaries:
                done = db.execute(
                    text(
                        "UPDATE summaries SET content = :c, items = CAST(:i AS jsonb), tokens = :t, updated_at = now() "
                        "WHERE session_id = :s AND user_id = :u AND updated_at = :seen"
                    ),
                    {
                        "c": rewrite.content,
                        "i": json.dumps(rewrite.items, ensure_ascii=False),
                        "t": rewrite.tokens,
                        "s": rewrite.session_id,
                        "u": user_id,
                        "seen": rewrite.seen,
                    },
                )
                if not cast("CursorResult[Any]", done).rowcount:
                    db.rollback()
                    raise ConflictError(
                        f"The summary of session {rewrite.session_id!r} changed meanwhile (a compaction ran); "
                        "nothing was forgotten. Try again."
                    )
                counts["summaries"] += 1
            if what.segment_ids:
                done = db.execute(
                    text("DELETE FROM archived_segments WHERE user_id = :u AND id = ANY(:ids)"),
                    {"u": user_id, "ids": list(what.segment_ids)},
                )
                counts["archived_segments"] = cast("CursorResult[Any]", done).rowcount
                # a session's kept recall block and tails quoting one of them go too (the next turn rebuilds them)
                db.execute(
                    text(
                        f"UPDATE sessions SET {NO_KEPT_RECALL} "
                        "WHERE user_id = :u AND recall_segments && CAST(:ids AS bigint[])"
                    ),
                    {"u": user_id, "ids": list(what.segment_ids)},
                )
            if what.turn_ids:
                params = {"u": user_id, "ids": list(what.turn_ids)}
                db.execute(text("DELETE FROM turn_files WHERE user_id = :u AND turn_id = ANY(:ids)"), params)
                done = db.execute(text("DELETE FROM turns WHERE user_id = :u AND id = ANY(:ids)"), params)
                counts["turns"] = cast("CursorResult[Any]", done).rowcount
            for character_id, facts in what.facts.items():
                done = db.execute(
                    text(
                        "UPDATE learned_facts SET facts = (SELECT coalesce(jsonb_agg(f ORDER BY n), '[]') "
                        "FROM jsonb_array_elements(facts) WITH ORDINALITY AS e(f, n) "
                        "WHERE NOT (f #>> '{}' = ANY(:gone))), updated_at = now() "
                        "WHERE user_id = :u AND character_id = :c"
                    ),
                    {"u": user_id, "c": character_id, "gone": list(facts)},
                )
                counts["learned_facts"] += cast("CursorResult[Any]", done).rowcount
            db.commit()
        return counts
