"""The sessions room: the only writer of the ``users`` rows a turn makes and of ``sessions``.

A session is made on its first turn (:meth:`Sessions.ensure`), claimed for one turn at a time
(:meth:`Sessions.claim`, :meth:`Sessions.release`), closed by the close job
(:meth:`Sessions.idle_batch`) or on request (:meth:`Sessions.locked_for_close`), and deleted
with every row only it references (:meth:`Sessions.delete`, each room deleting its own rows in
one transaction).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import structlog
from sqlalchemy import Connection, CursorResult, Engine, text
from sqlmodel import Session

from errors import (
    NotFoundError,
    SessionClosedError,
    SessionOwnershipError,
    StorageError,
    TurnInProgressError,
    UserErasingError,
)
from memory.database import UntilStorageAnswers, autocommit_engine, storage_errors
from memory.tables import ChatSession, utcnow
from memory.validation import check_id

if TYPE_CHECKING:
    from memory.files import FileStore


NO_KEPT_RECALL = (
    "recall_block = NULL, recall_segments = NULL, recall_anchor = NULL, recall_tails = NULL, recall_prefix = NULL"
)
"""The ``SET`` list that drops a session's kept recall (the cache layout's block and tails; the next
turn builds its own)."""


@dataclass(frozen=True, kw_only=True)
class ClaimedSession:
    """What :meth:`Sessions.claim` learns of the session it claimed, in the same statement."""

    user_id: str
    breaker_open: bool
    """Whether the session's compaction breaker was open at the claim."""
    character_id: str
    """The session's character."""
    revision: int
    """That character's newest revision at the claim (0: it has none)."""


@dataclass(frozen=True, kw_only=True)
class ClosingSession:
    """A session the close job holds under its row lock: its id, user and character."""

    session_id: str
    user_id: str
    character_id: str


UNNAMED_CHARACTER = "Companion"
"""The deployment character of a session stored without one (and of old sessions with no persona name)."""


def unnamed_character(db: Session) -> str:
    """The id of the deployment character :data:`UNNAMED_CHARACTER`, made (without a card) if missing."""
    from memory.characters import placeholder

    return placeholder(db, UNNAMED_CHARACTER)


def erasing_error(user_id: str) -> UserErasingError:
    """The error for new work of a user who is being erased."""
    return UserErasingError(f"User {user_id!r} is being erased; nothing new of theirs is stored.", user_id=user_id)


def not_yours(session_id: str, user_id: str) -> SessionOwnershipError:
    """The error for ``user_id``'s work on a session that is another user's."""
    return SessionOwnershipError(
        f"Session {session_id!r} belongs to another user, not {user_id!r}. Use a new session id.",
        session_id=session_id,
    )


def closed_error(session_id: str, closed_at: datetime) -> SessionClosedError:
    """The error for new work on a closed session."""
    return SessionClosedError(
        f"Session {session_id!r} was closed at {closed_at.isoformat()}; start a new session "
        "(it begins from this one's summary).",
        session_id=session_id,
    )


_LIVE_CLAIM = "turn_owner IS NOT NULL AND turn_claimed_at >= now() - make_interval(secs => :lease)"
"""The one rule for a claim that still holds its session: an owner, claimed within ``:lease`` seconds."""

_CLAIM = text(
    "UPDATE sessions SET turn_owner = :o, turn_claimed_at = now() "
    f"WHERE id = :s AND closed_at IS NULL AND NOT ({_LIVE_CLAIM}) "
    "AND (CAST(:u AS text) IS NULL OR user_id = :u) "
    "AND NOT EXISTS (SELECT 1 FROM users AS w WHERE w.id = sessions.user_id AND w.erasing_at IS NOT NULL) "
    "RETURNING user_id, "
    "EXISTS (SELECT 1 FROM compaction_state AS c WHERE c.session_id = sessions.id "
    "AND c.user_id = sessions.user_id AND c.breaker_opened_at IS NOT NULL), character_id, "
    "(SELECT h.revision FROM characters AS h WHERE h.id = sessions.character_id)"
)
"""A claim that holds: set, and younger than the lease (``:lease`` seconds). The one copy of the
rule; :data:`_CLAIM` takes a session whose claim does not hold."""
_IDLE = text(
    "SELECT id, user_id, character_id FROM sessions "
    "WHERE closed_at IS NULL AND last_activity_at < :cutoff AND NOT (id = ANY(:skip)) "
    f"AND NOT ({_LIVE_CLAIM}) "
    "ORDER BY last_activity_at, id LIMIT :n FOR NO KEY UPDATE SKIP LOCKED"
)
_LOCK_ONE = text(
    "SELECT id, user_id, character_id, closed_at, "
    f"({_LIVE_CLAIM} AND turn_owner <> :owner) AS busy "
    "FROM sessions WHERE id = :s FOR NO KEY UPDATE"
)
_MARK_CLOSED = text("UPDATE sessions SET closed_at = :at, closed_by = :by WHERE id = :s")


