"""The engine: one entry point per turn.

A turn (:meth:`Engine.turn`):

1. validates the message and stores the user turn, before any model or embedding work;
2. compacts the session if the recent window is over its cap;
3. assembles the context within per-source budgets (a read);
4. gets the assistant reply (from the model, or given, as in replay);
5. stores the reply, then compacts again if the reply pushed the window over its cap.

If the reply step raises, the user turn stays stored and the error propagates as
:class:`~memory.errors.ModelCallError`. If the provider says the context is too long,
the turn compacts harder (``recent`` and ``memory`` at half their caps, a 10 % margin
off the window) and asks once more; a second overflow raises
:class:`~memory.errors.ContextOverflowError`. A reply whose stream broke off is
stored as far as it arrived, marked ``interrupted``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Callable

import structlog

from memory.embeddings import Embedder
from memory.errors import ContextOverflowError, InvalidMessageError
from memory.knowledge import search_chunks
from memory.profiles import Profiles
from memory.recall import recall_segments
from memory.store import Store
from memory.tables import Turn, TurnState, UserProfile
from persona import Persona, apply_macros
from runtime.budgets import Budgets
from runtime.calibration import CALIBRATION_WINDOW, Baseline, CalibratedCounter, correction, fingerprint
from runtime.compaction import CompactionOutcome, Compactor
from runtime.config import Settings
from runtime.context import AssembledContext, assemble_context
from runtime.lorebook import match_entries, scan_text
from runtime.persona_render import DEFAULT_USER_NAME
from runtime.profile import summary_profile_facts
from runtime.retrieval import RetrievalItem, retrieval_items
from runtime.messages import validate_message
from runtime.model import Replier, Reply
from runtime.summarizer import Summarizer, summarizer_for
from runtime.tokens import TokenCounter, counter_for

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

    Build it with :func:`runtime.bootstrap.open_engine`, which starts or connects to
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
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.persona = persona
        self.replier = replier
        self.counter = counter or counter_for(settings.model)
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

        Raises:
            InvalidMessageError: the message is invalid; nothing was stored.
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
        self.store.ensure_session(session_id=session_id, user_id=user_id, persona=self.persona.name)
        user_turn = self.store.add_turn(
            session_id=session_id, role="user", content=text, tokens=self._tokens("user", text), created_at=at
        )
        compactions = [c for c in [self._compact(session_id, user_id)] if c is not None]
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
            request_estimate_tokens=self.counter.count_messages(context.messages),
            request_messages=len(context.messages) - context.post_history_messages,
            request_fingerprint=fingerprint(context.messages[: len(context.messages) - context.post_history_messages]),
            interrupted=answer.interrupted,
        )
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
        self, *, user_id: str, session_id: str, role: str, content: str | bytes, at: datetime | None = None
    ) -> Turn:
        """Store one turn without a model call (e.g. a character's opening line).

        Raises:
            InvalidMessageError: an invalid message or a role other than user/assistant.
        """
        if role not in ROLES:
            raise InvalidMessageError(f"Role must be one of {ROLES}, got {role!r}.", reason="bad_role")
        text = validate_message(content, max_chars=self.settings.max_message_chars)
        self.store.ensure_session(session_id=session_id, user_id=user_id, persona=self.persona.name)
        turn = self.store.add_turn(
            session_id=session_id, role=role, content=text, tokens=self._tokens(role, text), created_at=at
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
        return assemble_context(
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
            overhead=calibration.overhead,
            profile=profile,
            retrieval=retrieval,
        )

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
        kwargs = {"on_delta": on_delta} if on_delta is not None else {}
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
