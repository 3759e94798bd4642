"""A turn's claim on its session: while it is held no other turn, edit or greeting of the
session runs (:meth:`memory.sessions.Sessions.claim`)."""

from __future__ import annotations

import time
import uuid

from errors import InvalidFieldError, InvalidRequestError, TurnInProgressError
from memory.store import ClaimedSession, Store
from memory.validation import check_id

CLAIM_POLL_SECONDS = (0.02, 0.25)
"""While a turn waits for its session: first and longest pause between two tries, seconds (doubling)."""


class TurnClaim:
    """One claim on a session: while it is held no other turn, edit or greeting of the session
    runs (:meth:`memory.sessions.Sessions.claim`). Release it once, when the work has ended.

    A busy session is tried again, with pauses, for up to ``wait_seconds``; then
    :class:`~errors.TurnInProgressError`. No connection is held while waiting. ``session``: the
    claimed session's user, and whether its compaction breaker was open when it was claimed."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        *,
        lease_seconds: float,
        wait_seconds: float = 0.0,
        user_id: str | None = None,
    ) -> None:
        self.store, self.session_id = store, session_id
        self.owner = uuid.uuid4().hex
        deadline = time.monotonic() + wait_seconds
        pause = CLAIM_POLL_SECONDS[0]
        while True:
            try:
                self.session: ClaimedSession = store.sessions.claim(
                    session_id, owner=self.owner, lease_seconds=lease_seconds, user_id=user_id
                )
                return
            except TurnInProgressError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(pause, left))
                pause = min(pause * 2, CLAIM_POLL_SECONDS[1])

    def release(self) -> None:
        self.store.sessions.release(self.session_id, owner=self.owner, user_id=self.session.user_id)

    def __enter__(self) -> TurnClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_claim(claim: TurnClaim | None, session_id: str) -> None:
    """A caller's claim must be on the session the work is for.

    Raises:
        InvalidRequestError: it is a claim on another session; nothing was stored.
    """
    if claim is not None and claim.session_id != session_id:
        raise InvalidRequestError(
            f"The claim given is on session {claim.session_id!r}, not {session_id!r}; nothing was stored.",
            field="claim",
        )


def check_character(claim: TurnClaim | None, character_id: str | None) -> None:
    """A turn that names its character (``None``: any) must name it by a valid id, and its claimed
    session (``None``: not claimed yet) must talk as it.

    Raises:
        InvalidFieldError: ``character_id`` is not a valid id, or the session talks as another
            character (field ``character_id``); nothing was stored.
    """
    if character_id is None:
        return
    check_id(character_id, field="character_id")
    if claim is not None and claim.session.character_id != character_id:
        raise InvalidFieldError(
            f"Session {claim.session_id!r} talks as character {claim.session.character_id!r}, not "
            f"{character_id!r}: a session keeps its character; start another session to talk with this one. "
            "Nothing was stored.",
            field="character_id",
            reason="other_character",
        )
