"""Turn running: store the user turn, assemble, reply, store the reply, then compaction.

One turn (:meth:`TurnRunner.run`) is a chain of short steps that pass values
(:class:`TurnInput`, :class:`Attempt`, :class:`ReplyOutcome`): store the user turn, reply (first
attempt, then the overflow attempt), store the reply, schedule the compaction.

1. validates the message and its attachment ids, embeds the message once, then stores the
   user turn with its vector (:class:`~memory.tables.TurnVector`, the recall query's) in one
   ``INSERT``: a local model that fails stores nothing; an embeddings API that is down stores
   the turn without its vector (recall then runs on full text and dates, and a backfill makes
   the vector later, :mod:`runtime.turn._backfill`);
2. assembles the context within per-source budgets (a read, :mod:`runtime.turn._gather`);
   turns over the ``recent`` cap that no compaction has rolled out yet stay out of view, and
   the prompt says their summary is pending;
3. gets the assistant reply (from the model, or given, as in replay);
4. stores the reply, then hands the session's compaction to the engine's
   :class:`~runtime.turn.CompactionScheduler`: run at once (inline) or deferred to a queue
   worker. The reply never waits for a summary call.

If the reply step raises, the user turn stays stored and the error propagates as
:class:`~errors.ModelCallError`. If the provider says the context is too long, the turn
compacts harder, inline, before the retry (``recent`` and ``memory`` at :data:`OVERFLOW_SHRINK` of their caps, a
:data:`OVERFLOW_MARGIN` share of the window kept free) and asks once more, through the same
attempt as the first; a second overflow raises :class:`~errors.ContextOverflowError`. A reply
whose stream broke off is stored as far as it arrived, marked ``interrupted``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import structlog

from errors import (
    CompanionError,
    ContextOverflowError,
    EmbedderUnavailableError,
    InvalidMessageError,
    NotFoundError,
    SessionOwnershipError,
)
from memory.files import FileStore
from memory.profiles import Profiles
from memory.store import Store
from memory.tables import Turn, UserProfile
from memory.validation import check_id
from persona import Persona
from runtime.accounting import Budgets, TokenCounter
from runtime.compaction import CompactionOutcome, Compactor
from runtime.config import TurnSettings
from runtime.context import summary_profile_facts, without_names
from runtime.llm import Replier, Reply, Tools, current_spend
from runtime.summary_items import items_from_json
from runtime.turn._attachments import check_attachments
from runtime.turn._backfill import BackfillScheduler
from runtime.turn._characters import Cast, SessionCharacter
from runtime.turn._claims import TurnClaim, check_character, check_claim
from runtime.turn._compaction import CompactionRequest, CompactionScheduler, InlineCompaction, room_cap
from runtime.turn._extensions import TurnExtension
from runtime.turn._gather import ContextGatherer, stored_cap
from runtime.turn._validate import validate_message
from runtime.turn._values import Attempt, ReplyOutcome, TurnInput, TurnResult

log = structlog.get_logger("companion.engine")

ROLES = ("user", "assistant")

OVERFLOW_SHRINK = 0.5
"""After a provider overflow, ``recent`` and ``memory`` get this share of their caps for the one retry."""
OVERFLOW_MARGIN = 0.1
"""...and this share of the window is kept free besides, against a provider that counts more than we do."""


class TurnRunner:
    """Writes turns for one engine: the turn loop, stored turns, edits, and compaction after them.

    ``gatherer`` also gives the runner its token counter, profiles and characters (its ``cast``)."""

    def __init__(
        self,
        *,
        settings: TurnSettings,
        store: Store,
        files: FileStore | None,
        gatherer: ContextGatherer,
        compactor: Compactor,
        replier: Replier | None,
        extensions: Sequence[TurnExtension],
        scheduler: CompactionScheduler | None = None,
        backfill: BackfillScheduler | None = None,
    ) -> None:
        self.settings = settings
        self.backfill = backfill
        """Asked for a backfill when a turn is stored without its vector (``None``: nothing asks)."""
        self.scheduler: CompactionScheduler = scheduler or InlineCompaction()
        self.store = store
        self.files = files
        self.gatherer = gatherer
        self.compactor = compactor
        self.profiles: Profiles = gatherer.profiles
        self.counter: TokenCounter = gatherer.counter
        self.replier = replier
        self.cast: Cast = gatherer.cast
        self.extensions = list(extensions)
        self.budgets: Budgets = gatherer.budgets
        self.window: int = gatherer.window

    def run(
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
        """See :meth:`runtime.turn.Engine.turn` (which meters it: :func:`runtime.llm.metered`)."""
        text = validate_message(message, max_chars=self.settings.max_message_chars)
        if reply is not None:
            reply = validate_message(reply, max_chars=self.settings.max_message_chars)
        elif self.replier is None:
            raise InvalidMessageError("No reply was given and the engine has no replier.", reason="no_replier")
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        check_claim(claim, session_id)
        check_character(claim, character_id)
        profile = self.profiles.get(user_id)

        def checked(character: SessionCharacter) -> TurnInput:
            return TurnInput(
                user_id=user_id,
                session_id=session_id,
                text=text,
                at=at,
                reply=reply,
                on_delta=on_delta,
                attached=attached,
                # embedded before anything is stored: a failing local model stores nothing
                vector=self._embed(text, profile, character.persona),
                profile=profile,
                character=character,
            )

        if claim is not None:
            if claim.session.user_id != user_id:  # a claim proves the session exists, not whose it is
                self.store.sessions.ensure(session_id=session_id, user_id=user_id, character_id=self.cast.default.id)
            return self._claimed_turn(checked(self._character(claim)), claim)
        check_id(session_id, field="session_id")
        check_id(user_id, field="user_id")
        early: TurnInput | None = None
        try:
            own = self.claim(session_id, user_id=user_id)
        except NotFoundError:
            # a new session talks as the character named, else the default: the message is embedded
            # before the session is made, so a failing model or unknown character leaves no session
            early = checked(self.cast.default if character_id is None else self.cast.newest(character_id))
            self.store.sessions.ensure(session_id=session_id, user_id=user_id, character_id=early.character.id)
            own = self.claim(session_id, user_id=user_id)
        with own:
            check_character(own, character_id)
            character = self._character(own)
            turn = early if early is not None and early.character == character else checked(character)
            return self._claimed_turn(turn, own)

    def _character(self, claim: TurnClaim) -> SessionCharacter:
        """Who the claimed session talks as, at the revision the claim found."""
        return self.cast.at(claim.session.character_id, claim.session.revision)

    def _claimed_turn(self, turn: TurnInput, claim: TurnClaim) -> TurnResult:
        """The turn, once its session is claimed: store the user turn, reply, store the reply, then compaction."""
        user_turn = self._store_user_turn(turn)
        try:
            outcome = self._reply(turn, user_turn)
            assistant_turn = self._store_reply(turn, outcome)
        except CompanionError as exc:
            exc.user_turn_stored = True  # what the caller tells its client: the message is kept
            raise
        compactions = [c for c in [outcome.compaction] if c is not None]
        # a failed compaction is not retried in the same turn (the breaker counts it once); the window is the
        # context's with the reply: no other turn of the session ran since (the claim)
        if all(c.ok for c in compactions):
            after = self.schedule_compaction(
                turn.session_id,
                turn.user_id,
                window=[*outcome.window, assistant_turn],
                character=turn.character,
                calibration=outcome.context.calibration,
            )
            compactions += [after] if after is not None else []
        # after this turn's compaction, else as the claim found it
        breaker_open = compactions[-1].breaker_open if compactions else claim.session.breaker_open
        outcome.log_completed(turn.session_id, user_turn, breaker_open=breaker_open, compactions=len(compactions))
        return TurnResult(
            session_id=turn.session_id,
            user_turn=user_turn,
            assistant_turn=assistant_turn,
            context=outcome.context,
            compactions=compactions,
        )

    def _store_user_turn(self, turn: TurnInput) -> Turn:
        """Store the user turn with its vector and files; the extensions see it stored."""
        user_turn = self.store.turns.add(
            session_id=turn.session_id,
            role="user",
            content=turn.text,
            tokens=self.tokens("user", turn.text),
            created_at=turn.at,
            file_ids=[f.id for f in turn.attached],
            vector=turn.vector,
            character_revision=turn.character.revision,
            user_id=turn.user_id,
        )
        if turn.vector is None and turn.text:
            self._ask_backfill()
        for extension in self.extensions:
            extension.stored(turn.attached)
        return user_turn

    def _reply(self, turn: TurnInput, user_turn: Turn) -> ReplyOutcome:
        """The given reply with the context it would answer, or the model's (:meth:`_model_reply`).
        The stored vector of ``user_turn`` is handed to assembling, which neither embeds nor reads it."""
        known = {user_turn.id: turn.vector} if turn.vector is not None and user_turn.id is not None else {}
        if turn.reply is not None:
            context, window = self.gatherer.assemble(
                user_id=turn.user_id,
                session_id=turn.session_id,
                known=known,
                profile=turn.profile,
                character=turn.character,
            )
            return ReplyOutcome(reply=Reply(content=turn.reply), context=context, window=window)
        for extension in self.extensions:
            extension.prepare(session_id=turn.session_id)
        try:
            return self._model_reply(turn, known)
        except Exception as exc:
            log.warning(
                "turn.reply_failed", session_id=turn.session_id, user_seq=user_turn.seq, error=type(exc).__name__
            )
            raise

    def _store_reply(self, turn: TurnInput, outcome: ReplyOutcome) -> Turn:
        """Store the reply once, complete, with the provider's usage and the request's estimate and
        fingerprint (the calibration of the next assembly). Only the final text is stored: tool
        calls and their results (file text) never are."""
        answer = outcome.reply
        spend = current_spend()
        record = outcome.record(self.counter)
        return self.store.turns.add(
            session_id=turn.session_id,
            role="assistant",
            content=answer.content,
            tokens=self.tokens("assistant", answer.content),
            created_at=turn.at,
            request=replace(record, retrieval_cost_usd=spend.usd) if spend is not None else record,
            character_revision=turn.character.revision,
            user_id=turn.user_id,
        )

    def add_turn(
        self,
        *,
        user_id: str,
        session_id: str,
        role: str,
        content: str | bytes,
        at: datetime | None = None,
        attachments: Sequence[str] = (),
        claim: TurnClaim | None = None,
    ) -> Turn:
        """See :meth:`runtime.turn.Engine.add_turn`."""
        if role not in ROLES:
            raise InvalidMessageError(f"Role must be one of {ROLES}, got {role!r}.", reason="bad_role")
        text = validate_message(content, max_chars=self.settings.max_message_chars)
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        check_claim(claim, session_id)
        session = self.store.sessions.ensure(session_id=session_id, user_id=user_id, character_id=self.cast.default.id)
        character = self.cast.newest(session.character_id)
        vector = self._embed(text, self.profiles.get(user_id), character.persona) if role == "user" else None
        with self.claim(session_id) if claim is None else contextlib.nullcontext():
            turn = self.store.turns.add(
                session_id=session_id,
                role=role,
                content=text,
                tokens=self.tokens(role, text),
                created_at=at,
                file_ids=[f.id for f in attached],
                vector=vector,
                character_revision=character.revision,
                user_id=session.user_id,
            )
            if role == "user" and vector is None and text:
                self._ask_backfill()
            self.schedule_compaction(session_id, user_id, character=character)
        return turn

    def _embed(self, text: str, profile: UserProfile | None, persona: Persona) -> list[float] | None:
        """The embedding of a user message, stored with its turn (:class:`~memory.tables.TurnVector`):
        it is the recall query's when the turn is the newest user message, and compaction composes
        the turn's archive key from it. The message is embedded without the speakers' names
        (:func:`runtime.context.without_names`; the user's from ``profile``). ``None`` for
        an empty text, and when the embedder is down (:class:`~errors.EmbedderUnavailableError`,
        logged as ``embedder.unavailable``): the turn is stored without it, and a backfill asked for
        once it is (:meth:`_ask_backfill`)."""
        if not text:
            return None
        names = self.gatherer.speaker_names(profile, persona)
        try:
            return self.gatherer.embedder.embed([without_names(text, names)])[0]
        except EmbedderUnavailableError as exc:
            log.warning("embedder.unavailable", at="message", model=exc.model, status=exc.status)
            return None

    def _ask_backfill(self) -> None:
        """Something was stored without its vector: ask the engine's backfill for it."""
        if self.backfill is not None:
            self.backfill.request()

    def edit(
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
        """See :meth:`runtime.turn.Engine.edit_turn`."""
        text = validate_message(message, max_chars=self.settings.max_message_chars)
        if reply is None and self.replier is None:
            raise InvalidMessageError("No reply was given and the engine has no replier.", reason="no_replier")
        session = self.store.sessions.get(session_id)
        if session is None or session.user_id != user_id:
            raise SessionOwnershipError(
                f"Session {session_id!r} is not a session of {user_id!r}; nothing was changed.", session_id=session_id
            )
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        check_claim(claim, session_id)
        profile = self.profiles.get(user_id)
        # the truncation and the new turn run under one claim: no other turn comes between them
        with self.claim(session_id) if claim is None else contextlib.nullcontext(claim) as held:
            character = self._character(held)
            turn = TurnInput(
                user_id=user_id,
                session_id=session_id,
                text=text,
                at=at,
                reply=reply,
                on_delta=on_delta,
                attached=attached,
                vector=self._embed(text, profile, character.persona),  # a failing local model changes nothing
                profile=profile,
                character=character,
            )
            removed = self.store.turns.truncate_from(session_id, seq=seq, expected_last_seq=expected_last_seq)
            log.info("turn.edited", session_id=session_id, seq=seq, turns_removed=removed["turns"])
            try:
                return self._claimed_turn(turn, held)
            finally:
                if self.files is not None and removed["file_ids"]:
                    gone = self.files.delete_unreferenced(removed["file_ids"])
                    log.info("turn.edit_files_cleaned", session_id=session_id, files_deleted=len(gone))

    def claim(self, session_id: str, *, user_id: str | None = None) -> TurnClaim:
        """Claim the session for one turn (with ``user_id``: only if it is that user's).

        Waits up to ``COMPANION_TURN_WAIT_SECONDS`` for a running one to end.

        Raises:
            TurnInProgressError: another turn, edit or greeting of the session is still running.
            SessionClosedError: the session was closed. NotFoundError: no such session.
            SessionOwnershipError: the session is another user's than ``user_id``.
        """
        return TurnClaim(
            self.store,
            session_id,
            lease_seconds=self.settings.lease_seconds,
            wait_seconds=self.settings.wait_seconds,
            user_id=user_id,
        )

    # -- the reply ---------------------------------------------------------------------------
    def _attempt(
        self, turn: TurnInput, known: Mapping[int, list[float]], budgets: Budgets, window: int, *, harder: bool
    ) -> Attempt:
        """One attempt's request: the context within ``budgets`` and ``window`` (tokens), the
        tools the extensions offer a reply to it, and the recent window as read. A ``harder``
        attempt (after an overflow) keeps idle budget out of ``memory``, so it sends less than the
        attempt before it. ``known``: turn id → stored vector at hand."""
        context, turns = self.gatherer.assemble(
            user_id=turn.user_id,
            session_id=turn.session_id,
            budgets=budgets,
            window=window,
            idle_to_memory=not harder,
            known=known,
            profile=turn.profile,
            character=turn.character,
        )
        tools: Tools | None = None
        for extension in self.extensions:
            tools = extension.tools(tools, context, user_id=turn.user_id, session_id=turn.session_id, window=window)
        return Attempt(context=context, tools=tools, window=turns)

    def _ask(self, turn: TurnInput, attempt: Attempt, compaction: CompactionOutcome | None = None) -> ReplyOutcome:
        """The replier's answer to one attempt, with the tool-schema tokens the request carried."""
        assert self.replier is not None
        kwargs: dict[str, Any] = {}
        if turn.on_delta is not None:
            kwargs["on_delta"] = turn.on_delta
        if attempt.tools is not None:
            kwargs["tools"] = attempt.tools
        answer = self.replier.reply(
            attempt.context.messages, session_id=turn.session_id, stable=attempt.context.stable_prefix, **kwargs
        )
        return ReplyOutcome(
            reply=answer,
            context=attempt.context,
            tool_tokens=sum(e.request_tokens(attempt.context) for e in self.extensions),
            compaction=compaction,
            window=attempt.window,
        )

    def _model_reply(self, turn: TurnInput, known: Mapping[int, list[float]]) -> ReplyOutcome:
        """The replier's answer. On a provider overflow: compact harder, then the same attempt
        within smaller budgets and a margin, once (:meth:`_overflow_reply`)."""
        first = self._attempt(turn, known, self.budgets, self.window, harder=False)
        try:
            return self._ask(turn, first)
        except ContextOverflowError as overflow:
            return self._overflow_reply(turn, known, first, overflow)

    def _overflow_reply(
        self, turn: TurnInput, known: Mapping[int, list[float]], first: Attempt, overflow: ContextOverflowError
    ) -> ReplyOutcome:
        """The attempt after a provider overflow: ``recent`` and ``memory`` at
        :data:`OVERFLOW_SHRINK` of their caps, :data:`OVERFLOW_MARGIN` of the window kept free,
        after an inline harder compaction.

        Raises:
            ContextOverflowError: the provider rejected this attempt as too long as well.
        """
        session_id, context = turn.session_id, first.context
        budgets = replace(
            self.budgets,
            recent=max(1, int(self.budgets.recent * OVERFLOW_SHRINK)),
            memory=int(self.budgets.memory * OVERFLOW_SHRINK),
        )
        window = (
            self.window
            - (self.budgets.recent - budgets.recent)
            - (self.budgets.memory - budgets.memory)
            - int(self.window * OVERFLOW_MARGIN)
        )
        log.warning(
            "turn.context_overflow",
            session_id=session_id,
            total_tokens=context.total_tokens,
            window=self.window,
            provider_limit=overflow.provider_limit,
            retry_window=window,
            retry_cap_recent=budgets.recent,
            retry_cap_memory=budgets.memory,
        )
        compaction = self.compact_now(
            self.request(session_id, turn.user_id, recent_cap=budgets.recent, character=turn.character)
        )
        harder = self._attempt(turn, known, budgets, window, harder=True)
        try:
            return self._ask(turn, harder, compaction)
        except ContextOverflowError as second:
            limit = second.provider_limit or overflow.provider_limit
            raise ContextOverflowError(
                f"The model {second.model!r} rejected the context as too long twice for session {session_id!r}: "
                f"{context.total_tokens} tokens (estimated) of a {self.window}-token window, then "
                f"{harder.context.total_tokens} after compacting harder (recent cap {budgets.recent}, memory cap "
                f"{budgets.memory}, window {window})"
                + (f"; the provider's limit is {limit} tokens" if limit else "")
                + ". Set COMPANION_CONTEXT_WINDOW to the model's real window. The history is intact.",
                session_id=session_id,
                model=second.model,
                status=second.status,
                sent_tokens=(context.total_tokens, harder.context.total_tokens),
                window=self.window,
                provider_limit=limit,
            ) from second

    # -- compaction -----------------------------------------------------------------------------
    def tokens(self, role: str, content: str) -> int:
        """Estimated tokens of one stored message, framing included."""
        return self.counter.count_message({"role": role, "content": content})

    def request(
        self,
        session_id: str,
        user_id: str,
        *,
        recent_cap: int | None = None,
        character: SessionCharacter | None = None,
        calibration: float = 1.0,
    ) -> CompactionRequest:
        """This engine's compaction of the session: its ``recent`` cap (or ``recent_cap``), its
        summary cap, both in stored tokens for a session counted at ``calibration``
        (:func:`~runtime.turn._gather.stored_cap`), and the character's id and name (``None``: the
        session's, read)."""
        if character is None:
            session = self.store.sessions.get(session_id)
            character = self.cast.newest(session.character_id) if session is not None else self.cast.default
        return CompactionRequest(
            session_id=session_id,
            user_id=user_id,
            recent_cap=stored_cap(self.budgets.recent, calibration) if recent_cap is None else recent_cap,
            summary_cap=stored_cap(self.budgets.summary, calibration),
            assistant_name=character.persona.name,
            character_id=character.id,
        )

    def schedule_compaction(
        self,
        session_id: str,
        user_id: str,
        *,
        window: Sequence[Turn] | None = None,
        character: SessionCharacter | None = None,
        calibration: float = 1.0,
    ) -> CompactionOutcome | None:
        """Hand the session's compaction to the scheduler: its outcome when it ran inline,
        ``None`` when it was queued or there was nothing to do. ``window``: the session's recent
        window, at hand (the turns in state ``context``, in seq order, at least as many as storage
        holds): whether a compaction is due is decided from it (the compaction reads it again,
        under its lock), with room for a next message (:func:`room_cap`). ``calibration``: the
        session's correction factor, which scales the caps to stored tokens
        (:func:`~runtime.turn._gather.stored_cap`)."""
        due = (
            self.compaction_due
            if window is None
            else lambda request: self.compactor.due_in(window, recent_cap=request.recent_cap)
        )
        request = self.request(session_id, user_id, character=character, calibration=calibration)
        if window is not None:
            request = replace(request, recent_cap=room_cap(window, request.recent_cap))
        return self.scheduler.schedule(request, self.compact_now, due)

    def compaction_due(self, request: CompactionRequest) -> bool:
        """True if compacting ``request``'s session would roll something out now."""
        return self.compactor.due(session_id=request.session_id, recent_cap=request.recent_cap)

    def compact(self, session_id: str, user_id: str, *, recent_cap: int | None = None) -> CompactionOutcome | None:
        """Compact the session now if its recent window is over ``recent_cap`` (default: the
        ``recent`` budget), then learn the user's profile from the new summary."""
        return self.compact_now(self.request(session_id, user_id, recent_cap=recent_cap))

    def compact_now(self, request: CompactionRequest) -> CompactionOutcome | None:
        """Run ``request`` now (:meth:`~runtime.compaction.Compactor.maybe_compact`: under the
        session's advisory lock and the breaker, committed in one transaction), then learn the
        user's profile from the new summary. ``None``: nothing to do, or another compaction of
        the session holds its lock.

        Raises:
            StorageError: the database failed.
        """
        outcome = self.compactor.maybe_compact(
            session_id=request.session_id,
            user_id=request.user_id,
            recent_cap=request.recent_cap,
            summary_cap=request.summary_cap,
            assistant_name=request.assistant_name,
        )
        return self._learn_profile(request, outcome)

    def _learn_profile(self, request: CompactionRequest, outcome: CompactionOutcome | None) -> CompactionOutcome | None:
        """After a compaction that wrote a summary, merge its profile section into what the
        session's character learned of the user (user-set facts are never touched). A separate
        transaction: if it fails the next compaction merges again, as the summary carries
        its profile forward."""
        session_id = request.session_id
        if outcome is not None and outcome.ok and outcome.summarized:
            summary = self.store.compaction.summary(session_id, user_id=request.user_id)
            facts = summary_profile_facts(items_from_json(summary.items, session_id=session_id) if summary else [])
            character_id = request.character_id or self._character_of(session_id)
            if facts and character_id and self.profiles.learn(request.user_id, facts, character_id=character_id):
                log.info("profile.learned", session_id=session_id, facts=len(facts))
        return outcome

    def _character_of(self, session_id: str) -> str | None:
        session = self.store.sessions.get(session_id)
        return session.character_id if session is not None else None
