"""The turn store: users, sessions, turns, the summary and the breaker state.

Reads never change state. Every write is one transaction; :meth:`Store.commit_compaction`
changes the archive, the summary and the turn states together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import Engine, func, text, update
from sqlmodel import Session, select

from memory.database import storage_errors
from memory.tables import (
    ArchivedSegment,
    ChatSession,
    CompactionState,
    Summary,
    Turn,
    TurnState,
    User,
    utcnow,
)


@dataclass(frozen=True, kw_only=True)
class NewSegment:
    """An archive segment to write: verbatim turns of one exchange plus its embedding."""

    first_seq: int
    last_seq: int
    content: str
    tokens: int
    """Estimated tokens of ``content``."""
    session_date: datetime
    embedding: list[float]


class Store:
    """Typed access to the runtime's tables on one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- users and sessions -------------------------------------------------
    def ensure_session(self, *, session_id: str, user_id: str, persona: str = "") -> ChatSession:
        """Create the user and the session if missing; return the session.

        Raises:
            StorageError: the session exists but belongs to another user.
        """
        from memory.errors import StorageError

        with storage_errors(session_id), Session(self.engine) as db:
            session = db.get(ChatSession, session_id)
            if session is not None:
                if session.user_id != user_id:
                    raise StorageError(
                        f"Session {session_id!r} belongs to another user, not {user_id!r}.",
                        session_id=session_id,
                    )
                return session
            db.exec(
                text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id)
            )
            db.exec(
                text(
                    "INSERT INTO sessions (id, user_id, persona) VALUES (:s, :u, :p) ON CONFLICT DO NOTHING"
                ).bindparams(s=session_id, u=user_id, p=persona)
            )
            db.exec(
                text("INSERT INTO compaction_state (session_id) VALUES (:s) ON CONFLICT DO NOTHING").bindparams(
                    s=session_id
                )
            )
            db.commit()
            session = db.get(ChatSession, session_id)
            assert session is not None
            if session.user_id != user_id:
                raise StorageError(
                    f"Session {session_id!r} belongs to another user, not {user_id!r}.", session_id=session_id
                )
            return session

    def get_session(self, session_id: str) -> ChatSession | None:
        with storage_errors(session_id), Session(self.engine) as db:
            return db.get(ChatSession, session_id)

    # -- turns ----------------------------------------------------------------
    def add_turn(
        self,
        *,
        session_id: str,
        role: str,
        content: str,
        tokens: int,
        created_at: datetime | None = None,
        usage_prompt_tokens: int | None = None,
        usage_completion_tokens: int | None = None,
    ) -> Turn:
        """Append one turn with the next sequence number and commit it.

        The session row is locked while the number is taken, so concurrent writers
        to one session get distinct, gap-free numbers.
        """
        with storage_errors(session_id), Session(self.engine) as db:
            db.exec(text("SELECT id FROM sessions WHERE id = :s FOR UPDATE").bindparams(s=session_id))
            last = db.exec(select(func.max(Turn.seq)).where(Turn.session_id == session_id)).one()
            turn = Turn(
                session_id=session_id,
                seq=(last or 0) + 1,
                role=role,
                content=content,
                tokens=tokens,
                usage_prompt_tokens=usage_prompt_tokens,
                usage_completion_tokens=usage_completion_tokens,
                created_at=created_at or utcnow(),
            )
            db.add(turn)
            db.commit()
            db.refresh(turn)
            return turn

    def turns(self, session_id: str, *, state: TurnState | None = None) -> list[Turn]:
        """The session's turns in ``seq`` order, optionally only those in ``state``."""
        with storage_errors(session_id), Session(self.engine) as db:
            query = select(Turn).where(Turn.session_id == session_id)
            if state is not None:
                query = query.where(Turn.state == state)
            return list(db.exec(query.order_by(Turn.seq)).all())

    def last_usage_turn(self, session_id: str) -> Turn | None:
        """The newest turn that carries the provider's reported usage, if any."""
        with storage_errors(session_id), Session(self.engine) as db:
            return db.exec(
                select(Turn)
                .where(Turn.session_id == session_id, Turn.usage_prompt_tokens.is_not(None))
                .order_by(Turn.seq.desc())
                .limit(1)
            ).first()

    # -- summary and breaker ------------------------------------------------
    def summary(self, session_id: str) -> Summary | None:
        with storage_errors(session_id), Session(self.engine) as db:
            return db.get(Summary, session_id)

    def compaction_state(self, session_id: str) -> CompactionState:
        with storage_errors(session_id), Session(self.engine) as db:
            state = db.get(CompactionState, session_id)
            return state if state is not None else CompactionState(session_id=session_id)

    def record_compaction_failure(self, session_id: str, *, error: str, threshold: int) -> CompactionState:
        """Count one consecutive failure; open the breaker when the count reaches ``threshold``."""
        with storage_errors(session_id), Session(self.engine) as db:
            state = db.exec(
                select(CompactionState).where(CompactionState.session_id == session_id).with_for_update()
            ).first() or CompactionState(session_id=session_id)
            state.consecutive_failures += 1
            state.last_error = error[:2000]
            if state.consecutive_failures >= threshold and state.breaker_opened_at is None:
                state.breaker_opened_at = utcnow()
            db.add(state)
            db.commit()
            db.refresh(state)
            return state

    def reset_breaker(self, session_id: str) -> CompactionState:
        """Close the breaker and clear the failure count."""
        with storage_errors(session_id), Session(self.engine) as db:
            state = db.get(CompactionState, session_id) or CompactionState(session_id=session_id)
            state.consecutive_failures = 0
            state.breaker_opened_at = None
            db.add(state)
            db.commit()
            db.refresh(state)
            return state

    def commit_compaction(
        self,
        *,
        session_id: str,
        user_id: str,
        turn_ids: Sequence[int],
        segments: Sequence[NewSegment],
        summary_content: str,
        summary_items: list[dict[str, Any]],
        summary_first_seq: int,
        summary_last_seq: int,
        summary_tokens: int,
    ) -> None:
        """In one transaction: write the segments, replace the summary, mark turns summarized,
        reset the failure count and count the compaction. Nothing is deleted."""
        with storage_errors(session_id), Session(self.engine) as db:
            for seg in segments:
                db.add(
                    ArchivedSegment(
                        user_id=user_id,
                        session_id=session_id,
                        first_seq=seg.first_seq,
                        last_seq=seg.last_seq,
                        content=seg.content,
                        tokens=seg.tokens,
                        session_date=seg.session_date,
                        embedding=seg.embedding,
                    )
                )
            summary = db.get(Summary, session_id)
            if summary is None:
                summary = Summary(
                    session_id=session_id,
                    content=summary_content,
                    items=summary_items,
                    first_seq=summary_first_seq,
                    last_seq=summary_last_seq,
                    tokens=summary_tokens,
                )
            else:
                summary.content = summary_content
                summary.items = summary_items
                summary.first_seq = summary_first_seq
                summary.last_seq = summary_last_seq
                summary.tokens = summary_tokens
                summary.updated_at = utcnow()
            db.add(summary)
            db.exec(
                update(Turn)
                .where(Turn.session_id == session_id, Turn.id.in_(list(turn_ids)))
                .values(state=TurnState.summarized)
            )
            db.exec(
                text(
                    "UPDATE compaction_state SET consecutive_failures = 0, last_error = NULL, "
                    "compactions = compactions + 1 WHERE session_id = :s"
                ).bindparams(s=session_id)
            )
            db.commit()

    # -- counts ----------------------------------------------------------------
    def archive_count(self, *, user_id: str) -> int:
        with storage_errors(), Session(self.engine) as db:
            return int(db.exec(select(func.count()).select_from(ArchivedSegment).where(ArchivedSegment.user_id == user_id)).one())

    def segments(self, *, session_id: str) -> list[ArchivedSegment]:
        """The session's archived segments in turn order."""
        with storage_errors(session_id), Session(self.engine) as db:
            return list(
                db.exec(
                    select(ArchivedSegment).where(ArchivedSegment.session_id == session_id).order_by(ArchivedSegment.first_seq)
                ).all()
            )
