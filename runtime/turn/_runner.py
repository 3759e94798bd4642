"""Turn running: store the user turn, assemble, reply, store the reply, then compaction.

Longer than 400 lines on purpose: the claim, the turn, the edit and the overflow retry are one
state machine over the session; the reply attempts must go through the same path.

One turn (:meth:`TurnRunner.run`):

1. validates the message and its attachment ids, embeds the message once, then stores the
   user turn with its vector (:class:`~memory.tables.TurnVector`, the recall query's) in one
   ``INSERT``: an embedder failure stores nothing;
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
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog

from errors import (
    ContextOverflowError,
    InvalidMessageError,
    InvalidRequestError,
    NotFoundError,
    SessionOwnershipError,
    TurnInProgressError,
)
from memory.files import FileStore, StoredFile
from memory.profiles import Profiles
from memory.store import ClaimedSession, RequestRecord, Store
from memory.tables import Turn, UserProfile
from memory.validation import check_id
from runtime.accounting import Budgets, TokenCounter, fingerprint
from runtime.compaction import CompactionOutcome, Compactor
from runtime.config import Settings
from runtime.context import AssembledContext, summary_profile_facts, without_names
from runtime.llm import Replier, Reply, Tools
from runtime.summary_items import items_from_json
from runtime.turn._attachments import check_attachments
from runtime.turn._compaction import CompactionRequest, CompactionScheduler, InlineCompaction
from runtime.turn._extensions import TurnExtension
from runtime.turn._gather import ContextGatherer
from runtime.turn._validate import validate_message

log = structlog.get_logger("companion.engine")

ROLES = ("user", "assistant")

OVERFLOW_SHRINK = 0.5
"""After a provider overflow, ``recent`` and ``memory`` get this share of their caps for the one retry."""
OVERFLOW_MARGIN = 0.1
"""...and this share of the window is kept free besides, against a provider that counts more than we do."""


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """What one turn stored and sent."""

    session_id: str
    user_turn: Turn
    assistant_turn: Turn
    context: AssembledContext
    """The context the reply was made from."""
    compactions: list[CompactionOutcome]
    """Compaction attempts the turn ran itself: an overflow retry's, and the one after the reply
    when the scheduler runs it inline (a queued one is not here)."""


CLAIM_POLL_SECONDS = (0.02, 0.25)
"""While a turn waits for its session: first and longest pause between two tries, seconds (doubling)."""


@dataclass(frozen=True, kw_only=True)
class _Read:
    """What a turn read and embedded before storing its message, for assembling to reuse."""

    vector: list[float] | None
    """The message's embedding (:meth:`TurnRunner._embed`)."""
    profile: UserProfile | None
    """The user's profile (``None``: they have none)."""


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
        self.store.sessions.release(self.session_id, owner=self.owner)

    def __enter__(self) -> TurnClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _check_claim(claim: TurnClaim | None, session_id: str) -> None:
    """A caller's claim must be on the session the work is for.

    Raises:
        InvalidRequestError: it is a claim on another session; nothing was stored.
    """
    if claim is not None and claim.session_id != session_id:
        raise InvalidRequestError(
            f"The claim given is on session {claim.session_id!r}, not {session_id!r}; nothing was stored.",
            field="claim",
        )


