"""The compaction room: the only writer of ``summaries`` and ``compaction_state``.

One compaction at a time runs per session, across processes, under :meth:`Compactions.lock`
(a session-level advisory lock). :meth:`Compactions.commit` writes the archive segments,
replaces the summary, rolls the turns out of the recent window and closes the breaker in one
transaction; :meth:`Compactions.commit_archive` does the same without the summary (breaker
open). The breaker's failures are counted by :meth:`Compactions.record_failure`.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, text, update
from sqlmodel import Session, col, select

from memory.database import autocommit_engine, lock_engine, storage_errors
from memory.segments import NewSegment, add_segments
from memory.tables import CompactionState, Summary, SummaryItemJSON, TurnState, utcnow
from memory.turns import add_vectors, roll_out

DEFAULT_LOCK_SLOTS = 15
"""Compaction locks one room holds at once by default (one connection each, outside the pool)."""
LOCK_SLOT_WAIT = 5.0
"""Seconds :meth:`Compactions.lock` waits for a free lock slot before answering "held"."""


def compaction_lock_key(session_id: str) -> int:
    """The advisory-lock key of a session's compaction: a stable signed 64-bit hash of its id."""
    digest = hashlib.blake2b(f"companion.compaction:{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True, kw_only=True)
class NewSummary:
    """A merged summary to store (:meth:`Compactions.commit`)."""

    content: str
    """The rendered summary text."""
    items: list[SummaryItemJSON]
    """Its typed entries, as ``summaries.items`` stores them."""
    first_seq: int
    last_seq: int
    """The seqs of the first and last turn it covers."""
    tokens: int
    """Estimated tokens of ``content``."""
    dropped_quotes: int = 0
    """User quotes this merge left out to fit the cap (added to the summary's count)."""


def _by_session(table: Any, session_id: str, user_id: str | None) -> Any:
    """``SELECT`` of ``table``'s row of the session (and, with ``user_id``, of that user)."""
    query = select(table).where(table.session_id == session_id)
    return query.where(table.user_id == user_id) if user_id is not None else query


def delete_session_rows(db: Session, session_id: str) -> dict[str, int]:
    """Delete the session's ``summaries`` and ``compaction_state`` rows in ``db``'s transaction;
    counts by table."""
    counts = {}
    for table in ("summaries", "compaction_state"):
        deleted = db.execute(text(f"DELETE FROM {table} WHERE session_id = :s").bindparams(s=session_id))
        counts[table] = cast("CursorResult[Any]", deleted).rowcount
    return counts


class Compactions:
    """The summary, the breaker state and the compaction lock of each session."""

    def __init__(self, engine: Engine, *, lock_slots: int | None = None) -> None:
        """Args:
        engine: the runtime's engine.
        lock_slots: session-level advisory locks held at once, each on its own connection
            outside ``engine``'s pool (:meth:`lock`); ``None``: :data:`DEFAULT_LOCK_SLOTS`.
        """
        self._engine = engine
        self._one = autocommit_engine(engine)
        self._lock_engine = lock_engine(engine)
        self._lock_slots = threading.BoundedSemaphore(lock_slots or DEFAULT_LOCK_SLOTS)

    def summary(self, session_id: str, *, user_id: str | None = None) -> Summary | None:
        """The session's summary row, or ``None`` (with ``user_id``: found by its user too)."""
        with storage_errors(session_id), Session(self._one) as db:
            return db.exec(_by_session(Summary, session_id, user_id)).first()

    def state(self, session_id: str, *, user_id: str | None = None) -> CompactionState:
        """The session's breaker state (a fresh one when it has no row; with ``user_id``: found by
        its user too)."""
        with storage_errors(session_id), Session(self._one) as db:
            state = db.exec(_by_session(CompactionState, session_id, user_id)).first()
            return state if state is not None else CompactionState(session_id=session_id)

    @contextlib.contextmanager
    def lock(self, session_id: str) -> Iterator[bool]:
        """Hold the session's compaction lock, across processes, for the ``with`` block.

        A PostgreSQL session-level advisory lock (``pg_try_advisory_lock``) on a 64-bit
        hash of the session id, held on a dedicated connection outside the engine's pool
        (:func:`~memory.database.lock_engine`), so the reads and writes made inside the
        block, and every other request, keep the whole pool. It does not wait: the block
        gets ``False`` when another compaction of the session holds it, or when this
        store already holds ``lock_slots`` locks for :data:`LOCK_SLOT_WAIT` seconds. A
        process that dies releases it with its connection.
        """
        key = compaction_lock_key(session_id)
        if not self._lock_slots.acquire(timeout=LOCK_SLOT_WAIT):
            yield False
            return
        try:
            with storage_errors(session_id), self._lock_engine.connect() as conn:
                held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
                conn.commit()
                try:
                    yield held
                finally:
                    if held:
                        try:
                            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                            conn.commit()
                        except Exception:
                            conn.invalidate()  # a closed connection has released the lock already
                            raise
        finally:
            self._lock_slots.release()

    def record_failure(
        self, session_id: str, *, error: str, threshold: int, user_id: str | None = None
    ) -> CompactionState:
        """Count one consecutive failure and keep its reason.

        The breaker opens when the count reaches ``threshold``; a failure while it is
        already open (a half-open probe) opens it again from now. Nothing else changes.
        """
        with storage_errors(session_id), Session(self._engine) as db:
            state = db.exec(_by_session(CompactionState, session_id, user_id).with_for_update()).first()
            state = state or CompactionState(session_id=session_id, user_id=user_id)
            state.consecutive_failures += 1
            state.last_error = error[:2000]
            state.recent_errors = [*(state.recent_errors or []), error[:500]][-max(threshold, 1) :]
            if state.consecutive_failures >= threshold:
                state.breaker_opened_at = utcnow()
            db.add(state)
            db.commit()
            db.refresh(state)
            return state

    def reset_breaker(self, session_id: str) -> CompactionState:
        """Close the breaker and clear the failure count and reasons."""
        with storage_errors(session_id), Session(self._engine) as db:
            state = db.get(CompactionState, session_id) or CompactionState(session_id=session_id)
            state.consecutive_failures = 0
            state.breaker_opened_at = None
            state.recent_errors = []
            db.add(state)
            db.commit()
            db.refresh(state)
            return state

    def commit(
        self,
        *,
        session_id: str,
        user_id: str,
        turn_ids: Sequence[int],
        segments: Sequence[NewSegment],
        summary: NewSummary,
        turn_vectors: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        """In one transaction: write the segments, replace the summary, mark the turns
        summarized, close the breaker, reset the failure count and count the compaction.
        Nothing is deleted.

        Args:
            summary: the merged summary that replaces the session's.
            turn_vectors: turn id → the embedding of that turn's content, for rolled-out turns
                that had none stored (a turn that already has one keeps it).

        Raises:
            StorageError: a turn was no longer in the recent window (nothing was written).
        """
        with storage_errors(session_id), Session(self._engine) as db:
            add_segments(db, session_id=session_id, user_id=user_id, segments=segments)
            add_vectors(db, turn_vectors or {}, user_id=user_id)
            replaced = db.execute(  # the session's summary, found by its user too
                update(Summary)
                .where(col(Summary.session_id) == session_id, col(Summary.user_id) == user_id)
                .values(
                    content=summary.content,
                    items=summary.items,
                    first_seq=summary.first_seq,
                    last_seq=summary.last_seq,
                    tokens=summary.tokens,
                    dropped_quotes=col(Summary.dropped_quotes) + summary.dropped_quotes,
                    updated_at=utcnow(),
                )
            )
            if not cast("CursorResult[Any]", replaced).rowcount:
                db.add(
                    Summary(
                        session_id=session_id,
                        user_id=user_id,
                        content=summary.content,
                        items=summary.items,
                        first_seq=summary.first_seq,
                        last_seq=summary.last_seq,
                        tokens=summary.tokens,
                        dropped_quotes=summary.dropped_quotes,
                    )
                )
            roll_out(db, session_id=session_id, turn_ids=turn_ids, to=TurnState.summarized, user_id=user_id)
            db.execute(
                text(
                    "UPDATE compaction_state SET consecutive_failures = 0, last_error = NULL, "
                    "recent_errors = '[]'::jsonb, breaker_opened_at = NULL, "
                    "compactions = compactions + 1 WHERE session_id = :s AND user_id = :u"
                ).bindparams(s=session_id, u=user_id)
            )
            db.commit()

    def commit_archive(
        self,
        *,
        session_id: str,
        user_id: str,
        turn_ids: Sequence[int],
        segments: Sequence[NewSegment],
        turn_vectors: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        """In one transaction: write the segments and mark the turns archived (not summarized).

        Used while the breaker is open: the recent window still shrinks and the turns
        stay recallable verbatim; the summary and the breaker state do not change.
        ``turn_vectors`` as in :meth:`commit`.

        Raises:
            StorageError: a turn was no longer in the recent window (nothing was written).
        """
        with storage_errors(session_id), Session(self._engine) as db:
            add_segments(db, session_id=session_id, user_id=user_id, segments=segments)
            add_vectors(db, turn_vectors or {}, user_id=user_id)
            roll_out(db, session_id=session_id, turn_ids=turn_ids, to=TurnState.archived, user_id=user_id)
            db.commit()

    def carried_quotes(self, session_id: str, *, user_id: str | None = None) -> dict[int, str]:
        """User quotes the session's summary carried over from its previous session:
        their (non-positive) ``seq`` → text. They were validated against that session's
        turns when they were made; a later summary may keep them only verbatim."""
        summary = self.summary(session_id, user_id=user_id)
        items = summary.items if summary is not None else []
        return {
            seq: str(i.get("text", ""))
            for i in items
            if i.get("carried_from") and i.get("role") == "user" and isinstance(seq := i.get("seq"), int) and seq <= 0
        }
