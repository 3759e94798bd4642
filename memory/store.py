"""The turn store: users, sessions, turns, the summary and the breaker state.

Longer than 400 lines on purpose: one class owns every transaction on sessions, turns, the
summary and the breaker state, so each invariant (gap-free seqs, one claim, atomic compaction)
is enforced in one place.

Reads never change state. Every write is one transaction; :meth:`Store.commit_compaction`
changes the archive, the summary and the turn states together or not at all, and
:meth:`Store.commit_archive` the archive and the turn states (breaker open). One
compaction at a time runs per session, under :meth:`Store.compaction_lock`.
:meth:`Store.delete_session` removes a session and every row only it references in
one transaction; :meth:`Store.add_turn` refuses a closed session.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, Engine, bindparam, func, text, union_all, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Session, col, select

from memory.database import autocommit_engine, lock_engine, send_binary_vectors, storage_errors
from memory.fulltext import search_vector
from memory.recall import ARCHIVE_SIZES
from memory.vectors import Vector

if TYPE_CHECKING:
    from errors import SessionOwnershipError
    from memory.files import FileStore
from memory.tables import (
    ArchivedSegment,
    ChatSession,
    CompactionState,
    Summary,
    SummaryItemJSON,
    Turn,
    TurnState,
    TurnVector,
    utcnow,
)
from memory.validation import check_id

SEGMENT_ROWS = 500
"""Archived segments one ``INSERT`` writes: 11 bind parameters each, well under PostgreSQL's
65,535 per statement."""


@dataclass(frozen=True, kw_only=True)
class TurnFile:
    """One file as a stored turn carries it: the columns rendering needs, and the extract's head."""

    file_id: str
    name: str
    mime: str
    size_bytes: int
    """Bytes."""
    durability: str
    """``durable`` or ``ephemeral``."""
    parse_state: str
    """``pending``, ``parsing``, ``ready``, ``empty``, ``needs_ocr`` or ``failed``."""
    parse_error: str | None = None
    page_count: int | None = None
    body_start_page: int | None = None
    """First page after the front matter (1-based), when known."""
    text_head: str | None = None
    """The first ``head_chars`` characters of the extract; ``None`` before a parse."""
    text_chars: int | None = None
    """Characters of the whole extract."""
    position: int = 0
    """Order among the turn's attachments, from 0."""


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


@dataclass(frozen=True, kw_only=True)
class SessionReads:
    """What assembling a context reads of a session besides its turns (:meth:`Store.session_reads`)."""

    summary: Summary | None
    """The session's summary, as :meth:`Store.summary` gives it."""
    archived_segments: int
    """The user's archived segments (their ``archive_counts`` row)."""
    archive_rows: float
    """The archive table's estimated rows (``pg_class.reltuples``: ``-1`` before it was ever
    analyzed), for :func:`memory.recall.index_pays`."""
    has_files: bool
    """Whether any turn of the session carries a file (``False``: :meth:`Store.turn_attachments`
    would return nothing)."""
    has_knowledge: bool
    """Whether the persona has knowledge chunks (``False``: a knowledge search finds nothing)."""


@dataclass(frozen=True, kw_only=True)
class ClaimedSession:
    """What :meth:`Store.claim_turn` learns of the session it claimed, in the same statement."""

    user_id: str
    breaker_open: bool
    """Whether the session's compaction breaker was open at the claim."""


DEFAULT_LOCK_SLOTS = 15
"""Compaction locks one store holds at once by default (one connection each, outside the pool)."""
LOCK_SLOT_WAIT = 5.0
"""Seconds :meth:`Store.compaction_lock` waits for a free lock slot before answering "held"."""


