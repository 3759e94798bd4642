"""A user's data as a whole: erasing it, and exporting it.

Erasure (GDPR Art. 17; PIPL Art. 47) runs in steps that can be run again, so an erasure stopped
half-way (a crash, the database going away) is finished by running it again: mark the user (no new
turn, session or upload of theirs starts; a turn running then ends with
:class:`~errors.UserErasingError` or :class:`~errors.NotFoundError` when it stores its reply), delete
each session with everything of it, delete the user's files (a blob another user's file shares by
content stays for that user), wait for queue jobs of the user a worker is running, then delete the
rest in one transaction. Export (GDPR Art. 20; PIPL Art. 45) gives everything stored about the user
as one JSON value.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from memory.files import FileStore
from memory.store import Store
from runtime.turn._sessions import SessionOps

log = structlog.get_logger("companion.users")

JOB_WAIT_SECONDS = 30.0
"""How long an erasure waits for a running queue job of the user before it reports itself unfinished."""


@dataclass(frozen=True, kw_only=True)
class Erased:
    """What an erasure deleted, by table (rows; ``files`` counts the user's files)."""

    counts: dict[str, int] = field(default_factory=dict)
    finished: bool = True
    """False when a queue job of the user was still running: run the erasure again."""


class UserOps:
    """Erasing and exporting one user's data."""

    def __init__(self, *, store: Store, files: FileStore | None, sessions: SessionOps) -> None:
        self.store, self.files, self.sessions = store, files, sessions

    def erase(self, user_id: str, *, job_wait: float = JOB_WAIT_SECONDS) -> Erased:
        """Erase every row, vector, blob, job and breaker state of ``user_id`` (the runtime's id).
        Safe to run again; an unknown user erases nothing (all counts 0).

        Raises:
            StorageError: the database failed; what was deleted stays deleted, and running the
                erasure again finishes it.
        """
        if not self.store.erasure.mark(user_id):
            return Erased(counts={})
        log.info("user.erasing", user_id=user_id)
        counts: Counter[str] = Counter()
        sessions = self.store.erasure.sessions(user_id)
        for session_id in sessions:
            counts.update(self.store.sessions.delete(session_id, files=self.files))
        files = self.store.erasure.files(user_id)
        if self.files is not None:
            counts["files"] += sum(self.files.delete(f, user_id=user_id) for f in files)
        deadline = time.monotonic() + job_wait
        while self.store.erasure.running_jobs(user_id, sessions=sessions, files=files):
            if time.monotonic() >= deadline:
                log.warning("user.erase_unfinished", user_id=user_id, reason="queue_job_running")
                return Erased(counts=dict(counts), finished=False)
            time.sleep(0.2)
        counts.update(self.store.erasure.finish(user_id, sessions=sessions, files=files))
        log.info("user.erased", user_id=user_id, **{k: int(v) for k, v in counts.items()})
        return Erased(counts={k: int(v) for k, v in counts.items()})

    def export(self, user_id: str) -> dict[str, Any]:
        """Everything stored about ``user_id``, as JSON-ready values: the profile, what each
        character learned, every session with its turns (verbatim), its summary (text and entries)
        and its archived segments, the user's files (metadata; the bytes by their id), and the
        user's own characters (their cards). Times are ISO 8601."""
        profile = self.store.profiles.get(user_id)
        sessions = []
        for session_id in self.store.erasure.sessions(user_id):
            session = self.store.sessions.get(session_id)
            if session is None:
                continue
            summary = self.store.compaction.summary(session_id, user_id=user_id)
            sessions.append(
                {
                    "id": session.id,
                    "character_id": session.character_id,
                    "created_at": session.created_at.isoformat(),
                    "closed_at": session.closed_at.isoformat() if session.closed_at else None,
                    "carried_from": session.carried_from,
                    "turns": [
                        {
                            "seq": t.seq,
                            "role": t.role,
                            "content": t.content,
                            "created_at": t.created_at.isoformat(),
                            "state": str(getattr(t.state, "value", t.state)),
                            "character_revision": t.character_revision,
                        }
                        for t in self.store.turns.of_session(session_id, user_id=user_id)
                    ],
                    "summary": {"content": summary.content, "items": summary.items} if summary else None,
                    "memories": [
                        {
                            "id": f"seg_{s.id}",
                            "first_seq": s.first_seq,
                            "last_seq": s.last_seq,
                            "content": s.content,
                            "date": s.session_date.isoformat(),
                        }
                        for s in self.store.archive.segments(session_id=session_id)
                    ],
                }
            )
        files = self.files.list(user_id=user_id) if self.files is not None else []
        return {
            "user_id": user_id,
            "profile": {
                "name": profile.name,
                "pronouns": profile.pronouns,
                "facts": list(profile.facts or []),
                "time_zone": profile.time_zone,
            }
            if profile is not None
            else None,
            "learned": self.store.profiles.learned_by_character(user_id),
            "sessions": sessions,
            "files": [
                {
                    "id": f.id,
                    "name": f.name,
                    "mime": f.mime,
                    "size_bytes": f.size_bytes,
                    "sha256": f.sha256,
                    "created_at": f.created_at.isoformat(),
                }
                for f in files
            ],
            "characters": self.store.characters.owned_cards(user_id),
        }
