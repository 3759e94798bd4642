"""The engine: the public facade over turn running and context gathering.

:class:`Engine` is its parts (storage, embedder, persona, replier, summarizer, token counter,
file services), wired once by :class:`~runtime.turn._wiring.EngineParts`, and delegates: writing
turns to :class:`~runtime.turn._runner.TurnRunner`, assembling contexts to
:class:`~runtime.turn._gather.ContextGatherer`. Attachments and images are turn extensions
(:mod:`runtime.turn._extensions`), called at the same points of every turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from memory.tables import Turn, UserProfile
from runtime.accounting import Budgets
from runtime.context import AssembledContext
from runtime.llm import metered
from runtime.turn._claims import TurnClaim
from runtime.turn._values import TurnResult
from runtime.turn._wiring import EngineParts


class Engine(EngineParts):
    """Runs turns for any number of sessions on one database.

    Build it with :func:`runtime.service.open_engine`, which starts or connects to the database
    and checks the schema and the embedding dimension. The constructor and :meth:`derive` are
    :class:`~runtime.turn._wiring.EngineParts`'s. ``file_services``
    (:func:`runtime.files.open_file_services`) enable attachments; without them a turn with
    attachments raises ConfigurationError. ``transcriber`` describes images for a text-only reply
    model; by default one built from the ``COMPANION_VISION_*`` settings.
    """

    def turn(
        self,
        *,
        user_id: str,
        session_id: str,
        message: str | bytes,
        at: datetime | None = None,
        reply: str | None = None,
        on_delta: Callable[[str], None] | None = None,
        attachments: Sequence[str] = (),
        claim: TurnClaim | None = None,
        character_id: str | None = None,
    ) -> TurnResult:
        """Run one turn: store the user message, assemble the context, reply, store the reply,
        then hand the session's compaction to the engine's scheduler (run at once, or queued).

        One session runs one turn at a time: the turn claims its session (:meth:`claim`) before it
        stores anything, unless the caller passes the ``claim`` it holds (and releases).

        Args:
            message: the user's message, ``str`` or UTF-8 ``bytes``.
            at: when the message was said (default: now); the reply gets the same time.
            reply: the assistant's reply, if already known (replay); otherwise the replier is asked.
            on_delta: called with each piece of the reply as it streams in; ``None`` asks for the
                reply whole. Either way it is stored once, complete (or, if the stream broke off,
                as far as it came, marked ``interrupted``).
            attachments: ids of stored files the message carries, in order. Each must be the user's
                (an ephemeral one, of this session); checked before anything is stored.
            character_id: who the session talks as (a stored character's id, ``ch_…``): a new
                session is made with it (``None``: the engine's default character); an existing
                one must already talk as it. The engine trusts its caller: any stored character is
                taken, whoever owns it (the HTTP API checks what an app's user may see).

        Raises:
            InvalidMessageError: the message is invalid; nothing was stored.
            TurnInProgressError: another turn of the session is running; nothing was stored.
            InvalidRequestError: ``claim`` is a claim on another session; nothing was stored.
            InvalidFieldError: ``character_id`` is not the character the session talks as, or not a
                valid id (field ``character_id``); nothing was stored.
            NotFoundError: a new session's ``character_id`` names no stored character; nothing was
                stored.
            FileNotFound: an attachment id is unknown, another user's, or another session's
                ephemeral id; nothing was stored.
            ConfigurationError: attachments given to an engine without a file store, or the
                embedder cannot run (its model graph cannot be exported or loaded); nothing was
                stored.
            ModelCallError: the reply failed; the user turn stays stored. Its subclass says why:
                ContextOverflowError (twice too long), ModelAuthError, ModelRequestError,
                ModelUnavailableError (after bounded retries).
            StorageError: the database failed.
        """
        with metered():  # the turn's embedding and rerank calls, priced on its reply
            return self.runner.run(
                user_id=user_id,
                session_id=session_id,
                message=message,
                at=at,
                reply=reply,
                on_delta=on_delta,
                attachments=attachments,
                claim=claim,
                character_id=character_id,
            )

    def claim(self, session_id: str) -> TurnClaim:
        """Claim an existing session for one turn or edit; release it when done.

        Raises:
            TurnInProgressError: another turn, edit or greeting of the session is running.
            SessionClosedError: the session was closed. NotFoundError: no such session.
        """
        return self.runner.claim(session_id)

    def add_turn(
        self,
        *,
        user_id: str,
        session_id: str,
        role: str,
        content: str | bytes,
        at: datetime | None = None,
        attachments: Sequence[str] = (),
    ) -> Turn:
        """Store one turn without a model call (e.g. a character's opening line). ``attachments``:
        file ids, checked as in :meth:`turn`; on an assistant turn, images it generated.

        Raises:
            InvalidMessageError: an invalid message or a role other than user/assistant.
            FileNotFound, ConfigurationError: a bad attachment id, as in :meth:`turn`; nothing stored.
        """
        return self.runner.add_turn(
            user_id=user_id, session_id=session_id, role=role, content=content, at=at, attachments=attachments
        )

    def greet(self, *, user_id: str, session_id: str, at: datetime | None = None, greeting: int = 0) -> Turn | None:
        """Store one of the persona's greetings as the opening assistant turn of a new session.

        ``greeting`` 0 is the card's first message, ``i`` >= 1 its ``i``-th alternate greeting
        (the V3 spec's greeting index). Macros are replaced (``{{user}}`` is the user's name from
        the pinned profile, else ``User``). Returns the stored turn, or ``None`` when that greeting
        is empty or the session already has turns (nothing is stored then).

        Raises:
            InvalidRequestError: ``greeting`` is not an index of the persona's greetings (field ``greeting``).
        """
        return self.sessions.greet(user_id=user_id, session_id=session_id, at=at, greeting=greeting)

    def set_profile(
        self,
        *,
        user_id: str,
        name: str | None = None,
        pronouns: str | None = None,
        facts: list[str] | None = None,
        time_zone: str | None = None,
    ) -> UserProfile:
        """Set the user's pinned profile (``None`` leaves a field; ``facts`` replaces the user-set
        facts; ``time_zone``: an IANA zone). See :meth:`memory.profiles.Profiles.set`."""
        return self.profiles.set(user_id, name=name, pronouns=pronouns, facts=facts, time_zone=time_zone)

    def assemble(
        self,
        *,
        user_id: str,
        session_id: str,
        pending: str | None = None,
        budgets: Budgets | None = None,
        window: int | None = None,
    ) -> AssembledContext:
        """Assemble the context for the session's next reply. Changes nothing.

        Args:
            pending: a user message to answer that is not stored (e.g. an evaluation question);
                by default the newest stored user turn is the query.
            budgets, window: smaller ones than the engine's, for one harder attempt (tokens).
        """
        context, _ = self.gatherer.assemble(
            user_id=user_id,
            session_id=session_id,
            profile=self.profiles.get(user_id),
            pending=pending,
            budgets=budgets,
            window=window,
        )
        return context

    def edit_turn(
        self,
        *,
        user_id: str,
        session_id: str,
        seq: int,
        message: str | bytes,
        attachments: Sequence[str] = (),
        at: datetime | None = None,
        reply: str | None = None,
        on_delta: Callable[[str], None] | None = None,
        claim: TurnClaim | None = None,
        expected_last_seq: int | None = None,
    ) -> TurnResult:
        """Edit the user turn ``seq`` and resend it: the turns from ``seq`` on are deleted, then the
        edited message runs as a new turn with ``attachments``. Files of earlier turns are kept; the
        replaced turns' files are deleted after the truncation, if nothing references them.

        ``expected_last_seq``: the last turn the caller saw when it asked. An edit waits for a
        running turn of the session; if turns arrived after that one meanwhile, nothing is deleted
        (:class:`~errors.TurnsChangedError`), so a message that was answered is never lost to an
        edit that did not see it. ``None``: no such check (a caller that holds the claim already).

        Raises:
            TurnsChangedError: the session's last turn is after ``expected_last_seq``; nothing changed.
            InvalidMessageError: a bad message, or ``bad_edit``: no such user turn, or it has left
                the recent window. Nothing was changed.
            FileNotFound, SessionOwnershipError, InvalidRequestError: as in :meth:`turn`; nothing was
                changed.
            ModelCallError: as in :meth:`turn`; the edited user turn stays stored.
        """
        with metered():
            return self.runner.edit(
                user_id=user_id,
                session_id=session_id,
                seq=seq,
                message=message,
                attachments=attachments,
                at=at,
                reply=reply,
                on_delta=on_delta,
                claim=claim,
                expected_last_seq=expected_last_seq,
            )

    def delete_file(self, *, user_id: str, file_id: str) -> bool:
        """Delete a file and every reference to it in every session. False if the user has no such file."""
        return self.sessions.delete_file(user_id=user_id, file_id=file_id)

    def delete_session(self, *, user_id: str, session_id: str) -> dict[str, int]:
        """Delete a session and everything of it, and the files no other session references
        (:meth:`memory.sessions.Sessions.delete`). Returns counts by kind.

        Raises:
            SessionOwnershipError: the session belongs to another user (nothing deleted).
        """
        return self.sessions.delete_session(user_id=user_id, session_id=session_id)