class IdleBatch:
    """Idle open sessions claimed under their row locks by :meth:`Sessions.idle_batch`."""

    def __init__(self, conn: Connection, sessions: Sequence[ClosingSession]) -> None:
        self._conn = conn
        self.sessions = list(sessions)
        """The claimed sessions, oldest activity first."""

    def close(self, session_id: str, *, by: str) -> None:
        """Mark one claimed session closed by ``by``; it commits with the batch."""
        self._conn.execute(_MARK_CLOSED, {"at": utcnow(), "by": by, "s": session_id})


class LockedSession:
    """One session held under its row lock for closing (:meth:`Sessions.locked_for_close`)."""

    def __init__(self, conn: Connection, session: ClosingSession) -> None:
        self._conn = conn
        self.session = session

    def close(self, *, by: str) -> None:
        """Mark the session closed by ``by``; it commits when the ``with`` block ends."""
        self._conn.execute(_MARK_CLOSED, {"at": utcnow(), "by": by, "s": self.session.session_id})


SessionRowsDeleter = Callable[[Session, str], dict[str, int]]
"""A room's deletion of its rows of one session, in the caller's transaction: counts by table."""


log = structlog.get_logger("companion.sessions")

RELEASE_RETRY_SECONDS = (0.25, 2.0)
"""A claim whose release failed (the database was down) is released again, in the background,
first after this many seconds and at most this many apart (doubling), until the database answers."""


