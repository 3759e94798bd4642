"""The engine: one entry point per turn.

A turn (:meth:`Engine.turn`):

1. validates the message and stores the user turn, before any model or embedding work;
2. compacts the session if the recent window is over its cap;
3. assembles the context within per-source budgets (a read);
4. gets the assistant reply (from the model, or given, as in replay);
5. stores the reply, then compacts again if the reply pushed the window over its cap.

If the reply step raises, the user turn stays stored and the error propagates as
:class:`~errors.ModelCallError`. If the provider says the context is too long,
the turn compacts harder (``recent`` and ``memory`` at half their caps, a 10 % margin
off the window) and asks once more; a second overflow raises
:class:`~errors.ContextOverflowError`. A reply whose stream broke off is
stored as far as it arrived, marked ``interrupted``.

Attachments (issue 9): ``turn(..., attachments=[file_id, ...])`` checks every id belongs
to the user (and, if ephemeral, to the session) before anything is stored, and writes
the ``turn_files`` rows in the user turn's transaction. Assembly renders the blocks from
those rows (:mod:`runtime.context`): the newest user message's files first-turn style,
older ones folded and charged to ``retrieval``. While any block is shown, the model is
offered ``file_read`` (:mod:`runtime.files`). :meth:`Engine.edit_turn` truncates and
resends; :meth:`Engine.delete_file` and :meth:`Engine.delete_session` delete.

Images (issue 10, :mod:`runtime.turn`): the reply model's capability routes the request.
A vision model gets the newest user turn's pixels (and images generated on assistant turns since
the previous user turn); a text-only model gets transcripts, made once per image before the
request and cached by file id, plus an ``image_read`` tool for older images.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Sequence

import structlog

from memory.embeddings import Embedder
from errors import ContextOverflowError, InvalidMessageError, SessionOwnershipError
from memory.knowledge import search_chunks
from memory.profiles import Profiles
from memory.recall import recall_segments
from memory.store import Store
from memory.tables import Turn, TurnState, UserProfile
from persona import Persona, apply_macros
from runtime.accounting import Budgets
from runtime.accounting import CALIBRATION_WINDOW, Baseline, CalibratedCounter, correction, fingerprint
from runtime.compaction import CompactionOutcome, Compactor
from runtime.config import Settings
from runtime.context import AssembledContext, assemble_context
from runtime.files import FileServices
from runtime.context import match_entries, scan_text
from runtime.context import DEFAULT_USER_NAME
from runtime.context import summary_profile_facts
from runtime.context import RetrievalItem, retrieval_items
from runtime.turn._validate import validate_message
from runtime.llm import Replier, Reply
from runtime.compaction import Summarizer, summarizer_for
from runtime.accounting import TokenCounter, counter_for
from runtime.turn._attachments import FileTool, check_attachments, session_attachments, warm
from runtime.llm import Transcriber  # issue 10
from runtime.turn._images import TurnImages  # issue 10

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
    """Compaction attempts during the turn (before assembly and after the reply)."""


class Engine:
    """Runs turns for any number of sessions on one database.

    Build it with :func:`runtime.service.open_engine`, which starts or connects to
    the database and checks the schema and the embedding dimension.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        embedder: Embedder,
        persona: Persona,
        replier: Replier | None = None,
        summarizer: Summarizer | None = None,
        counter: TokenCounter | None = None,
        file_services: FileServices | None = None,
        transcriber: Transcriber | None = None,
    ) -> None:
        """``transcriber`` (issue 10) describes images for a text-only reply model; by default one
        built from the ``COMPANION_VISION_*`` settings. ``file_services`` (:func:`runtime.files.open_file_services`: the file store, the
        parse service, the ``file_read`` reader) enable attachments; without them a turn with
        attachments raises ConfigurationError."""
        self.file_services = file_services
        self.files = file_services.files if file_services is not None else None
        self.parses = file_services.parses if file_services is not None else None
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.persona = persona
        self.replier = replier
        self.counter = counter or counter_for(settings.model)
        self.file_tool = FileTool(
            file_services.reader if file_services is not None else None, settings=settings, counter=self.counter
        )
        # -- images (issue 10): the reply model's capability routes every request --
        self.images = TurnImages(
            settings=settings, store=store, files=self.files, counter=self.counter,
            model=getattr(replier, "model", None) or settings.model, transcriber=transcriber,
        )
        self.budgets: Budgets = settings.scaled_budgets
        self.window: int = settings.window
        self.profiles = Profiles(store.engine)
        """Users' pinned profiles (name, pronouns, facts)."""
        self.compactor = Compactor(
            store=store,
            embedder=embedder,
            summarizer=summarizer or summarizer_for(settings),
            counter=self.counter,
            keep_exchanges=settings.keep_exchanges,
            target=settings.compaction_target,
            breaker_threshold=settings.breaker_threshold,
            breaker_cooldown=settings.breaker_cooldown,
        )

    def derive(self, *, window: int | None = None, persona: Persona | None = None) -> "Engine":
        """A copy of this engine on the same database and models, with budgets scaled to
        ``window`` tokens and/or speaking as ``persona``."""
        settings = replace(self.settings, context_window=window) if window is not None else self.settings
        return Engine(
            settings=settings,
            store=self.store,
            embedder=self.embedder,
            persona=persona or self.persona,
            replier=self.replier,
            summarizer=self.compactor.summarizer,
            counter=self.counter,
            file_services=self.file_services,
            transcriber=self.images.transcriber,
        )

    # -- writing turns --------------------------------------------------------
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
    ) -> TurnResult:
        """Run one turn: store the user message, assemble the context, reply, store the reply.

        Args:
            message: the user's message, ``str`` or UTF-8 ``bytes``.
            at: when the message was said (default: now); the reply gets the same time.
            reply: the assistant's reply, if already known (replay); otherwise the
                engine's replier is asked.
            on_delta: called with each piece of the reply as it streams in; ``None``
                asks for the reply whole. Either way the reply is stored once, complete
                (or, if the stream broke off, as far as it came, marked ``interrupted``).
            attachments: ids of stored files the message carries, in order. Each must be the
                user's (an ephemeral one, of this session); checked before anything is stored.

        Raises:
            InvalidMessageError: the message is invalid; nothing was stored.
            FileNotFound: an attachment id is unknown, another user's, or another session's
                ephemeral id; nothing was stored.
            ConfigurationError: attachments given to an engine without a file store.
            ModelCallError: the reply failed; the user turn stays stored. Its subclass
                says why: ContextOverflowError (twice too long), ModelAuthError,
                ModelRequestError, ModelUnavailableError (after bounded retries).
            StorageError: the database failed.
        """
        text = validate_message(message, max_chars=self.settings.max_message_chars)
        if reply is not None:
            reply = validate_message(reply, max_chars=self.settings.max_message_chars)
        elif self.replier is None:
            raise InvalidMessageError("No reply was given and the engine has no replier.", reason="no_replier")
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        self.store.ensure_session(session_id=session_id, user_id=user_id, persona=self.persona.name)
        user_turn = self.store.add_turn(
            session_id=session_id,
            role="user",
            content=text,
            tokens=self._tokens("user", text),
            created_at=at,
            file_ids=[f.id for f in attached],
        )
        warm(self.parses, attached, settings=self.settings)
        compactions = [c for c in [self._compact(session_id, user_id)] if c is not None]
        if reply is None:  # issue 10: a text-only model gets new images transcribed first (once)
            self.images.before_reply(session_id=session_id)
        context = self.assemble(user_id=user_id, session_id=session_id)
        if reply is not None:
            answer = Reply(content=reply)
        else:
            try:
                answer, context, harder = self._model_reply(user_id, session_id, context, on_delta)
            except Exception as exc:
                log.warning(
                    "turn.reply_failed", session_id=session_id, user_seq=user_turn.seq, error=type(exc).__name__
                )
                raise
            compactions.extend(c for c in [harder] if c is not None)
        content, prompt_tokens, completion_tokens = answer.content, answer.prompt_tokens, answer.completion_tokens
        assistant_turn = self.store.add_turn(
            session_id=session_id,
            role="assistant",
            content=content,
            tokens=self._tokens("assistant", content),
            created_at=at,
            usage_prompt_tokens=prompt_tokens,
            usage_completion_tokens=completion_tokens,
            # the file_read schema rides along whenever it was offered: part of the request the usage is for
            request_estimate_tokens=self.counter.count_messages(context.messages)
            + (self.file_tool.tokens if reply is None and self.file_tool.offered(context) else 0),
            # the fingerprint leaves out the trailing post-history message (see runtime.accounting)
            request_messages=len(context.messages) - context.post_history_messages,
            request_fingerprint=fingerprint(context.messages[: len(context.messages) - context.post_history_messages]),
            interrupted=answer.interrupted,
        )  # only the final text is stored: tool calls and their results (file text) never are
        # a failed compaction is not retried in the same turn; the breaker counts it once
        after = None if any(not c.ok for c in compactions) else self._compact(session_id, user_id)
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
            usage_prompt_tokens=prompt_tokens,
            breaker_state="open" if self.store.compaction_state(session_id).breaker_opened_at else "closed",
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
        self, *, user_id: str, session_id: str, role: str, content: str | bytes, at: datetime | None = None,
        attachments: Sequence[str] = (),
    ) -> Turn:
        """Store one turn without a model call (e.g. a character's opening line).

        ``attachments`` (issue 10): file ids the turn carries, checked as in :meth:`turn`; on an
        assistant turn, images it generated (relayed to vision models with the next user turn).

        Raises:
            InvalidMessageError: an invalid message or a role other than user/assistant.
            FileNotFound, ConfigurationError: a bad attachment id, as in :meth:`turn`; nothing stored.
        """
        if role not in ROLES:
            raise InvalidMessageError(f"Role must be one of {ROLES}, got {role!r}.", reason="bad_role")
        text = validate_message(content, max_chars=self.settings.max_message_chars)
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        self.store.ensure_session(session_id=session_id, user_id=user_id, persona=self.persona.name)
        turn = self.store.add_turn(
            session_id=session_id, role=role, content=text, tokens=self._tokens(role, text), created_at=at,
            file_ids=[f.id for f in attached],
        )
        self._compact(session_id, user_id)
        return turn

    def greet(self, *, user_id: str, session_id: str, at: datetime | None = None) -> Turn | None:
        """Store the persona's first message as the opening assistant turn of a new session.

        ``{{char}}``/``{{user}}`` are replaced (the user's name from the pinned profile,
        else ``User``). Returns the stored turn, or ``None`` when the persona has no first
        message or the session already has turns (nothing is stored then).
        """
        if not self.persona.first_message:
            return None
        existing = self.store.get_session(session_id)
        if existing is not None and self.store.turns(session_id):
            return None
        text = apply_macros(self.persona.first_message, char=self.persona.name, user=self._user_name(user_id))
        turn = self.add_turn(user_id=user_id, session_id=session_id, role="assistant", content=text, at=at)
        log.info("session.greeted", session_id=session_id, seq=turn.seq, tokens=turn.tokens)
        return turn

    def set_profile(
        self, *, user_id: str, name: str | None = None, pronouns: str | None = None, facts: list[str] | None = None
    ) -> UserProfile:
        """Set the user's pinned profile (``None`` leaves a field; ``facts`` replaces the user-set facts).
        See :meth:`memory.profiles.Profiles.set`."""
        return self.profiles.set(user_id, name=name, pronouns=pronouns, facts=facts)

    # -- reading ----------------------------------------------------------------
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
            pending: a user message to answer that is not stored (e.g. an evaluation
                question); by default the newest stored user turn is the query.
            budgets, window: smaller ones than the engine's, for one harder attempt
                (tokens); by default the engine's.
        """
        turns = self.store.turns(session_id, state=TurnState.context)
        files = session_attachments(self.store, user_id=user_id, session_id=session_id, turns=turns, settings=self.settings)
        images = self.images.plan(files)  # issue 10: image blocks merged, pixels planned
        files = images.files
        turns = files.turns
        query = pending if pending is not None else next((t.content for t in reversed(turns) if t.role == "user"), None)
        candidates = []
        vector: list[float] = []
        if query:
            vector = self.embedder.embed([query])[0]
            first_recent = turns[0].seq if turns else None
            candidates = recall_segments(
                self.store.engine,
                user_id=user_id,
                query_embedding=vector,
                query_text=query,
                limit=self.settings.recall_candidates,
                pool=self.settings.recall_pool,
                token_budget=(budgets or self.budgets).memory,
                neighbours=self.settings.recall_neighbours,
                exclude_session_id=session_id if first_recent is not None else None,
                exclude_from_seq=first_recent,
            )
        profile = self.profiles.get(user_id)
        retrieval = self._retrieval(turns, pending, query, vector if query else None, profile)
        usage = self.store.usage_turns(session_id, limit=CALIBRATION_WINDOW)
        calibration = correction([(t.usage_prompt_tokens, t.request_estimate_tokens) for t in usage])
        last = usage[0] if usage else None
        baseline = (
            Baseline(fingerprint=last.request_fingerprint, messages=last.request_messages, prompt_tokens=last.usage_prompt_tokens)
            if last is not None and last.request_fingerprint and last.request_messages and last.usage_prompt_tokens
            else None
        )
        context = assemble_context(
            session_id=session_id,
            persona=self.persona,
            summary=self.store.summary(session_id),
            candidates=candidates,
            turns=turns,
            pending=pending,
            budgets=budgets or self.budgets,
            window=window or self.window,
            counter=CalibratedCounter(self.counter, calibration.factor),
            baseline=baseline,
            calibration=calibration.factor,
            # while files are shown, the file_read schema goes with every request
            overhead=calibration.overhead + (self.file_tool.tokens if self.file_tool.available and
                                              (files.blocks or files.earlier) else 0)
            + images.pixel_tokens + images.tool_tokens,  # issue 10: pixels and image_read reserved
            profile=profile,
            retrieval=retrieval,
            attachments=files.blocks,
            earlier_files=files.earlier,
        )
        return self.images.expand(context, images)  # issue 10: the newest user message's pixels

    def _retrieval(
        self,
        turns: list[Turn],
        pending: str | None,
        query: str | None,
        vector: list[float] | None,
        profile: UserProfile | None,
    ) -> list[RetrievalItem]:
        """Lorebook entries fired by the current message and the turns before it, then the
        persona's nearest knowledge chunks."""
        book = self.persona.character_book
        if not query:  # nothing to match yet (e.g. after the greeting): constant entries only
            return retrieval_items(match_entries(book, ""), [], char=self.persona.name, user=self._name_of(profile))
        if pending is not None:
            previous = [t.content for t in turns]
        else:
            last_user = max((i for i, t in enumerate(turns) if t.role == "user"), default=len(turns))
            previous = [t.content for t in turns[:last_user]]
        depth = book.scan_depth if book is not None and book.scan_depth is not None else self.settings.lorebook_scan_depth
        fired = match_entries(book, scan_text(query, previous, depth))
        hits = (
            search_chunks(self.store.engine, persona=self.persona.name, query_embedding=vector, limit=self.settings.knowledge_chunks)
            if vector is not None and self.settings.knowledge_chunks > 0
            else []
        )
        return retrieval_items(fired, hits, char=self.persona.name, user=self._name_of(profile))

    def _user_name(self, user_id: str) -> str:
        return self._name_of(self.profiles.get(user_id))

    @staticmethod
    def _name_of(profile: UserProfile | None) -> str:
        """What ``{{user}}`` becomes: the pinned name, else ``User``."""
        return profile.name if profile is not None and profile.name else DEFAULT_USER_NAME

    # -- internals ------------------------------------------------------------
    def _model_reply(
        self, user_id: str, session_id: str, context: AssembledContext, on_delta: Callable[[str], None] | None
    ) -> tuple[Reply, AssembledContext, CompactionOutcome | None]:
        """The replier's answer to ``context``. On a provider overflow: compact harder,
        assemble within smaller budgets and a margin, and ask once more.

        Returns the reply, the context it answers, and the harder compaction (if one ran).
        """
        assert self.replier is not None
        kwargs: dict[str, Any] = {"on_delta": on_delta} if on_delta is not None else {}
        tools = self.file_tool.for_reply(context, user_id=user_id, session_id=session_id, window=self.window)
        tools = self.images.tools(tools, context, user_id=user_id, session_id=session_id)  # issue 10
        if tools is not None:
            kwargs["tools"] = tools
        try:
            return self.replier.reply(context.messages, session_id=session_id, **kwargs), context, None
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
        compaction = self._learn_profile(
            user_id,
            session_id,
            self.compactor.maybe_compact(
                session_id=session_id,
                user_id=user_id,
                recent_cap=budgets.recent,
                summary_cap=self.budgets.summary,
                assistant_name=self.persona.name,
            ),
        )
        harder = self.assemble(user_id=user_id, session_id=session_id, budgets=budgets, window=window)
        if "tools" in kwargs:
            kwargs["tools"] = self.images.tools(
                self.file_tool.for_reply(harder, user_id=user_id, session_id=session_id, window=window),
                harder, user_id=user_id, session_id=session_id,
            )
        try:
            return self.replier.reply(harder.messages, session_id=session_id, **kwargs), harder, compaction
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

    # -- attachments (issue 9) ------------------------------------------------------
    def delete_file(self, *, user_id: str, file_id: str) -> bool:
        """Delete a file and every reference to it in every session (its ``turn_files`` rows; the
        blocks are rendered from them, so no assembled context shows a trace). False if the user
        has no such file."""
        if self.files is None:
            return False
        deleted = bool(self.files.delete(file_id, user_id=user_id))
        log.info("file.deleted", file_id=file_id, deleted=deleted)
        return deleted

    def delete_session(self, *, user_id: str, session_id: str) -> dict[str, int]:
        """Delete a session and everything of it, and the files no other session references
        (:meth:`memory.store.Store.delete_session`). Returns counts by kind.

        Raises:
            SessionOwnershipError: the session belongs to another user (nothing deleted).
        """
        session = self.store.get_session(session_id)
        if session is not None and session.user_id != user_id:
            raise SessionOwnershipError(
                f"Session {session_id!r} belongs to another user, not {user_id!r}; nothing was deleted.",
                session_id=session_id,
            )
        counts = self.store.delete_session(session_id, files=self.files)
        log.info("session.deleted", session_id=session_id, **counts)
        return counts

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
    ) -> TurnResult:
        """Edit the user turn ``seq`` and resend it: the turns from ``seq`` on are deleted, then
        the edited message runs as a new turn with ``attachments`` (the full first-turn path).

        Files of earlier turns are kept. The replaced turns' files are deleted only after the
        truncation has happened, and only those nothing references any more (the new turn
        may carry one again).

        Raises:
            InvalidMessageError: a bad message (``reason`` as in :meth:`turn`), or ``bad_edit``: no such
                user turn, or it has left the recent window. Nothing was changed.
            FileNotFound, SessionOwnershipError: as in :meth:`turn`; nothing was changed.
            ModelCallError: as in :meth:`turn`; the edited user turn stays stored.
        """
        text = validate_message(message, max_chars=self.settings.max_message_chars)
        if reply is None and self.replier is None:
            raise InvalidMessageError("No reply was given and the engine has no replier.", reason="no_replier")
        session = self.store.get_session(session_id)
        if session is None or session.user_id != user_id:
            raise SessionOwnershipError(
                f"Session {session_id!r} is not a session of {user_id!r}; nothing was changed.", session_id=session_id
            )
        attached = check_attachments(self.files, user_id=user_id, session_id=session_id, attachments=attachments)
        removed = self.store.truncate_from(session_id, seq=seq)
        log.info("turn.edited", session_id=session_id, seq=seq, turns_removed=removed["turns"])
        try:
            return self.turn(
                user_id=user_id, session_id=session_id, message=text, at=at, reply=reply, on_delta=on_delta,
                attachments=[f.id for f in attached],
            )
        finally:
            if self.files is not None and removed["file_ids"]:
                gone = self.files.delete_unreferenced(removed["file_ids"])
                log.info("turn.edit_files_cleaned", session_id=session_id, files_deleted=len(gone))

    def _tokens(self, role: str, content: str) -> int:
        return self.counter.count_message({"role": role, "content": content})

    def _compact(self, session_id: str, user_id: str) -> CompactionOutcome | None:
        outcome = self.compactor.maybe_compact(
            session_id=session_id,
            user_id=user_id,
            recent_cap=self.budgets.recent,
            summary_cap=self.budgets.summary,
            assistant_name=self.persona.name,
        )
        return self._learn_profile(user_id, session_id, outcome)

    def _learn_profile(self, user_id: str, session_id: str, outcome: CompactionOutcome | None) -> CompactionOutcome | None:
        """After a compaction that wrote a summary, merge its profile section into the user's
        pinned profile (learned facts only; user-set facts are never touched). A separate
        transaction: if it fails the next compaction merges again, as the summary carries
        its profile forward."""
        if outcome is not None and outcome.ok and outcome.summarized:
            summary = self.store.summary(session_id)
            facts = summary_profile_facts(summary.items if summary else [])
            if facts and self.profiles.learn(user_id, facts) is not None:
                log.info("profile.learned", session_id=session_id, facts=len(facts))
        return outcome
