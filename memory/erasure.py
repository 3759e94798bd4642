"""The erasure room: marking a user as being erased, and deleting what is left of them at the end.

An erasure (``runtime.turn.UserOps.erase``) runs in steps that can be run again: it marks the user
(:meth:`Erasure.mark`; from then on no turn of theirs is claimed and no session of theirs is
made), deletes each session with everything of it (:meth:`memory.sessions.Sessions.delete`), the
user's files and their blobs (:meth:`memory.files.FileStore.delete`), then, in one transaction,
the rest (:meth:`Erasure.finish`): learned facts, the profile, the user's own characters, the
queue's jobs that name the user or their files, and the user's row.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Engine, text
from sqlmodel import Session

from memory.database import autocommit_engine, storage_errors

FINISH: tuple[tuple[str, str], ...] = (
    ("learned_facts", "DELETE FROM learned_facts WHERE user_id = :u"),
    ("user_profiles", "DELETE FROM user_profiles WHERE user_id = :u"),
    ("characters", "DELETE FROM characters WHERE owner_id = :u"),
    (
        "jobs",
        "DELETE FROM procrastinate_jobs WHERE status <> 'doing' AND (args->>'user_id' = :u "
        "OR args->>'file_id' = ANY(:files) OR args->>'session_id' = ANY(:sessions))",
    ),
    ("users", "DELETE FROM users WHERE id = :u"),
)
"""What :meth:`Erasure.finish` deletes, in order, each table's statement."""


class Erasure:
    """Erasing users: the mark, what is left, and whether anything is."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._one = autocommit_engine(engine)

    def mark(self, user_id: str) -> bool:
        """Mark the user as being erased (kept if marked already); False if there is no such user."""
        with storage_errors(), Session(self._one) as db:
            marked = db.execute(
                text("UPDATE users SET erasing_at = coalesce(erasing_at, now()) WHERE id = :u RETURNING id"),
                {"u": user_id},
            ).first()
            db.commit()
        return marked is not None

    def sessions(self, user_id: str) -> list[str]:
        """The user's session ids."""
        with storage_errors(), Session(self._one) as db:
            return [r[0] for r in db.execute(text("SELECT id FROM sessions WHERE user_id = :u"), {"u": user_id})]

    def files(self, user_id: str) -> list[str]:
        """The user's file ids."""
        with storage_errors(), Session(self._one) as db:
            return [r[0] for r in db.execute(text("SELECT id FROM files WHERE user_id = :u"), {"u": user_id})]

    def running_jobs(self, user_id: str, *, sessions: list[str], files: list[str]) -> int:
        """Queue jobs of the user (or their sessions or files) a worker is running now."""
        with storage_errors(), Session(self._one) as db:
            return int(
                db.execute(
                    text(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing' AND (args->>'user_id' = :u "
                        "OR args->>'file_id' = ANY(:files) OR args->>'session_id' = ANY(:sessions))"
                    ),
                    {"u": user_id, "files": files, "sessions": sessions},
                ).scalar_one()
            )

    def finish(self, user_id: str, *, sessions: list[str], files: list[str]) -> dict[str, int]:
        """In one transaction, delete what is left of the user (:data:`FINISH`): counts by table.
        ``sessions`` and ``files``: the ids the erasure deleted, whose queue jobs go too."""
        counts: dict[str, int] = {}
        with storage_errors(), Session(self._engine) as db:
            for table, statement in FINISH:
                done = db.execute(text(statement), {"u": user_id, "files": files, "sessions": sessions})
                counts[table] = cast("CursorResult[Any]", done).rowcount
            db.commit()
        return counts