class Sessions:
    """The ``sessions`` table (and the ``users`` and ``compaction_state`` rows a new session makes)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._one = autocommit_engine(engine)
        self._unreleased = UntilStorageAnswers("companion-claim-release", pauses=RELEASE_RETRY_SECONDS)
        """Claims whose release waits for the database to answer again."""
        self.session_rows: list[SessionRowsDeleter] = []
        """The other rooms' deleters of a session's rows, run by :meth:`delete` in its transaction,
        in order (the holder, :class:`memory.store.Store`, registers them)."""

    def ensure(self, *, session_id: str, user_id: str, character_id: str | None = None) -> ChatSession:
        """Create the user and the session (talking as ``character_id``) if missing; return the
        session. A new session starts from the summary of the user's newest closed session with
        this character (:func:`memory.apps.carry_over`). An existing session keeps its character.
        ``None``: the deployment character :data:`UNNAMED_CHARACTER` (made if missing, with no card:
        it speaks as an engine's default character).

        Raises:
            SessionOwnershipError: the session exists but belongs to another user.
            InvalidFieldError: an id holds NUL or a lone surrogate, or is over 200 characters.
        """
        check_id(session_id, field="session_id")
        check_id(user_id, field="user_id")
        session = self.get(session_id)  # most calls end here: one statement
        if session is None:
            session = self._create(session_id=session_id, user_id=user_id, character_id=character_id)
        if session.user_id != user_id:
            raise not_yours(session_id, user_id)
        return session

    def _create(self, *, session_id: str, user_id: str, character_id: str | None) -> ChatSession:
        """:meth:`ensure` of a session not found: one transaction; returns the session stored
        (which another writer may have created meanwhile)."""
        from memory.apps import carry_over

        with storage_errors(session_id), Session(self._engine) as db:
            if character_id is None:
                character_id = unnamed_character(db)
            db.execute(text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id))
            erasing = db.execute(
                text("SELECT erasing_at FROM users WHERE id = :u FOR SHARE").bindparams(u=user_id)
            ).scalar_one()
            if erasing is not None:
                raise erasing_error(user_id)
            created = cast(
                "CursorResult[Any]",
                db.execute(
                    text(
                        "INSERT INTO sessions (id, user_id, character_id) VALUES (:s, :u, :c) ON CONFLICT DO NOTHING"
                    ).bindparams(s=session_id, u=user_id, c=character_id)
                ),
            ).rowcount
            db.execute(
                text("INSERT INTO compaction_state (session_id) VALUES (:s) ON CONFLICT DO NOTHING").bindparams(
                    s=session_id
                )
            )
            if created:  # a returning user's new session starts from their last closed session's summary
                carry_over(db, session_id=session_id, user_id=user_id, character_id=character_id)
            db.commit()
            session = db.get(ChatSession, session_id)
            assert session is not None
            return session

    def get(self, session_id: str) -> ChatSession | None:
        """The session row, or ``None``."""
        with storage_errors(session_id), Session(self._one) as db:
            return db.get(ChatSession, session_id)

    # -- one turn at a time ------------------------------------------------------
    def claim(self, session_id: str, *, owner: str, lease_seconds: float, user_id: str | None = None) -> ClaimedSession:
        """Claim the session for one turn (or an edit, a greeting): no other claim succeeds until
        :meth:`release`, or until ``lease_seconds`` have passed (a claim whose process died).
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
        with storage_errors(session_id), Session(self._one) as db:
            claimed = db.execute(
                _CLAIM.bindparams(o=owner, s=session_id, lease=float(lease_seconds), u=user_id)
            ).first()
            if claimed is not None:
                db.commit()
                return ClaimedSession(
                    user_id=claimed[0], breaker_open=bool(claimed[1]), character_id=claimed[2], revision=claimed[3] or 0
                )
            row = db.execute(
                text(
                    "SELECT s.closed_at, s.user_id, w.erasing_at FROM sessions AS s JOIN users AS w ON w.id = s.user_id "
                    "WHERE s.id = :s"
                ).bindparams(s=session_id)
            ).first()
        if row is None:
            raise NotFoundError(f"No session {session_id!r}.", kind="session", resource_id=session_id)
        if user_id is not None and row[1] != user_id:
            raise not_yours(session_id, user_id)
        if row[2] is not None:
            raise erasing_error(row[1])
        if row[0] is not None:
            raise closed_error(session_id, row[0])
        raise TurnInProgressError(
            f"Session {session_id!r} is running another turn; nothing was stored. Send this one again "
            "when that turn has ended.",
            session_id=session_id,
        )

    def release(self, session_id: str, *, owner: str, user_id: str | None = None) -> None:
        """End ``owner``'s claim on the session (nothing happens if it no longer holds it);
        ``user_id``: the session's user, when known (the row is found by it too).

        A release survives a storage outage: when the database cannot be reached, the claim is
        released again in the background (:data:`RELEASE_RETRY_SECONDS`) until it answers, so a
        crash of the database does not leave the session claimed until its lease lapses. Never
        raises :class:`~errors.StorageError` (it logs ``session.release_deferred``)."""
        try:
            self._release(session_id, owner, user_id)
        except StorageError as exc:
            log.warning("session.release_deferred", session_id=session_id, error=type(exc.__cause__ or exc).__name__)
            failed = time.monotonic()

            def release_later() -> None:
                self._release(session_id, owner, user_id)
                log.info("session.release_retried", session_id=session_id, after_s=round(time.monotonic() - failed, 1))

            self._unreleased.defer((session_id, owner), release_later)

    def unreleased(self) -> int:
        """Claims whose release waits for the database to answer again."""
        return self._unreleased.waiting()

    def _release(self, session_id: str, owner: str, user_id: str | None = None) -> None:
        mine = " AND user_id = :u" if user_id is not None else ""
        bound = {"u": user_id} if user_id is not None else {}
        with storage_errors(session_id), Session(self._one) as db:
            db.execute(
                text(
                    "UPDATE sessions SET turn_owner = NULL, turn_claimed_at = NULL "
                    f"WHERE id = :s AND turn_owner = :o{mine}"
                ).bindparams(s=session_id, o=owner, **bound)
            )
            db.commit()

    # -- closing -----------------------------------------------------------------
    @contextlib.contextmanager
    def idle_batch(
        self, *, cutoff: datetime, skip: Sequence[str], limit: int, lease_seconds: float
    ) -> Iterator[IdleBatch]:
        """Claim up to ``limit`` open sessions idle since before ``cutoff`` (none in ``skip``, none
        whose turn claim holds), oldest first, with ``SELECT … FOR NO KEY UPDATE SKIP LOCKED``:
        rows another worker holds are skipped. The locks are held, and the sessions closed with
        :meth:`IdleBatch.close` are committed, when the ``with`` block ends without an error.

        ``NO KEY UPDATE`` still lets a compaction's inserts (archive segments, the summary:
        foreign keys to the session, which take ``FOR KEY SHARE``) proceed on other connections.

        Raises:
            StorageError: the database failed; nothing of the batch is committed.
        """
        with storage_errors(), self._engine.connect() as conn:
            rows = conn.execute(
                _IDLE, {"cutoff": cutoff, "skip": list(skip), "n": limit, "lease": float(lease_seconds)}
            ).all()
            yield IdleBatch(conn, [ClosingSession(session_id=r[0], user_id=r[1], character_id=r[2]) for r in rows])
            conn.commit()

    @contextlib.contextmanager
    def locked_for_close(self, session_id: str, *, owner: str, lease_seconds: float) -> Iterator[LockedSession]:
        """Hold the session's row lock (``FOR NO KEY UPDATE``) for closing it: waits for a close
        job holding it. ``owner`` is the caller's own turn claim, which does not count as busy.
        :meth:`LockedSession.close` commits when the block ends without an error.

        Raises:
            NotFoundError: no such session.
            SessionClosedError: it was closed already.
            TurnInProgressError: another live claim holds it; nothing changed.
        """
        with storage_errors(session_id), self._engine.connect() as conn:
            row = conn.execute(_LOCK_ONE, {"s": session_id, "lease": float(lease_seconds), "owner": owner}).first()
            if row is None:
                raise NotFoundError(f"No session {session_id!r}.", kind="session", resource_id=session_id)
            if row.closed_at is not None:
                raise SessionClosedError(
                    f"Session {session_id!r} was closed already at {row.closed_at.isoformat()}.", session_id=session_id
                )
            if row.busy:  # a turn in flight: its user turn and reply are stored whole before any close
                raise TurnInProgressError(
                    f"Session {session_id!r} is running a turn; close it when the turn has ended. Nothing was changed.",
                    session_id=session_id,
                )
            yield LockedSession(
                conn, ClosingSession(session_id=row.id, user_id=row.user_id, character_id=row.character_id)
            )
            conn.commit()

    def closed_before(self, cutoff: datetime) -> list[tuple[str, str]]:
        """``(session id, user id)`` of every session closed before ``cutoff`` (retention)."""
        with storage_errors(), Session(self._one) as db:
            rows = db.execute(
                text("SELECT id, user_id FROM sessions WHERE closed_at < :c ORDER BY closed_at").bindparams(c=cutoff)
            ).all()
        return [(r[0], r[1]) for r in rows]

    # -- deletion ----------------------------------------------------------------
    def delete(self, session_id: str, *, files: FileStore | None = None) -> dict[str, int]:
        """Delete a session and everything of it, in one transaction: its turns and their
        ``turn_files`` rows, the summary, the archived segments, the compaction state and the
        session row (each room deletes its own rows: :attr:`session_rows`). The user stays; a later
        session that started from this one's summary keeps its own copy (its ``carried_from``
        becomes NULL). Then, if ``files`` is given, the files those turns carried (and the
        session's ephemeral files) that no turn of any other session references any more: a
        reference count over ``turn_files``. The user's other sessions drop the recall they keep
        in their prompts (the cache layout's) when it quotes this session's archived segments.

        Returns counts by kind: ``turns``, ``turn_files``, ``summaries``, ``archived_segments``,
        ``compaction_state``, ``sessions``, ``files``. An unknown session gives all zeros.

        Raises:
            StorageError: the database failed; nothing was deleted.
        """
        from memory.files import session_file_ids

        with storage_errors(session_id), Session(self._engine) as db:
            # the user's session rows, in the order a forgetting takes them: a turn of another
            # session storing recall that quotes this one's segments is waited for, and its kept
            # recall cleared below (one stored after this commits finds them gone: memory.turns)
            db.execute(
                text(
                    "SELECT id FROM sessions WHERE user_id = (SELECT user_id FROM sessions WHERE id = :s) "
                    "ORDER BY id FOR UPDATE"
                ).bindparams(s=session_id)
            )
            db.execute(
                text(
                    f"UPDATE sessions SET {NO_KEPT_RECALL} WHERE user_id = (SELECT user_id FROM sessions "
                    "WHERE id = :s) AND id <> :s AND recall_segments && "
                    "ARRAY(SELECT id FROM archived_segments WHERE session_id = :s)"
                ).bindparams(s=session_id)
            )
            candidates = session_file_ids(db, session_id)
            counts: dict[str, int] = {}
            for deleter in self.session_rows:
                counts.update(deleter(db, session_id))
            deleted = db.execute(text("DELETE FROM sessions WHERE id = :s").bindparams(s=session_id))
            counts["sessions"] = cast("CursorResult[Any]", deleted).rowcount
            db.commit()
        counts["files"] = len(files.delete_unreferenced(candidates)) if files is not None and candidates else 0
        return {k: int(v) for k, v in counts.items()}
