"""Session operations beside the turn loop: the greeting, and deleting files and sessions."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from errors import InvalidRequestError, SessionOwnershipError
from memory.files import FileStore
from memory.profiles import Profiles
from memory.store import Store
from memory.tables import Turn, offset_minutes, utcnow
from persona import expand
from runtime.context import macro_context, user_zone
from runtime.turn._gather import user_name
from runtime.turn._runner import TurnRunner

log = structlog.get_logger("companion.engine")


class SessionOps:
    """The greeting, and deleting files and sessions: what :class:`runtime.turn.Engine` does
    beside the turn loop. Each method is documented on the engine's method of the same name."""

    def __init__(self, *, runner: TurnRunner, store: Store, files: FileStore | None, profiles: Profiles) -> None:
        self.runner, self.store, self.files, self.profiles = runner, store, files, profiles

    def greet(self, *, user_id: str, session_id: str, at: datetime | None = None, greeting: int = 0) -> Turn | None:
        """See :meth:`runtime.turn.Engine.greet`."""
        session = self.store.sessions.get(session_id)
        cast = self.runner.cast
        persona = (cast.newest(session.character_id) if session is not None else cast.default).persona
        greetings = persona.greetings
        if not 0 <= greeting < len(greetings):
            raise InvalidRequestError(
                f"greeting must be 0 (the first message) to {len(greetings) - 1} (alternate greetings), got {greeting}.",
                field="greeting",
            )
        if not greetings[greeting]:
            return None
        if session is not None and self.store.turns.of_session(session_id):
            return None
        where = "first_mes" if greeting == 0 else f"alternate_greetings[{greeting - 1}]"
        profile = self.profiles.get(user_id)
        said = at if at is not None and at.tzinfo is not None else (at or utcnow()).replace(tzinfo=UTC)
        ctx = macro_context(
            persona,
            user_name=user_name(profile),
            session_id=session_id,
            # the greeting's clock macros on the user's clock: their zone, else the greeting's own offset
            now=said.astimezone(user_zone(profile.time_zone if profile is not None else None, offset_minutes(at))),
        )
        text = expand(greetings[greeting], ctx, field=where).strip()
        if not text:
            return None
        turn = self.runner.add_turn(user_id=user_id, session_id=session_id, role="assistant", content=text, at=at)
        log.info("session.greeted", session_id=session_id, seq=turn.seq, tokens=turn.tokens)
        return turn

    def delete_file(self, *, user_id: str, file_id: str) -> bool:
        """See :meth:`runtime.turn.Engine.delete_file`."""
        if self.files is None:
            return False
        deleted = bool(self.files.delete(file_id, user_id=user_id))
        log.info("file.deleted", file_id=file_id, deleted=deleted)
        return deleted

    def delete_session(self, *, user_id: str, session_id: str) -> dict[str, int]:
        """See :meth:`runtime.turn.Engine.delete_session`."""
        session = self.store.sessions.get(session_id)
        if session is not None and session.user_id != user_id:
            raise SessionOwnershipError(
                f"Session {session_id!r} belongs to another user, not {user_id!r}; nothing was deleted.",
                session_id=session_id,
            )
        counts = self.store.sessions.delete(session_id, files=self.files)
        log.info("session.deleted", session_id=session_id, **counts)
        return counts