class TurnRunner:
    """Writes turns for one engine: the turn loop, stored turns, edits, and compaction after them."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        files: FileStore | None,
        gatherer: ContextGatherer,
        compactor: Compactor,
        profiles: Profiles,
        counter: TokenCounter,
        replier: Replier | None,
        persona_name: str,
        extensions: Sequence[TurnExtension],
        scheduler: CompactionScheduler | None = None,
    ) -> None:
        self.settings = settings
        self.scheduler: CompactionScheduler = scheduler or InlineCompaction()
        self.store = store
        self.files = files
        self.gatherer = gatherer
        self.compactor = compactor
        self.profiles = profiles
        self.counter = counter
        self.replier = replier
        self.persona_name = persona_name
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
    ) -> TurnResult:
        """See :meth:`runtime.turn.Engine.turn`."""
        text = validate_message(message, max_chars=self.settings.max_message_chars)
        if reply is not None:
            reply = validate_message(reply, max_chars=self.settings.max_message_chars)
        elif self.replier is None:
            raise InvalidMessageError("No reply was given and the engine has no replier.", reason="no_replier")
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        _check_claim(claim, session_id)
        profile = self.profiles.get(user_id)
        vector = self._embed(text, profile)  # before the claim and before anything is stored
        read = _Read(vector=vector, profile=profile)
        if claim is None:
            with self._claim_for(user_id, session_id) as own:
                return self._claimed_turn(user_id, session_id, text, at, reply, on_delta, attached, read, own)
        if claim.session.user_id != user_id:  # a claim proves the session exists, not whose it is
            self.store.sessions.ensure(session_id=session_id, user_id=user_id, persona=self.persona_name)
        return self._claimed_turn(user_id, session_id, text, at, reply, on_delta, attached, read, claim)

    def _claim_for(self, user_id: str, session_id: str) -> TurnClaim:
        """A turn's claim on ``user_id``'s session, the session created first if it is new
        (:meth:`memory.sessions.Sessions.ensure`); for a session that exists, the claim's
        ``UPDATE`` is the only statement.

        Raises:
            InvalidFieldError: a bad id (as :meth:`~memory.sessions.Sessions.ensure` says).
            SessionOwnershipError, SessionClosedError, TurnInProgressError: as the claim says.
        """
        check_id(session_id, field="session_id")
        check_id(user_id, field="user_id")
        try:
            return self.claim(session_id, user_id=user_id)
        except NotFoundError:
            self.store.sessions.ensure(session_id=session_id, user_id=user_id, persona=self.persona_name)
            return self.claim(session_id, user_id=user_id)

    def _claimed_turn(
        self,
        user_id: str,
        session_id: str,
        text: str,
        at: datetime | None,
        reply: str | None,
        on_delta: Callable[[str], None] | None,
        attached: Sequence[StoredFile],
        read: _Read,
        claim: TurnClaim,
    ) -> TurnResult:
        """The turn, once its session is claimed (``claim``): from storing the user turn on.
        ``read.vector``: the message's embedding (:meth:`_embed`), its recall query's: stored with
        the turn (compaction composes the turn's archive key from it) and handed to assembling,
        which neither embeds nor reads it; ``read.profile`` too, which it need not read again."""
        vector = read.vector
        user_turn = self.store.turns.add(
            session_id=session_id,
            role="user",
            content=text,
            tokens=self.tokens("user", text),
            created_at=at,
            file_ids=[f.id for f in attached],
            vector=vector,
        )
        for extension in self.extensions:
            extension.stored(attached)
        known = {user_turn.id: vector} if vector is not None and user_turn.id is not None else {}
        compactions: list[CompactionOutcome] = []
        if reply is None:
            for extension in self.extensions:
                extension.prepare(session_id=session_id)
        if reply is not None:
            context, window = self.gatherer.assemble(
                user_id=user_id, session_id=session_id, known=known, profile=read.profile
            )
            answer, extra_tokens = Reply(content=reply), 0
        else:
            try:
                answer, context, extra_tokens, harder, window = self._model_reply(
                    user_id, session_id, on_delta, known, read.profile
                )
            except Exception as exc:
                log.warning(
                    "turn.reply_failed", session_id=session_id, user_seq=user_turn.seq, error=type(exc).__name__
                )
                raise
            compactions.extend(c for c in [harder] if c is not None)
        sent = len(context.messages) - context.post_history_messages
        assistant_turn = self.store.turns.add(
            session_id=session_id,
            role="assistant",
            content=answer.content,
            tokens=self.tokens("assistant", answer.content),
            created_at=at,
            request=RequestRecord(
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=answer.completion_tokens,
                # tool schemas ride along whenever offered: part of the request the usage is for
                estimate_tokens=self.counter.count_messages(context.messages) + extra_tokens,
                # the fingerprint leaves out the trailing post-history message (see runtime.accounting)
                messages=sent,
                fingerprint=fingerprint(context.messages[:sent]),
            ),
            interrupted=answer.interrupted,
        )  # only the final text is stored: tool calls and their results (file text) never are
        # a failed compaction is not retried in the same turn; the breaker counts it once
        # the window the context was assembled from, with the reply: no other turn of the session
        # ran since (the claim), and a compaction elsewhere only shrinks it
        after = (
            None
            if any(not c.ok for c in compactions)
            else self.schedule_compaction(session_id, user_id, window=[*window, assistant_turn])
        )
        if after is not None:
            compactions.append(after)
        log.info(
            "turn.completed",
            session_id=session_id,
            user_seq=user_turn.seq,
            total_tokens=context.total_tokens,
            window=context.window,
            reply_reserve=context.reply_reserve,
            **{f"tokens_{s}": r.tokens for s, r in context.sources.items()},
            **{f"cap_{s}": r.cap for s, r in context.sources.items()},
            cut={s: r.cut for s, r in context.sources.items() if r.cut},
            calibration=round(context.calibration, 4),
            overhead_tokens=context.overhead_tokens,
            baseline_tokens=context.baseline_tokens,
            usage_prompt_tokens=answer.prompt_tokens,
            # after this turn's compaction, else as the claim found it
            breaker_state="open"
            if (compactions[-1].breaker_open if compactions else claim.session.breaker_open)
            else "closed",
            compactions=len(compactions),
        )
        return TurnResult(
            session_id=session_id,
            user_turn=user_turn,
            assistant_turn=assistant_turn,
            context=context,
            compactions=compactions,
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
        _check_claim(claim, session_id)
        vector = self._embed(text, self.profiles.get(user_id)) if role == "user" else None
        self.store.sessions.ensure(session_id=session_id, user_id=user_id, persona=self.persona_name)
        with self.claim(session_id) if claim is None else contextlib.nullcontext():
            turn = self.store.turns.add(
                session_id=session_id,
                role=role,
                content=text,
                tokens=self.tokens(role, text),
                created_at=at,
                file_ids=[f.id for f in attached],
                vector=vector,
            )
            self.schedule_compaction(session_id, user_id)
        return turn

    def _embed(self, text: str, profile: UserProfile | None) -> list[float] | None:
        """The embedding of a user message, stored with its turn (:class:`~memory.tables.TurnVector`):
        it is the recall query's when the turn is the newest user message, and compaction composes
        the turn's archive key from it. The message is embedded without the speakers' names
        (:func:`memory.recall.without_names`; the user's from ``profile``). ``None`` for
        an empty text. Embedded before the turn is stored, so an embedder failure stores nothing."""
        names = self.gatherer.speaker_names(profile)
        return self.gatherer.embedder.embed([without_names(text, names)])[0] if text else None

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
        _check_claim(claim, session_id)
        profile = self.profiles.get(user_id)
        vector = self._embed(text, profile)  # an embedder failure changes nothing
        # the truncation and the new turn run under one claim: no other turn comes between them
        with self.claim(session_id) if claim is None else contextlib.nullcontext(claim) as held:
            removed = self.store.turns.truncate_from(session_id, seq=seq)
            log.info("turn.edited", session_id=session_id, seq=seq, turns_removed=removed["turns"])
            try:
                read = _Read(vector=vector, profile=profile)
                return self._claimed_turn(user_id, session_id, text, at, reply, on_delta, attached, read, held)
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
            lease_seconds=self.settings.turn_lease_seconds,
            wait_seconds=self.settings.turn_wait_seconds,
            user_id=user_id,
        )

    # -- the reply ---------------------------------------------------------------------------
    def _prepare(
        self,
        user_id: str,
        session_id: str,
        budgets: Budgets,
        window: int,
        known: Mapping[int, list[float]],
        profile: UserProfile | None,
        *,
        harder: bool = False,
    ) -> tuple[AssembledContext, Tools | None, list[Turn]]:
        """One attempt's request: the context within ``budgets`` and ``window`` (tokens), the
        tools the extensions offer a reply to it, and the recent window's turns as read. A
        ``harder`` attempt (after an overflow) keeps idle budget out of ``memory``, so it sends
        less than the attempt before it. ``known``: turn id → stored vector at hand;
        ``profile``: the user's profile as the turn read it (:meth:`ContextGatherer.assemble`)."""
        context, turns = self.gatherer.assemble(
            user_id=user_id,
            session_id=session_id,
            budgets=budgets,
            window=window,
            idle_to_memory=not harder,
            known=known,
            profile=profile,
        )
        tools: Tools | None = None
        for extension in self.extensions:
            tools = extension.tools(tools, context, user_id=user_id, session_id=session_id, window=window)
        return context, tools, turns

    def _ask(
        self, session_id: str, context: AssembledContext, tools: Tools | None, on_delta: Callable[[str], None] | None
    ) -> tuple[Reply, AssembledContext, int]:
        """The replier's answer to one attempt, with the tool-schema tokens the request carried."""
        assert self.replier is not None
        kwargs: dict[str, Any] = {}
        if on_delta is not None:
            kwargs["on_delta"] = on_delta
        if tools is not None:
            kwargs["tools"] = tools
        answer = self.replier.reply(context.messages, session_id=session_id, **kwargs)
        return answer, context, sum(e.request_tokens(context) for e in self.extensions)

    def _model_reply(
        self,
        user_id: str,
        session_id: str,
        on_delta: Callable[[str], None] | None,
        known: Mapping[int, list[float]],
        profile: UserProfile | None,
    ) -> tuple[Reply, AssembledContext, int, CompactionOutcome | None, list[Turn]]:
        """The replier's answer. On a provider overflow: compact harder, then the same attempt
        within smaller budgets and a margin, once. ``known`` and ``profile`` as in :meth:`_prepare`.

        Returns the reply, the context it answers, the tool-schema tokens sent, the harder
        compaction (if one ran), and the recent window that context was assembled from.
        """
        context, tools, turns = self._prepare(user_id, session_id, self.budgets, self.window, known, profile)
        try:
            return (*self._ask(session_id, context, tools, on_delta), None, turns)
        except ContextOverflowError as first:
            overflow = first
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
        compaction = self.compact(session_id, user_id, recent_cap=budgets.recent)
        harder, tools, turns = self._prepare(user_id, session_id, budgets, window, known, profile, harder=True)
        try:
            return (*self._ask(session_id, harder, tools, on_delta), compaction, turns)
        except ContextOverflowError as second:
            limit = second.provider_limit or overflow.provider_limit
            raise ContextOverflowError(
                f"The model {second.model!r} rejected the context as too long twice for session {session_id!r}: "
                f"{context.total_tokens} tokens (estimated) of a {self.window}-token window, then "
                f"{harder.total_tokens} after compacting harder (recent cap {budgets.recent}, memory cap "
                f"{budgets.memory}, window {window})"
                + (f"; the provider's limit is {limit} tokens" if limit else "")
                + ". Set COMPANION_CONTEXT_WINDOW to the model's real window. The history is intact.",
                session_id=session_id,
                model=second.model,
                status=second.status,
                sent_tokens=(context.total_tokens, harder.total_tokens),
                window=self.window,
                provider_limit=limit,
            ) from second

    # -- compaction -----------------------------------------------------------------------------
    def tokens(self, role: str, content: str) -> int:
        """Estimated tokens of one stored message, framing included."""
        return self.counter.count_message({"role": role, "content": content})

    def request(self, session_id: str, user_id: str, *, recent_cap: int | None = None) -> CompactionRequest:
        """This engine's compaction of the session: its ``recent`` cap (or ``recent_cap``), its
        summary cap and its persona's name."""
        return CompactionRequest(
            session_id=session_id,
            user_id=user_id,
            recent_cap=self.budgets.recent if recent_cap is None else recent_cap,
            summary_cap=self.budgets.summary,
            assistant_name=self.persona_name,
        )

    def schedule_compaction(
        self, session_id: str, user_id: str, *, window: Sequence[Turn] | None = None
    ) -> CompactionOutcome | None:
        """Hand the session's compaction to the scheduler: its outcome when it ran inline,
        ``None`` when it was queued or there was nothing to do.

        ``window``: the session's recent window, already at hand (the turns in state
        ``context``, in seq order, at least as many as storage holds): whether a compaction is
        due is decided from it instead of reading it again. The compaction itself reads the
        window again, under its lock."""
        due = (
            self.compaction_due
            if window is None
            else lambda request: self.compactor.due_in(window, recent_cap=request.recent_cap)
        )
        return self.scheduler.schedule(self.request(session_id, user_id), self.compact_now, due)

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
        return self._learn_profile(request.user_id, request.session_id, outcome)

    def _learn_profile(
        self, user_id: str, session_id: str, outcome: CompactionOutcome | None
    ) -> CompactionOutcome | None:
        """After a compaction that wrote a summary, merge its profile section into the user's
        pinned profile (learned facts only; user-set facts are never touched). A separate
        transaction: if it fails the next compaction merges again, as the summary carries
        its profile forward."""
        if outcome is not None and outcome.ok and outcome.summarized:
            summary = self.store.compaction.summary(session_id)
            facts = summary_profile_facts(items_from_json(summary.items, session_id=session_id) if summary else [])
            if facts and self.profiles.learn(user_id, facts) is not None:
                log.info("profile.learned", session_id=session_id, facts=len(facts))
        return outcome