def compaction_lock_key(session_id: str) -> int:
    """The advisory-lock key of a session's compaction: a stable signed 64-bit hash of its id."""
    digest = hashlib.blake2b(f"companion.compaction:{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _not_yours(session_id: str, user_id: str) -> SessionOwnershipError:
    """The error for ``user_id``'s work on a session that is another user's."""
    from errors import SessionOwnershipError

    return SessionOwnershipError(
        f"Session {session_id!r} belongs to another user, not {user_id!r}. Use a new session id.",
        session_id=session_id,
    )


class Store:
    """Typed access to the runtime's tables on one SQLAlchemy engine."""

    def __init__(self, engine: Engine, *, lock_slots: int | None = None) -> None:
        """Args:
        engine: the runtime's engine (its pool serves every read and write); its connections
            are made to send vectors in binary (:func:`memory.database.send_binary_vectors`)
            if :func:`memory.database.make_engine` did not make it.
        lock_slots: session-level advisory locks held at once by this store, each on its own
            connection outside ``engine``'s pool (:meth:`compaction_lock`); ``None``:
            :data:`DEFAULT_LOCK_SLOTS`.
        """
        self.engine = engine
        send_binary_vectors(engine)  # an engine not made by make_engine: its vectors too
        self._one = autocommit_engine(engine)
        """For the methods that send one statement (a read, or a write that is atomic alone): it
        is its own transaction, without the ``BEGIN`` and ``COMMIT``/``ROLLBACK`` round trips."""
        self._lock_engine = lock_engine(engine)
        self._lock_slots = threading.BoundedSemaphore(lock_slots or DEFAULT_LOCK_SLOTS)

    # -- users and sessions -------------------------------------------------
    def ensure_session(self, *, session_id: str, user_id: str, persona: str = "") -> ChatSession:
        """Create the user and the session if missing; return the session. A new session
        starts from the summary of the user's newest closed session with this persona
        (:func:`memory.apps.carry_over`).

        Raises:
            SessionOwnershipError: the session exists but belongs to another user.
            InvalidFieldError: an id or the persona holds NUL or a lone surrogate, or is over 200 characters.
        """

        check_id(session_id, field="session_id")
        check_id(user_id, field="user_id")
        check_id(persona, field="persona")
        session = self.get_session(session_id)  # most calls end here: one statement
        if session is None:
            session = self._create_session(session_id=session_id, user_id=user_id, persona=persona)
        if session.user_id != user_id:
            raise _not_yours(session_id, user_id)
        return session

    def _create_session(self, *, session_id: str, user_id: str, persona: str) -> ChatSession:
        """:meth:`ensure_session` of a session not found: one transaction; returns the session
        stored (which another writer may have created meanwhile)."""
        with storage_errors(session_id), Session(self.engine) as db:
            db.execute(text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id))
            created = cast(
                "CursorResult[Any]",
                db.execute(
                    text(
                        "INSERT INTO sessions (id, user_id, persona) VALUES (:s, :u, :p) ON CONFLICT DO NOTHING"
                    ).bindparams(s=session_id, u=user_id, p=persona)
                ),
            ).rowcount
            db.execute(
                text("INSERT INTO compaction_state (session_id) VALUES (:s) ON CONFLICT DO NOTHING").bindparams(
                    s=session_id
                )
            )
            if created:  # a returning user's new session starts from their last closed session's summary
                from memory.apps import carry_over

                carry_over(db, session_id=session_id, user_id=user_id, persona=persona)
            db.commit()
            session = db.get(ChatSession, session_id)
            assert session is not None
            return session

    # -- one turn at a time ------------------------------------------------------
    def claim_turn(
        self, session_id: str, *, owner: str, lease_seconds: float, user_id: str | None = None
    ) -> ClaimedSession:
        """Claim the session for one turn (or an edit, a greeting): no other claim succeeds until
        :meth:`release_turn`, or until ``lease_seconds`` have passed (a claim whose process died).
        One ``UPDATE`` on the session row: atomic across threads and processes. Returns the
        session's user and whether its compaction breaker was open when it was claimed. With
        ``user_id``, only a session of that user is claimed (a turn's claim, which then needs
        no read of the session first).

        Raises:
            SessionOwnershipError: ``user_id`` is given and the session is another user's;
                nothing changed.
            TurnInProgressError: another claim holds the session; nothing changed.
            SessionClosedError: the session was closed; nothing changed.
            NotFoundError: no such session.
        """
        from errors import NotFoundError, SessionClosedError, TurnInProgressError

        with storage_errors(session_id), Session(self._one) as db:
            claimed = db.execute(
                text(
                    "UPDATE sessions SET turn_owner = :o, turn_claimed_at = now() "
                    "WHERE id = :s AND closed_at IS NULL AND (turn_owner IS NULL "
                    "OR turn_claimed_at < now() - make_interval(secs => :lease)) "
                    "AND (CAST(:u AS text) IS NULL OR user_id = :u) RETURNING user_id, "
                    "EXISTS (SELECT 1 FROM compaction_state AS c WHERE c.session_id = sessions.id "
                    "AND c.breaker_opened_at IS NOT NULL)"
                ).bindparams(o=owner, s=session_id, lease=float(lease_seconds), u=user_id)
            ).first()
            if claimed is not None:
                db.commit()
                return ClaimedSession(user_id=claimed[0], breaker_open=bool(claimed[1]))
            row = db.execute(
                text("SELECT closed_at, user_id FROM sessions WHERE id = :s").bindparams(s=session_id)
            ).first()
        if row is None:
            raise NotFoundError(f"No session {session_id!r}.", kind="session", resource_id=session_id)
        if user_id is not None and row[1] != user_id:
            raise _not_yours(session_id, user_id)
        if row[0] is not None:
            raise SessionClosedError(
                f"Session {session_id!r} was closed at {row[0].isoformat()}; start a new session "
                "(it begins from this one's summary).",
                session_id=session_id,
            )
        raise TurnInProgressError(
            f"Session {session_id!r} is running another turn; nothing was stored. Send this one again "
            "when that turn has ended.",
            session_id=session_id,
        )

    def release_turn(self, session_id: str, *, owner: str) -> None:
        """End ``owner``'s claim on the session (nothing happens if it no longer holds it)."""
        with storage_errors(session_id), Session(self._one) as db:
            db.execute(
                text(
                    "UPDATE sessions SET turn_owner = NULL, turn_claimed_at = NULL WHERE id = :s AND turn_owner = :o"
                ).bindparams(s=session_id, o=owner)
            )
            db.commit()

    def get_session(self, session_id: str) -> ChatSession | None:
        with storage_errors(session_id), Session(self._one) as db:
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
        request_estimate_tokens: int | None = None,
        request_messages: int | None = None,
        request_fingerprint: str | None = None,
        interrupted: bool = False,
        file_ids: Sequence[str] = (),
        vector: Sequence[float] | None = None,
    ) -> Turn:
        """Append one turn with the next sequence number and commit it: two statements, one
        transaction (plus one per attached file).

        The session row is locked while the number is taken, so concurrent writers
        to one session get distinct, gap-free numbers. The session's
        ``last_activity_at`` moves to now (wall clock, whatever ``created_at`` says).

        Args:
            file_ids: files the turn carries (attachments), in order; their ``turn_files``
                rows are written in the same transaction as the turn. The caller checks
                ownership first.
            vector: the embedding of ``content`` (a unit vector of the archive's dimension), stored
                as the turn's :class:`~memory.tables.TurnVector` by the same ``INSERT``.

        Raises:
            SessionClosedError: the session was closed; nothing was stored.
        """
        from errors import SessionClosedError

        with storage_errors(session_id), Session(self.engine) as db:
            # one statement moves the activity time and locks the session row: concurrent writers
            # of one session wait here, so each takes the next seq in turn
            open_row = db.execute(
                text(
                    "UPDATE sessions SET last_activity_at = now() WHERE id = :s AND closed_at IS NULL RETURNING id"
                ).bindparams(s=session_id)
            ).first()
            if open_row is None:
                row = db.execute(text("SELECT closed_at FROM sessions WHERE id = :s").bindparams(s=session_id)).first()
                if row is not None and row[0] is not None:  # a closed session takes no new turns
                    raise SessionClosedError(
                        f"Session {session_id!r} was closed at {row[0].isoformat()}; start a new session "
                        "(it begins from this one's summary).",
                        session_id=session_id,
                    )
            insert = (
                "INSERT INTO turns (session_id, seq, role, content, tokens, usage_prompt_tokens, "
                "usage_completion_tokens, request_estimate_tokens, request_messages, request_fingerprint, "
                "interrupted, state, created_at) "
                "SELECT :s, coalesce(max(seq), 0) + 1, :role, :content, :tokens, :upt, :uct, :ret, :rm, :rf, "
                ":interrupted, :state, :at FROM turns WHERE session_id = :s RETURNING *"
            )
            statement = (
                text(insert)
                if vector is None
                else text(
                    f"WITH t AS ({insert}), v AS (INSERT INTO turn_vectors (turn_id, embedding) "
                    "SELECT id, CAST(:vec AS vector) FROM t) SELECT * FROM t"
                ).bindparams(bindparam("vec", list(vector), type_=Vector()))
            )
            inserted = db.execute(
                statement.bindparams(
                    s=session_id,
                    role=role,
                    content=content,
                    tokens=tokens,
                    upt=usage_prompt_tokens,
                    uct=usage_completion_tokens,
                    ret=request_estimate_tokens,
                    rm=request_messages,
                    rf=request_fingerprint,
                    interrupted=interrupted,
                    state=TurnState.context.value,
                    at=created_at or utcnow(),
                )
            ).one()
            turn = Turn.model_validate(dict(inserted._mapping))
            for position, file_id in enumerate(dict.fromkeys(file_ids)):
                db.execute(
                    text("INSERT INTO turn_files (turn_id, file_id, position) VALUES (:t, :f, :p)").bindparams(
                        t=turn.id, f=file_id, p=position
                    )
                )
            db.commit()
            return turn

    def add_turn_vectors(self, vectors: Mapping[int, Sequence[float]]) -> None:
        """Store turn id → the embedding of that turn's ``content`` (a unit vector of the
        archive's dimension), in one transaction; a turn that already has one keeps it.

        Raises:
            StorageError: the database failed, or a turn id does not exist; nothing was stored.
        """
        if not vectors:
            return
        with storage_errors(), Session(self._one) as db:
            self._add_turn_vectors(db, vectors)
            db.commit()

    def turn_vectors(self, turn_ids: Iterable[int]) -> dict[int, list[float]]:
        """The stored embeddings of the turns ``turn_ids`` that have one: turn id → vector (the
        embedding of the turn's ``content``). Turns without a stored vector are left out."""
        ids = sorted(set(turn_ids))
        if not ids:
            return {}
        with storage_errors(), Session(self._one) as db:
            rows = db.exec(
                select(TurnVector.turn_id, TurnVector.embedding).where(col(TurnVector.turn_id).in_(ids))
            ).all()
            return {turn_id: [float(x) for x in vector] for turn_id, vector in rows}

    def turns(self, session_id: str, *, state: TurnState | None = None) -> list[Turn]:
        """The session's turns in ``seq`` order, optionally only those in ``state``."""
        with storage_errors(session_id), Session(self._one) as db:
            query = select(Turn).where(Turn.session_id == session_id)
            if state is not None:
                query = query.where(Turn.state == state)
            return list(db.exec(query.order_by(col(Turn.seq))).all())

    def window_turns(self, session_id: str, *, usage_limit: int) -> tuple[list[Turn], list[Turn]]:
        """What assembling a context reads of the session's turns, in one statement:
        ``(the turns in the recent window in seq order, the newest usage_limit turns that carry
        the provider's reported usage, newest first)``, as :meth:`turns` with
        ``state=TurnState.context`` gives the first. Each half is read by its
        partial index (``ix_turns_session_context``, ``ix_turns_session_usage``), so the cost
        does not grow with the session's history."""
        context = select(Turn).where(Turn.session_id == session_id, Turn.state == TurnState.context)
        usage = (
            select(Turn)
            .where(Turn.session_id == session_id, col(Turn.usage_prompt_tokens).is_not(None))
            .order_by(col(Turn.seq).desc())
            .limit(usage_limit)
        )
        both = union_all(context, usage.subquery().select()).order_by(text("seq"))
        with storage_errors(session_id), Session(self._one) as db:
            rows = list(db.exec(select(Turn).from_statement(both)).scalars().all())  # type: ignore[call-overload]
        # a turn in both halves comes back twice, as one object (the session's identity map)
        unique = list({t.id: t for t in rows}.values())
        window = [t for t in unique if t.state == TurnState.context]
        with_usage = [t for t in reversed(unique) if t.usage_prompt_tokens is not None][:usage_limit]
        return window, with_usage

    def session_reads(self, session_id: str, *, user_id: str, persona: str) -> SessionReads:
        """The session's summary, the user's archive size, and whether the session's turns carry
        files and the persona has knowledge, in one statement (:class:`SessionReads`): what
        assembling a context would otherwise read in four, two of them only to find nothing. A
        read: nothing changes. Each part is read by a key or an index; whether the session has
        files is the question :meth:`turn_attachments` answers, at no greater cost."""
        with storage_errors(session_id), self._one.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT s.session_id IS NOT NULL AS found, s.content, s.items, s.first_seq, s.last_seq, "
                    "s.tokens, s.dropped_quotes, s.updated_at, "
                    f"{ARCHIVE_SIZES}, "
                    "EXISTS (SELECT 1 FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
                    "WHERE t.session_id = :s) AS has_files, "
                    "EXISTS (SELECT 1 FROM knowledge_chunks WHERE persona = :p) AS has_knowledge "
                    "FROM (SELECT 1) AS one LEFT JOIN summaries AS s ON s.session_id = :s"
                ),
                {"s": session_id, "u": user_id, "p": persona},
            ).one()
        summary = (
            Summary(
                session_id=session_id,
                content=row.content,
                items=row.items,
                first_seq=row.first_seq,
                last_seq=row.last_seq,
                tokens=row.tokens,
                dropped_quotes=row.dropped_quotes,
                updated_at=row.updated_at,
            )
            if row.found
            else None
        )
        return SessionReads(
            summary=summary,
            archived_segments=int(row.archived),
            archive_rows=float(row.archive_rows if row.archive_rows is not None else -1),
            has_files=bool(row.has_files),
            has_knowledge=bool(row.has_knowledge),
        )

    # -- summary and breaker ------------------------------------------------
    def summary(self, session_id: str) -> Summary | None:
        with storage_errors(session_id), Session(self._one) as db:
            return db.get(Summary, session_id)

    def user_turn_texts(
        self, session_id: str, *, through_seq: int, seqs: Collection[int] | None = None
    ) -> dict[int, str]:
        """The user's turns with ``seq <= through_seq``, ``seq`` → verbatim text (for validating
        quotes); only those whose seq is in ``seqs`` when it is given (read by the
        ``(session_id, seq)`` key, however long the session)."""
        query = select(Turn.seq, Turn.content).where(
            Turn.session_id == session_id, Turn.role == "user", Turn.seq <= through_seq
        )
        if seqs is not None:
            if not seqs:
                return {}
            query = query.where(col(Turn.seq).in_(sorted(seqs)))
        with storage_errors(session_id), Session(self._one) as db:
            return {seq: content for seq, content in db.exec(query).all()}

    def rolled_out_count(self, session_id: str, *, excluding: Collection[int] = ()) -> int:
        """How many of the session's turns are no longer in the recent window (summarized or
        archived), leaving out those whose seq is in ``excluding``. One count, no rows read back."""
        query = (
            select(func.count()).select_from(Turn).where(Turn.session_id == session_id, Turn.state != TurnState.context)
        )
        if excluding:
            query = query.where(col(Turn.seq).not_in(sorted(excluding)))
        with storage_errors(session_id), Session(self._one) as db:
            return int(db.exec(query).one())

    def compaction_state(self, session_id: str) -> CompactionState:
        with storage_errors(session_id), Session(self._one) as db:
            state = db.get(CompactionState, session_id)
            return state if state is not None else CompactionState(session_id=session_id)

    @contextlib.contextmanager
    def compaction_lock(self, session_id: str) -> Iterator[bool]:
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

    def record_compaction_failure(self, session_id: str, *, error: str, threshold: int) -> CompactionState:
        """Count one consecutive failure and keep its reason.

        The breaker opens when the count reaches ``threshold``; a failure while it is
        already open (a half-open probe) opens it again from now. Nothing else changes.
        """
        with storage_errors(session_id), Session(self.engine) as db:
            state = db.exec(
                select(CompactionState).where(CompactionState.session_id == session_id).with_for_update()
            ).first() or CompactionState(session_id=session_id)
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
        with storage_errors(session_id), Session(self.engine) as db:
            state = db.get(CompactionState, session_id) or CompactionState(session_id=session_id)
            state.consecutive_failures = 0
            state.breaker_opened_at = None
            state.recent_errors = []
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
        summary_items: list[SummaryItemJSON],
        summary_first_seq: int,
        summary_last_seq: int,
        summary_tokens: int,
        dropped_quotes: int = 0,
        turn_vectors: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        """In one transaction: write the segments, replace the summary, mark the turns
        summarized, close the breaker, reset the failure count and count the compaction.
        Nothing is deleted.

        Args:
            dropped_quotes: user quotes this merge left out to fit the cap (added to the summary's count).
            turn_vectors: turn id → the embedding of that turn's content, for rolled-out turns
                that had none stored (a turn that already has one keeps it).

        Raises:
            StorageError: a turn was no longer in the recent window (nothing was written).
        """
        with storage_errors(session_id), Session(self.engine) as db:
            self._add_segments(db, session_id=session_id, user_id=user_id, segments=segments)
            self._add_turn_vectors(db, turn_vectors or {})
            summary = db.get(Summary, session_id)
            if summary is None:
                summary = Summary(
                    session_id=session_id,
                    content=summary_content,
                    items=summary_items,
                    first_seq=summary_first_seq,
                    last_seq=summary_last_seq,
                    tokens=summary_tokens,
                    dropped_quotes=dropped_quotes,
                )
            else:
                summary.content = summary_content
                summary.items = summary_items
                summary.first_seq = summary_first_seq
                summary.last_seq = summary_last_seq
                summary.tokens = summary_tokens
                summary.dropped_quotes = (summary.dropped_quotes or 0) + dropped_quotes
                summary.updated_at = utcnow()
            db.add(summary)
            self._roll_out(db, session_id=session_id, turn_ids=turn_ids, to=TurnState.summarized)
            db.execute(
                text(
                    "UPDATE compaction_state SET consecutive_failures = 0, last_error = NULL, "
                    "recent_errors = '[]'::jsonb, breaker_opened_at = NULL, "
                    "compactions = compactions + 1 WHERE session_id = :s"
                ).bindparams(s=session_id)
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
        ``turn_vectors`` as in :meth:`commit_compaction`.

        Raises:
            StorageError: a turn was no longer in the recent window (nothing was written).
        """
        with storage_errors(session_id), Session(self.engine) as db:
            self._add_segments(db, session_id=session_id, user_id=user_id, segments=segments)
            self._add_turn_vectors(db, turn_vectors or {})
            self._roll_out(db, session_id=session_id, turn_ids=turn_ids, to=TurnState.archived)
            db.commit()

    @staticmethod
    def _add_turn_vectors(db: Session, vectors: Mapping[int, Sequence[float]]) -> None:
        """Store turn vectors; a turn that already has one keeps it."""
        if not vectors:
            return
        statement = (
            pg_insert(TurnVector)
            .values([{"turn_id": turn_id, "embedding": list(v)} for turn_id, v in vectors.items()])
            .on_conflict_do_nothing(index_elements=["turn_id"])
        )
        db.execute(statement)

    @staticmethod
    def _add_segments(db: Session, *, session_id: str, user_id: str, segments: Sequence[NewSegment]) -> None:
        """Insert the segments: one multi-row ``INSERT`` per :data:`SEGMENT_ROWS` segments."""
        created_at = utcnow()
        for start in range(0, len(segments), SEGMENT_ROWS):
            db.execute(
                pg_insert(ArchivedSegment).values(
                    [
                        {
                            "user_id": user_id,
                            "session_id": session_id,
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

    @staticmethod
    def _roll_out(db: Session, *, session_id: str, turn_ids: Sequence[int], to: TurnState) -> None:
        """Move turns out of the recent window; all of them must still be in it."""
        from errors import StorageError

        if not turn_ids:
            return
        result = db.exec(
            update(Turn)
            .where(
                col(Turn.session_id) == session_id,
                col(Turn.id).in_(list(turn_ids)),
                col(Turn.state) == TurnState.context,
            )
            .values(state=to)
        )
        if result.rowcount != len(turn_ids):
            db.rollback()
            raise StorageError(
                f"Compaction of session {session_id!r} found {len(turn_ids) - result.rowcount} of "
                f"{len(turn_ids)} turns already out of the recent window; nothing was written.",
                session_id=session_id,
            )

    # -- carried-over summaries ------------------------------
    def carried_quotes(self, session_id: str) -> dict[int, str]:
        """User quotes the session's summary carried over from its previous session:
        their (non-positive) ``seq`` → text. They were validated against that session's
        turns when they were made; a later summary may keep them only verbatim."""
        summary = self.summary(session_id)
        items = summary.items if summary is not None else []
        return {
            seq: str(i.get("text", ""))
            for i in items
            if i.get("carried_from") and i.get("role") == "user" and isinstance(seq := i.get("seq"), int) and seq <= 0
        }

    # -- attachments and deletion -----------------------------------------------
    def turn_attachments(self, session_id: str, *, head_chars: int) -> dict[int, list[TurnFile]]:
        """The files carried by the session's turns: turn id -> :class:`TurnFile` rows in attachment
        order, each with the first ``head_chars`` characters of its extract. A read: nothing changes.
        """
        with storage_errors(session_id), Session(self._one) as db:
            rows = (
                db.execute(
                    text(
                        "SELECT tf.turn_id, tf.position, f.id AS file_id, f.name, f.mime, f.size_bytes, f.durability, "
                        "f.parse_state, f.parse_error, f.page_count, f.body_start_page, "
                        "left(f.extract, :head) AS text_head, length(f.extract) AS text_chars "
                        "FROM turn_files tf JOIN turns t ON t.id = tf.turn_id JOIN files f ON f.id = tf.file_id "
                        "WHERE t.session_id = :s ORDER BY t.seq, tf.position"
                    ).bindparams(s=session_id, head=max(int(head_chars), 0))
                )
                .mappings()
                .all()
            )
        out: dict[int, list[TurnFile]] = {}
        for row in rows:
            values = dict(row)
            out.setdefault(values.pop("turn_id"), []).append(TurnFile(**values))
        return out

    def existing_file_ids(self, file_ids: Iterable[str], *, user_id: str) -> set[str]:
        """Those of ``file_ids`` that exist and belong to ``user_id``."""
        ids = list(dict.fromkeys(file_ids))
        if not ids:
            return set()
        with storage_errors(), Session(self._one) as db:
            rows = db.execute(
                text("SELECT id FROM files WHERE user_id = :u AND id = ANY(:ids)").bindparams(u=user_id, ids=ids)
            ).all()
        return {r[0] for r in rows}

    def truncate_from(self, session_id: str, *, seq: int) -> dict[str, Any]:
        """Delete the session's turns with ``seq >= seq`` (and their ``turn_files`` rows) in one
        transaction, for editing and resending the turn ``seq``.

        Returns ``{"turns": deleted count, "file_ids": ids those turns carried}``; the files
        themselves stay (the caller removes those nothing references any more, afterwards).

        Raises:
            InvalidMessageError: ``reason="bad_edit"``: no such turn, it is not a user turn, or a
                turn from it on has left the recent window (summarized or archived turns are
                never deleted).
        """
        from errors import InvalidMessageError

        with storage_errors(session_id), Session(self.engine) as db:
            db.execute(text("SELECT id FROM sessions WHERE id = :s FOR UPDATE").bindparams(s=session_id))
            target = db.exec(select(Turn).where(Turn.session_id == session_id, Turn.seq == seq)).first()
            if target is None or target.role != "user":
                raise InvalidMessageError(
                    f"Session {session_id!r} has no user turn {seq}; only a stored user turn can be edited and resent.",
                    reason="bad_edit",
                )
            rolled = db.exec(
                select(func.count())
                .select_from(Turn)
                .where(Turn.session_id == session_id, Turn.seq >= seq, Turn.state != TurnState.context)
            ).one()
            if rolled:
                raise InvalidMessageError(
                    f"Turn {seq} of session {session_id!r} has left the recent window (it is summarized or "
                    "archived); only turns still in the recent window can be edited and resent.",
                    reason="bad_edit",
                )
            file_ids = [
                r[0]
                for r in db.execute(
                    text(
                        "SELECT tf.file_id FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
                        "WHERE t.session_id = :s AND t.seq >= :q ORDER BY t.seq, tf.position"
                    ).bindparams(s=session_id, q=seq)
                ).all()
            ]
            db.execute(
                text(
                    "DELETE FROM turn_files WHERE turn_id IN (SELECT id FROM turns WHERE session_id = :s AND seq >= :q)"
                ).bindparams(s=session_id, q=seq)
            )
            deleted = cast(
                "CursorResult[Any]",
                db.execute(
                    text("DELETE FROM turns WHERE session_id = :s AND seq >= :q").bindparams(s=session_id, q=seq)
                ),
            ).rowcount
            db.commit()
        return {"turns": int(deleted), "file_ids": list(dict.fromkeys(file_ids))}

    def delete_session(self, session_id: str, *, files: FileStore | None = None) -> dict[str, int]:
        """Delete a session and everything of it, in one transaction: its turns and their
        ``turn_files`` rows, the summary, the archived segments, the compaction state and the
        session row. The user stays; a later session that started from this one's summary
        keeps its own copy (its ``carried_from`` becomes NULL). Then, if ``files`` (a :class:`memory.files.FileStore`) is given, the files
        those turns carried (and the session's ephemeral files) that no turn of any other
        session references any more: a reference count over ``turn_files``; session-level
        source lists play no part, so a stale entry cannot keep a file alive.

        Returns counts by kind: ``turns``, ``turn_files``, ``summaries``, ``archived_segments``,
        ``compaction_state``, ``sessions``, ``files``. An unknown session gives all zeros.

        Raises:
            StorageError: the database failed; nothing was deleted.
        """
        with storage_errors(session_id), Session(self.engine) as db:
            params = {"s": session_id}
            db.execute(text("SELECT id FROM sessions WHERE id = :s FOR UPDATE").bindparams(**params))
            candidates = [
                r[0]
                for r in db.execute(
                    text(
                        "SELECT DISTINCT tf.file_id FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
                        "WHERE t.session_id = :s UNION SELECT id FROM files WHERE session_id = :s"
                    ).bindparams(**params)
                ).all()
            ]
            counts = {
                "turn_files": cast(
                    "CursorResult[Any]",
                    db.execute(
                        text(
                            "DELETE FROM turn_files WHERE turn_id IN (SELECT id FROM turns WHERE session_id = :s)"
                        ).bindparams(**params)
                    ),
                ).rowcount,
            }
            for name, table in (
                ("archived_segments", "archived_segments"),
                ("summaries", "summaries"),
                ("compaction_state", "compaction_state"),
                ("turns", "turns"),
            ):
                deleted_rows = db.execute(text(f"DELETE FROM {table} WHERE session_id = :s").bindparams(**params))
                counts[name] = cast("CursorResult[Any]", deleted_rows).rowcount
            deleted_rows = db.execute(text("DELETE FROM sessions WHERE id = :s").bindparams(**params))
            counts["sessions"] = cast("CursorResult[Any]", deleted_rows).rowcount
            db.commit()
        counts["files"] = len(files.delete_unreferenced(candidates)) if files is not None and candidates else 0
        return {k: int(v) for k, v in counts.items()}

    # -- counts ----------------------------------------------------------------
    def archive_count(self, *, user_id: str) -> int:
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
